"""A lab spec: one claim about a Transformer design choice, as YAML, checked before any compute is spent.

Loading is strict in the way recipes are (trainer/recipe.py): unknown keys get a suggestion, every
problem in the file is collected and reported at once as one ConfigError naming the file and the key.
Whether each variant's recipe is valid is checked by the planner (`plan.resolve_recipes`), which loads
every recipe the lab would train before the first step. The rows a spec makes (its variants and the names
its convert, uptrain, sweep and downstream blocks derive) are named here, where expectations are checked
against them, so the planner reads them from the spec and the spec never imports the planner."""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from ..errors import ConfigError
from ..trainer.recipe import parse_override
from ..yamlfile import AliasBomb, safe_load
from .expect import PROBE_NAMES, PROBE_SOURCE, Expectation, mapping, parse_expectation, suggest  # noqa: F401

TOP_KEYS = ("claim", "title", "source", "base", "set", "reference", "metric", "eval", "whole_documents", "own_masking",
            "variants", "convert", "uptrain", "downstream", "probes", "expect", "cost", "quick", "sweep")
METRICS = ("loss", "bits_per_byte")
METHODS = ("mean", "first", "random")
PROBES = ("attention_reliance", "lengths", "flash_equality", "mask_leak", "memory", "decode_speed", "attention_logits",
          "attention", "residual_update")
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
}
PER_VARIANT = ("attention", "residual_update")  # probes that measure every variant unless `runs` says otherwise


@dataclass
class LabSpec:
    claim: str
    path: Path
    base: str
    title: str = ""
    source: str = ""
    set: list[str] = field(default_factory=list)
    reference: str = ""
    metric: str = "loss"
    eval: list[str] = field(default_factory=list)  # empty = the base recipe's data.valid
    whole_documents: bool = False  # also score each eval text document by document (columns LABEL@whole)
    own_masking: bool = False  # also score each MLM checkpoint under the masking it trained with (LABEL@own)
    variants: dict[str, list[str]] = field(default_factory=dict)
    convert: dict[str, Any] | None = None  # {from, kv_heads: [..], methods: [..]}
    uptrain: dict[str, Any] | None = None  # {fractions: [..], set: [..]}
    downstream: dict[str, Any] | None = None  # {recipe, set: [..], heads: {name: [..]}}: each variant fine-tuned
    probes: dict[str, Any] = field(default_factory=dict)
    expect: list[Expectation] = field(default_factory=list)
    cost: dict[str, Any] = field(default_factory=dict)
    quick: list[str] = field(default_factory=list)  # --quick only: after QUICK, and again after each variant's own
    sweep: dict[str, list] = field(default_factory=dict)  # {SECTION.KEY: [values]}: each variant at its best value

    def probed_runs(self, key: str) -> list[str]:
        """The runs probe `key` measures: its `run` / `runs`, else every variant (PER_VARIANT probes, made
        for comparing runs) or the reference."""
        settings = self.probes.get(key) or {}
        if "run" in settings:
            return [settings["run"]]
        return list(settings.get("runs") or (self.variants if key in PER_VARIANT else [self.reference]))

    def base_path(self) -> str:
        """The base recipe: a bundled name, or a path relative to the spec file."""
        return self.recipe_path(self.base)

    def recipe_path(self, name: str) -> str:
        """A recipe the spec names (base, downstream.recipe): a bundled name, or a path relative to the spec."""
        candidate = self.path.parent / name
        return str(candidate) if candidate.is_file() else name


# --- the rows a spec makes: its variants, and the names the plan derives from its blocks -------------------

def conversion_name(kv_heads: int, method: str) -> str:
    return f"kv{kv_heads}-{method}"


def uptrain_suffix(fraction: float) -> str:
    return f"+up{fraction * 100:g}%"


def downstream_rows(spec: LabSpec) -> dict[str, tuple[str, list[str]]]:
    """VARIANT+HEAD -> (variant, the head's overrides) for every fine-tuning a `downstream` block adds."""
    heads = (spec.downstream or {}).get("heads", {})
    return {f"{v}+{h}": (v, list(o)) for v in spec.variants for h, o in heads.items()}


def parsed_overrides(items: list[str]) -> dict[str, Any]:
    """SECTION.KEY -> value of a list of overrides as the recipe loader parses `--set` (the last one wins), so
    `model.n_kv_heads=2` and `model.n_kv_heads= 2` are one setting; an item that is no override is left to
    the loader, which names it when the recipe is resolved."""
    out = {}
    for item in items:
        try:
            section, key, value = parse_override(item)
        except ConfigError:
            continue
        out[f"{section}.{key}"] = value
    return out


def scratch_names(spec: LabSpec) -> dict[int, str]:
    """kv_heads -> the from-scratch baseline of that layout: a variant setting exactly that head count (the
    value its overrides give model.n_kv_heads, however spelled), or `scratch-kvK`, which the plan adds."""
    heads = {name: parsed_overrides(o).get("model.n_kv_heads") for name, o in spec.variants.items()}
    out = {}
    for k in (spec.convert or {}).get("kv_heads", []):
        own = [n for n, v in heads.items() if type(v) is type(k) and v == k]
        out[k] = own[0] if own else f"scratch-kv{k}"
    return out


def derived_names(spec: LabSpec) -> list[str]:
    """Row names the plan adds to the spec's variants: conversions, uptrained models, controls, baselines."""
    conv, fractions = spec.convert or {}, (spec.uptrain or {}).get("fractions", [])
    names = [n for n in scratch_names(spec).values() if n not in spec.variants]
    for k in conv.get("kv_heads", []):
        for m in conv.get("methods", []):
            names.append(conversion_name(k, m))
            names += [conversion_name(k, m) + uptrain_suffix(f) for f in fractions]
    names += [f"{conv.get('from')}{uptrain_suffix(f)}" for f in fractions]
    return names + list(downstream_rows(spec))


def sweep_runs(spec: LabSpec) -> dict[str, dict[str, list[str]]]:
    """variant -> {run name: its overrides} under `sweep`: `post-warmup@lr=0.001` is the variant with
    `optim.lr=0.001` after its own overrides. Without a sweep each variant is its one run."""
    if not spec.sweep:
        return {name: {name: list(o)} for name, o in spec.variants.items()}
    ((key, values),) = spec.sweep.items()
    short = key.rsplit(".", 1)[1]
    return {name: {f"{name}@{short}={v:g}" if isinstance(v, float) else f"{name}@{short}={v}": [*o, f"{key}={v}"]
                   for v in values} for name, o in spec.variants.items()}


def bundled_specs() -> dict[str, Path]:
    """Claim name -> path of every spec shipped in the package (recipes/lab/*.yaml)."""
    folder = resources.files("tfkit.recipes") / "lab"
    return {Path(p.name).stem: Path(str(p)) for p in folder.iterdir() if p.name.endswith(".yaml")}


def find_spec(name_or_path: str) -> Path:
    path = Path(name_or_path).expanduser()
    if path.is_file():
        return path
    bundled = bundled_specs()
    if name_or_path in bundled:
        return bundled[name_or_path]
    close = difflib.get_close_matches(name_or_path, list(bundled), n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise ConfigError(f"lab claim {name_or_path!r}: no such spec file and no bundled claim of that name{hint} "
                      f"(bundled: {', '.join(sorted(bundled))})")


def summary(path: Path) -> str:
    """The first comment line of a spec file: its one-line description."""
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            return line.lstrip("# ").strip()
    return ""


def load_spec(name_or_path: str) -> LabSpec:
    """Read and check a spec; one ConfigError lists every problem, prefixed by the file."""
    path = find_spec(name_or_path)
    try:
        raw = safe_load(path.read_text(encoding="utf-8"))  # the recipes' guarded reader: no alias bombs, no deep nests
    except AliasBomb as exc:
        raise ConfigError(f"{path}: {exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise ConfigError(f"{path}{f' line {mark.line + 1}' if mark else ''}: not valid YAML") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read ({exc})") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping with keys {', '.join(TOP_KEYS)}")
    problems: list[str] = []
    spec = _build(raw, path, problems)
    if problems:
        raise ConfigError(f"{path}: " + "; ".join(problems))
    return spec


def _strings(value: Any, key: str, problems: list[str]) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        problems.append(f"{key}: expected a list of strings, got {value!r}")
        return []
    return value


def _numbers(value: Any, key: str, problems: list[str], kind: type = float) -> list:
    ok = isinstance(value, list) and value and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                                    and (kind is float or isinstance(v, int)) and v > 0 for v in value)
    if not ok:
        what = "positive integers" if kind is int else "positive numbers"
        problems.append(f"{key}: expected a non-empty list of {what}, got {value!r}")
        return []
    return list(value)


def _build(raw: dict, path: Path, problems: list[str]) -> LabSpec:
    """The spec of a parsed file; every problem found is appended to `problems` (all of them are told at once)."""
    for key in raw:
        if key not in TOP_KEYS:
            problems.append(f"{key}: unknown key{suggest(key, TOP_KEYS)}")
    base = raw.get("base")
    if not isinstance(base, str) or not base:
        problems.append(f"base: expected a recipe name or path, got {base!r}")
    variants_raw = raw.get("variants")
    variants: dict[str, list[str]] = {}
    if not isinstance(variants_raw, dict) or not variants_raw:
        problems.append("variants: expected a mapping of name -> list of SECTION.KEY=VALUE overrides")
    else:
        for name, items in variants_raw.items():
            variants[str(name)] = _strings(items, f"variants.{name}", problems)
    spec = LabSpec(claim=str(raw.get("claim") or path.stem), path=path, base=base if isinstance(base, str) else "",
                   title=str(raw.get("title") or ""), source=str(raw.get("source") or ""),
                   set=_strings(raw.get("set"), "set", problems), variants=variants,
                   eval=_strings(raw.get("eval"), "eval", problems), quick=_strings(raw.get("quick"), "quick", problems))
    for key in ("whole_documents", "own_masking"):
        flag = raw.get(key, False)
        if not isinstance(flag, bool):
            problems.append(f"{key}: got {flag!r}, expected true or false")
        setattr(spec, key, flag is True)
    spec.reference = str(raw.get("reference") or next(iter(variants), ""))
    spec.metric = str(raw.get("metric", "loss"))
    if spec.metric not in METRICS:
        problems.append(f"metric: got {spec.metric!r}, expected one of {', '.join(METRICS)}")
    spec.cost = mapping(raw.get("cost"), "cost", ("cpu_minutes", "runs", "note"), problems)
    names = set(variants)
    spec.convert = _convert(raw.get("convert"), variants, problems)
    spec.uptrain = _uptrain(raw.get("uptrain"), spec.convert is not None, problems)
    spec.downstream = _downstream(raw.get("downstream"), spec, problems)
    spec.probes = mapping(raw.get("probes"), "probes", PROBES, problems)
    spec.sweep = _sweep(raw.get("sweep"), spec, problems)
    if spec.sweep and spec.downstream:
        problems.append("downstream: cannot be combined with sweep (a swept variant is the best of several runs)")
    names |= set(derived_names(spec))  # the names conversions, uptraining and controls add
    if spec.reference not in names:
        problems.append(f"reference: got {spec.reference!r}, expected one of {', '.join(sorted(names))}")
    _check_probes(spec.probes, names, problems)
    expect = raw.get("expect") or []
    if not isinstance(expect, list):
        problems.append("expect: expected a list of expectations")
        expect = []
    for i, item in enumerate(expect):
        for exp in parse_expectation(item, f"expect[{i}]", names, problems):
            spec.expect.append(exp)
            if exp.probe in PROBE_SOURCE:
                _check_probed(spec, exp, f"expect[{i}]", problems)
    return spec


def _convert(value: Any, variants: dict[str, list[str]], problems: list[str]) -> dict[str, Any] | None:
    """The `convert` block (MHA checkpoints turned into GQA ones): which variant, how many kv-heads, how."""
    if value is None:
        return None
    conv = mapping(value, "convert", ("from", "kv_heads", "methods"), problems)
    if conv.get("from") not in variants:
        problems.append(f"convert.from: got {conv.get('from')!r}, expected one of the variants "
                        f"({', '.join(variants)})")
    methods = _strings(conv.get("methods", ["mean"]), "convert.methods", problems)
    for m in methods:
        if m not in METHODS:
            problems.append(f"convert.methods: got {m!r}, expected one of {', '.join(METHODS)}")
    return {"from": conv.get("from"), "methods": methods,
            "kv_heads": _numbers(conv.get("kv_heads"), "convert.kv_heads", problems, int)}


def _uptrain(value: Any, converts: bool, problems: list[str]) -> dict[str, Any] | None:
    """The `uptrain` block: the fractions of the original training that continue each converted checkpoint."""
    if value is None:
        return None
    up = mapping(value, "uptrain", ("fractions", "set"), problems)
    if not converts:
        problems.append("uptrain: needs a convert step (uptraining continues the converted checkpoints)")
    fractions = _numbers(up.get("fractions"), "uptrain.fractions", problems)
    return {"fractions": fractions, "set": _strings(up.get("set"), "uptrain.set", problems)}


def _check_probes(probes: dict[str, Any], names: set[str], problems: list[str]) -> None:
    """Each probe's settings, and the runs it names among the spec's variants and derived runs."""
    for key, probe in probes.items():
        if key == "lengths":
            if any(f < 2 for f in _numbers(probe, "probes.lengths", problems, int)):
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


def _downstream(value: Any, spec: LabSpec, problems: list[str]) -> dict[str, Any] | None:
    """`downstream: {recipe, set, heads}`: after its training, every variant of every seed is fine-tuned by
    `recipe` (a bundled fine-tuning recipe or a path relative to the spec: classify) once per head, with
    the head's overrides after `set`: rows VARIANT+HEAD, judged on the task's held-out labels (error = 1 -
    accuracy). A spec about a head (`task.pooling`) has one variant and several heads; a spec about the body
    (positions, norms) several variants and one head."""
    if value is None:
        return None
    raw = mapping(value, "downstream", ("recipe", "set", "heads"), problems)
    recipe = raw.get("recipe")
    if not isinstance(recipe, str) or not recipe:
        problems.append(f"downstream.recipe: expected a fine-tuning recipe name or path, got {recipe!r}")
    heads_raw = raw.get("heads") or {"task": []}
    heads: dict[str, list[str]] = {}
    if not isinstance(heads_raw, dict):
        problems.append(f"downstream.heads: expected a mapping of name -> list of SECTION.KEY=VALUE, got {heads_raw!r}")
    else:
        heads = {str(name): _strings(items, f"downstream.heads.{name}", problems) for name, items in heads_raw.items()}
    return {"recipe": recipe if isinstance(recipe, str) else "",
            "set": _strings(raw.get("set"), "downstream.set", problems), "heads": heads}


def _check_probed(spec: LabSpec, exp: Expectation, key: str, problems: list[str]) -> None:
    """A probe expectation names a probe the spec runs, on the runs it compares (else it could only ever
    read "no scores to compare", after all the training)."""
    source = PROBE_SOURCE[exp.probe]
    if source not in spec.probes:
        problems.append(f"{key}.probe: {exp.probe} is measured by probes.{source}, which the spec does not run")
        return
    if source == "memory":  # one figure of the run's architecture, not a value per run
        return
    probed = spec.probed_runs(source)
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


def _sweep(value: Any, spec: LabSpec, problems: list[str]) -> dict[str, list]:
    """`sweep: {SECTION.KEY: [values]}`: one recipe key, each variant trained at every value and compared
    at its best. Rows then stand for a choice among runs, so nothing may name one run: no conversion and
    no probe but lengths."""
    if value is None:
        return {}
    if not (isinstance(value, dict) and len(value) == 1):
        problems.append(f"sweep: expected one SECTION.KEY: [values] mapping, got {value!r}")
        return {}
    ((key, values),) = value.items()
    if not (isinstance(key, str) and "." in key and isinstance(values, list) and len(values) > 1
            and all(isinstance(v, (int, float, str)) and not isinstance(v, bool) for v in values)):
        problems.append(f"sweep: expected SECTION.KEY: [two or more values], got {key!r}: {values!r}")
        return {}
    if spec.convert is not None or set(spec.probes) - {"lengths"}:
        problems.append("sweep: cannot be combined with convert or with probes other than lengths (they name runs, "
                        "and a swept variant is the best of several)")
    return {key: list(values)}


