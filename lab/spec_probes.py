"""The `probes:` block of a lab spec and the probe expectations that read it: every probe's settings known and of
their type, and every run a probe or a probe expectation names measured, checked before any training (a value
the engine reads after every training, `threshold: abc`, fails at load)."""

from __future__ import annotations

from typing import Any

from .expect import PROBE_SOURCE, Expectation, suggest

PROBES = ("attention_reliance", "lengths", "flash_equality", "mask_leak", "memory", "decode_speed", "attention_logits",
          "attention", "residual_update", "train_speed")
# The settings of each probe (`lengths` is a bare list): what the engine reads, checked before any training.
RUN, RUNS, COUNT, COUNTS, NUMBER = "a variant name", "a list of variant names", "a positive integer", \
    "a non-empty list of positive integers", "a number"
PROBE_SETTINGS = {
    "attention_reliance": {"run": RUN, "threshold": NUMBER},
    "flash_equality": {"runs": RUNS},
    "mask_leak": {"runs": RUNS},
    "memory": {"run": RUN, "seq_lens": COUNTS},
    "decode_speed": {"runs": RUNS, "batch_sizes": COUNTS, "context": COUNT, "new_tokens": COUNT},
    "attention_logits": {"runs": RUNS},
    "attention": {"runs": RUNS},  # default: every variant
    "residual_update": {"runs": RUNS},  # default: every variant
    "train_speed": {"run": RUN, "seq_lens": COUNTS},  # on a GPU only (probes.train_speed)
}
PER_VARIANT = ("attention", "residual_update")  # probes that measure every variant unless `runs` says otherwise


def _numbers(value: Any, key: str, problems: list[str]) -> list:
    ok = isinstance(value, list) and value and all(isinstance(v, int) and not isinstance(v, bool) and v > 0
                                                    for v in value)
    if not ok:
        problems.append(f"{key}: expected a non-empty list of positive integers, got {value!r}")
        return []
    return list(value)


def check_probes(probes: dict[str, Any], names: set[str], problems: list[str]) -> None:
    """Each probe's settings, and the runs it names among the spec's variants and derived runs."""
    for key, probe in probes.items():
        if key == "lengths":
            if any(f < 2 for f in _numbers(probe, "probes.lengths", problems)):
                problems.append(f"probes.lengths: got {probe!r}, expected factors of 2 or more (x the training length)")
            continue
        if probe is not None and not isinstance(probe, dict):
            problems.append(f"probes.{key}: expected a mapping of settings, got {probe!r}")
            continue
        if not _probe_settings(key, probe or {}, problems):
            continue
        runs = [(probe or {}).get("run")] + list((probe or {}).get("runs") or [])
        for run in runs:
            if run is not None and run not in names:
                problems.append(f"probes.{key}: run {run!r} is none of {', '.join(sorted(names))}")


def probed_runs(probes: dict[str, Any], variants, reference: str, key: str) -> list[str]:
    """The runs probe `key` measures: its `run` / `runs`, else every variant (PER_VARIANT probes, made for
    comparing runs) or the reference."""
    settings = probes.get(key) or {}
    if "run" in settings:
        return [settings["run"]]
    return list(settings.get("runs") or (variants if key in PER_VARIANT else [reference]))


def check_probed(probes: dict[str, Any], variants, reference: str, exp: Expectation, key: str,
                 problems: list[str]) -> None:
    """A probe expectation names a probe the spec runs, on the runs it compares (else it could only ever
    read "no scores to compare", after all the training)."""
    source = PROBE_SOURCE[exp.probe]
    if source not in probes:
        problems.append(f"{key}.probe: {exp.probe} is measured by probes.{source}, which the spec does not run")
        return
    if source in ("memory", "train_speed"):  # one figure of the run's architecture, not a value per run
        return
    probed = probed_runs(probes, variants, reference, source)
    for run in (exp.run, exp.versus):
        if run is not None and run not in probed:
            problems.append(f"{key}: probes.{source} does not measure {run!r} (it measures {', '.join(probed)})")


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


SETTING_CHECKS = {
    RUN: lambda v: isinstance(v, str),
    RUNS: lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v),
    COUNT: _is_count,
    COUNTS: lambda v: isinstance(v, list) and bool(v) and all(_is_count(x) for x in v),
    NUMBER: lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
}


def _probe_settings(key: str, probe: dict, problems: list[str]) -> bool:
    """Whether every setting of probe `key` is known and of its type (each problem added), so that a value
    the engine reads after every training (`threshold: abc`) fails now."""
    allowed = PROBE_SETTINGS[key]
    found = len(problems)
    for name, value in probe.items():
        if name not in allowed:
            problems.append(f"probes.{key}.{name}: unknown setting{suggest(name, allowed)} "
                            f"(expected {', '.join(allowed)})")
        elif not SETTING_CHECKS[allowed[name]](value):
            problems.append(f"probes.{key}.{name}: got {value!r}, expected {allowed[name]}")
    return len(problems) == found


