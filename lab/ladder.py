"""A `--steps` ladder: the same lab at several step counts, its verdicts side by side.

Some claims are about where training ends up, not where it is after a few hundred steps: the literature
measures them at convergence (warmup and post-norm, optimizers, positions), and a verdict at 300 steps
may be a verdict about the speed of the first phase. `tfkit lab run CLAIM --steps 150 --steps 300 --steps
600` runs the whole lab once per step count, each in its own folder (`steps-N/`, an ordinary lab folder that
`lab report` and `lab run --out` read like any other), then writes the ladder's own results.md: the scale
of each rung (tokens seen, tokens per parameter, epochs) and every verdict at every rung, so a reader sees
whether a verdict holds, grows or turns as training goes on.

Each rung trains from scratch: a schedule decays over its own `train.max_steps`, so a 150-step run is not the
first half of a 300-step one, and reusing its checkpoints would compare an undecayed model with a decayed
one. The rungs share nothing but the claim, the seeds and the options, so each costs what a lab costs."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from ..errors import ConfigError
from ..files import write_atomic
from ..jsonfile import read_json
from .engine import claim_folder, default_folder, prepare, run
from .plan import LabOptions
from .report import MARKDOWN, RESULTS, report_folder, write_report
from .scale import short_count
from .spec import LabSpec, load_spec

LADDER_FILE = "ladder.json"


def rung(folder: Path, steps: int) -> Path:
    return folder / f"steps-{steps}"


def check_steps(steps: list[int]) -> list[int]:
    """Two or more distinct positive step counts, in increasing order."""
    if any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in steps) or len(set(steps)) != len(steps):
        raise ConfigError(f"steps: got {steps}, expected distinct positive step counts", params=("steps",))
    return sorted(steps)


def run_ladder(spec: LabSpec, options: LabOptions, steps: list[int], out: Path | None = None) -> tuple[Path, dict]:
    """Every rung's lab (checked before the first trains), then the ladder report; (folder, its results)."""
    steps = check_steps(steps)
    folder = Path(out) if out else default_folder(spec.claim)
    record = {"claim": spec.claim, "steps": steps, "options": dataclasses.replace(options, steps=None).to_dict()}
    claim_folder(folder, spec, record, LADDER_FILE)
    labs = [prepare(spec, dataclasses.replace(options, steps=n), rung(folder, n)) for n in steps]
    rungs = {str(n): write_report(lab.folder, run(lab), spec) for n, lab in zip(steps, labs)}
    return folder, write_ladder(folder, spec.claim, rungs)


def write_ladder(folder: Path, claim: str, rungs: dict[str, dict]) -> dict:
    """The ladder's results.json (each rung's verdicts and scale) and results.md."""
    results = {"claim": claim, "steps": [int(n) for n in rungs],
               "rungs": {n: {k: r.get(k) for k in ("verdicts", "scale", "summary", "reference", "evals", "seeds",
                                                   "metric", "title", "source", "options")} for n, r in rungs.items()}}
    write_atomic(folder / RESULTS, json.dumps(results, indent=2) + "\n")
    write_atomic(folder / MARKDOWN, render_ladder(results))
    return results


def report_ladder(folder: Path) -> dict:
    """Rebuild every rung's report and the ladder's from their results.json (`tfkit lab report DIR`)."""
    record = read_json(folder / LADDER_FILE, ConfigError)
    steps = record.get("steps")
    if not isinstance(steps, list) or not steps:
        raise ConfigError(f"{folder / LADDER_FILE}: damaged, expected the step counts of a ladder")
    rungs = {str(n): report_folder(rung(folder, n)) for n in steps}
    load_spec(str(folder / "spec.yaml"))  # the copy is still a valid spec
    return write_ladder(folder, record.get("claim", ""), rungs)


def _cell(v: dict) -> str:
    """One verdict at one rung: its word (or why there is none) and Δ with its interval."""
    if v["status"] == "missing":
        return "-"
    word = v["status"]
    if v.get("lo") is not None:
        return f"{word}: Δ {v['mean']:+.3g} [{v['lo']:+.3g}, {v['hi']:+.3g}]"
    if v.get("mean") is None:  # trains/fails: read from the gates, no difference
        return word
    return f"{word}: {v['mean']:.3g}" if v.get("probe") else f"{word}: Δ {v['mean']:+.3g}"


def render_ladder(results: dict) -> str:
    rungs = results["rungs"]
    steps = list(rungs)
    first = rungs[steps[0]]
    ref, label = first["reference"], next(iter(first["evals"]))
    lines = [f"# tfkit lab ladder: {results['claim']}", ""]
    if first.get("title"):
        lines += [first["title"] + (f" ({first['source']})" if first.get("source") else ""), ""]
    lines += [f"The same lab at {', '.join(steps)} steps (every run from scratch, its schedule over its own steps; "
              f"{len(first['seeds'])} paired seed(s)); each rung's full report is in steps-N/results.md. "
              "Verdicts are read at each rung by the rule stated there.", "",
              f"| steps | tokens seen ({ref}) | parameters | tokens / parameter | epochs |",
              "| --- | --- | --- | --- | --- |"]
    for n in steps:
        s = (rungs[n].get("scale") or {}).get(ref) or {}
        tokens, params, train = s.get("tokens"), s.get("params"), s.get("train_tokens")
        lines.append(f"| {n} | {short_count(tokens) if tokens else '-'} | {short_count(params) if params else '-'} | "
                     f"{f'{tokens / params:.3g}' if tokens and params else '-'} | "
                     f"{f'{tokens / train:.3g}' if tokens and train else '-'} |")
    names = list(first["summary"])
    lines += ["", f"{first['metric']} on {label}, mean over seeds:", "",
              "| variant | " + " | ".join(f"{n} steps" for n in steps) + " |", "|" + " --- |" * (len(steps) + 1)]
    for name in names:
        cells = [rungs[n]["summary"].get(name, {}).get(label) for n in steps]
        lines.append(f"| {name} | " + " | ".join(f"{c['mean']:.3f}" if c else "-" for c in cells) + " |")
    lines += ["", "## Verdicts at each step count", "",
              "| claim | " + " | ".join(f"{n} steps" for n in steps) + " |", "|" + " --- |" * (len(steps) + 1)]
    for i, v in enumerate(first["verdicts"]):
        where = f" on {v['on']}" if v.get("on") else ""
        cells = [_cell(rungs[n]["verdicts"][i]) if i < len(rungs[n]["verdicts"]) else "-" for n in steps]
        lines.append(f"| {v['claim']}{where} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
