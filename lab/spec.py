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
from .expect import PROBE_NAMES, PROBE_SOURCE, Expectation, item_hash, mapping, parse_expectation, suggest  # noqa: F401
from .paper import parse_paper
from .spec_probes import PROBES, check_probed, check_probes, probed_runs

TOP_KEYS = ("claim", "title", "source", "base", "set", "reference", "metric", "eval", "whole_documents", "own_masking",
            "variants", "convert", "uptrain", "downstream", "probes", "expect", "cost", "quick", "sweep", "sweep_on",
            "paper", "seeds", "sizes")
# masked_loss: an MLM model's loss on [MASK]ed positions only (every chosen position replaced by [MASK]), the
# task it cannot solve by copying its input (scoring.py)
METRICS = ("loss", "bits_per_byte", "masked_loss")
METHODS = ("mean", "first", "random")
SIZE_KEYS = ("d_model", "n_layers")  # the model key a `sizes:` ladder sets at each rung


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
    sweep_on: str | None = None  # the eval label a sweep picks each variant's best value on (scoring.pick_best)
    paper: dict | None = None  # the source's regime: {cite, params, tokens, data, note} (paper.py)
    seeds: int | None = None  # the seeds its claims need by default (its equality margins at the measured spread)
    sizes: dict | None = None  # {KEY: [values], tokens_per_param, set: {value: [..]}}: a ladder of model sizes
    expect_hash: str = ""  # of the whole `expect:` block as written (registration.py)

    def probed_runs(self, key: str) -> list[str]:
        """The runs probe `key` measures (spec_probes.probed_runs)."""
        return probed_runs(self.probes, self.variants, self.reference, key)

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
    check_probes(spec.probes, names, problems)
    spec.paper = parse_paper(raw.get("paper"), "paper", problems)
    spec.seeds = _count(raw.get("seeds"), "seeds", problems, least=2)
    spec.sizes = _sizes(raw.get("sizes"), problems)
    spec.sweep_on = _sweep_on(raw.get("sweep_on"), spec, problems)
    expect = raw.get("expect") or []
    if not isinstance(expect, list):
        problems.append("expect: expected a list of expectations")
        expect = []
    spec.expect_hash = item_hash(expect if spec.metric == "loss" else {"expect": expect, "metric": spec.metric})
    for i, item in enumerate(expect):
        for exp in parse_expectation(item, f"expect[{i}]", names, problems):
            exp.paper = parse_paper(item.get("paper"), f"expect[{i}].paper", problems)
            if spec.metric != "loss":  # the metric decides what the expectation reads: part of what is registered
                exp.hash = item_hash({"expect": item, "metric": spec.metric})
            spec.expect.append(exp)
            if exp.probe in PROBE_SOURCE:
                check_probed(spec.probes, spec.variants, spec.reference, exp, f"expect[{i}]", problems)
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




def _count(value: Any, key: str, problems: list[str], least: int = 1) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        problems.append(f"{key}: got {value!r}, expected an integer >= {least}")
        return None
    return value


def _sizes(value: Any, problems: list[str]) -> dict | None:
    """`sizes: {d_model | n_layers: [values], tokens_per_param: X, set: {value: [overrides]}}`: the lab at each
    model size (sizes.py), every rung at the same tokens per parameter (default: the base recipe's own)."""
    if value is None:
        return None
    raw = mapping(value, "sizes", (*SIZE_KEYS, "tokens_per_param", "set"), problems)
    keys = [k for k in SIZE_KEYS if k in raw]
    if len(keys) != 1:
        problems.append(f"sizes: expected exactly one of {', '.join(SIZE_KEYS)} (the model key each rung sets), "
                        f"got {keys or 'none'}")
        return None
    values = raw[keys[0]]
    if not (isinstance(values, list) and len(values) >= 2 and len(set(map(str, values))) == len(values)
            and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in values)):
        problems.append(f"sizes.{keys[0]}: expected two or more distinct positive integers, got {values!r}")
        return None
    per = raw.get("tokens_per_param")
    if per is not None and (isinstance(per, bool) or not isinstance(per, (int, float)) or per <= 0):
        problems.append(f"sizes.tokens_per_param: got {per!r}, expected a positive number")
    extra = raw.get("set") or {}
    if not isinstance(extra, dict) or any(k not in values or not isinstance(v, list) for k, v in extra.items()):
        problems.append(f"sizes.set: expected a mapping of a rung's {keys[0]} (one of {values}) to a list of "
                        f"overrides, got {extra!r}")
        extra = {}
    return {"key": keys[0], "values": sorted(values), "tokens_per_param": per,
            "set": {k: _strings(v, f"sizes.set.{k}", problems) for k, v in extra.items()}}


def _sweep_on(value: Any, spec: LabSpec, problems: list[str]) -> str | None:
    """The eval label a sweep picks on (checked against the eval texts when the lab is prepared)."""
    if value is None:
        return None
    if not spec.sweep:
        problems.append("sweep_on: names the text a sweep picks its best value on, but the spec has no sweep")
    if not isinstance(value, str) or not value:
        problems.append(f"sweep_on: got {value!r}, expected an eval label (e.g. code-valid)")
        return None
    return value
