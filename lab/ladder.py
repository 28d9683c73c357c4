"""Ladders: the same lab at several step counts (`--steps`) or model sizes (`--sizes`, a spec's `sizes:`), a
verdict per rung, the trend of each claim along the rungs and where its verdict turns.

Some claims are about where training ends up, not where it is after a few hundred steps: the literature
measures them at convergence (warmup and post-norm, optimizers, positions), and a verdict at 300 steps may be a
verdict about the speed of the first phase. Others are about scale: a verdict at 1M parameters may reverse at
10M (sizes.py). `tfkit lab run CLAIM --steps 150 --steps 300 --steps 600` runs the whole lab once per step count
(folders `steps-N/`), `--sizes 3` once per model size (folders `d_model-64/`, every rung at the same tokens per
parameter); each rung is an ordinary lab folder that `lab report` and `lab run --out` read like any other. The
ladder's own results.md gives the scale of each rung, every verdict at every rung, and per claim the slope of
its paired difference against log2 of the steps or parameters with its interval (trend.py), naming the rungs
where the verdict turns.

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
from .engine import DEFAULT_SEEDS, claim_folder, default_folder, prepare, run
from .plan import LabOptions
from .report import MARKDOWN, RESULTS, report_folder, write_report
from .paper import short_count
from .sizes import SizeRung, rung_options
from .spec import LabSpec, load_spec
from .trend import trend, trend_text, turns

LADDER_FILE = "ladder.json"
KEPT = ("verdicts", "scale", "summary", "reference", "evals", "seeds", "metric", "title", "source", "options", "rows",
        "downstream", "family")


def rung(folder: Path, steps: int) -> Path:
    return folder / f"steps-{steps}"


def check_steps(steps: list[int]) -> list[int]:
    """Two or more distinct positive step counts, in increasing order."""
    if any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in steps) or len(set(steps)) != len(steps):
        raise ConfigError(f"steps: got {steps}, expected distinct positive step counts", params=("steps",))
    return sorted(steps)


def _claim(spec: LabSpec, options: LabOptions, out: Path | None, record: dict) -> tuple[Path, LabOptions]:
    options = dataclasses.replace(options, seeds=options.seeds or spec.seeds or DEFAULT_SEEDS)
    folder = Path(out) if out else default_folder(spec.claim)
    claim_folder(folder, spec, {**record, "options": dataclasses.replace(options, steps=None).to_dict()}, LADDER_FILE)
    return folder, options


def run_ladder(spec: LabSpec, options: LabOptions, steps: list[int], out: Path | None = None) -> tuple[Path, dict]:
    """Every step count's lab (checked before the first trains), then the ladder report; (folder, its results)."""
    steps = check_steps(steps)
    folder, options = _claim(spec, options, out, {"claim": spec.claim, "steps": steps})
    labs = [prepare(spec, dataclasses.replace(options, steps=n), rung(folder, n)) for n in steps]
    rungs = {str(n): write_report(lab.folder, run(lab), spec) for n, lab in zip(steps, labs)}
    return folder, write_ladder(folder, spec, rungs, "steps")


def run_sizes(spec: LabSpec, options: LabOptions, rungs: list[SizeRung], out: Path | None = None) -> tuple[Path, dict]:
    """Every size's lab (`sizes.size_rungs`; every rung checked before the first trains), then the ladder report."""
    sizes = {"key": rungs[0].key, "values": [r.value for r in rungs]}
    folder, options = _claim(spec, options, out, {"claim": spec.claim, "sizes": sizes})
    labs = [prepare(spec, rung_options(options, r), folder / r.name) for r in rungs]
    results = {r.name: write_report(lab.folder, run(lab), spec) for r, lab in zip(rungs, labs)}
    return folder, write_ladder(folder, spec, results, rungs[0].key)


def write_ladder(folder: Path, spec: LabSpec, rungs: dict[str, dict], axis: str) -> dict:
    """The ladder's results.json (each rung's verdicts and scale, each claim's trend and turns) and results.md."""
    trends = [trend(exp, rungs, axis) for exp in spec.expect]
    words = [turns([(name, r["verdicts"][i]["status"]) for name, r in rungs.items() if i < len(r["verdicts"])])
             for i in range(len(spec.expect))]
    results = {"claim": spec.claim, "axis": axis, "rungs": {n: {k: r.get(k) for k in KEPT} for n, r in rungs.items()},
               "trends": trends, "turns": words}
    if axis == "steps":
        results["steps"] = [int(n) for n in rungs]
    write_atomic(folder / RESULTS, json.dumps(results, indent=2) + "\n")
    write_atomic(folder / MARKDOWN, render_ladder(results))
    return results


def report_ladder(folder: Path) -> dict:
    """Rebuild every rung's report and the ladder's from their results.json (`tfkit lab report DIR`)."""
    record = read_json(folder / LADDER_FILE, ConfigError)
    sizes, steps = record.get("sizes"), record.get("steps")
    if isinstance(sizes, dict) and isinstance(sizes.get("values"), list) and sizes["values"]:
        names, axis = [f"{sizes['key']}-{v}" for v in sizes["values"]], sizes["key"]
    elif isinstance(steps, list) and steps:
        names, axis = [f"steps-{n}" for n in steps], "steps"
    else:
        raise ConfigError(f"{folder / LADDER_FILE}: damaged, expected the step counts or sizes of a ladder")
    spec = load_spec(str(folder / "spec.yaml"))  # the copy is still a valid spec
    rungs = {(n.removeprefix("steps-") if axis == "steps" else n): report_folder(folder / n) for n in names}
    return write_ladder(folder, spec, rungs, axis)


def _cell(v: dict) -> str:
    """One verdict at one rung: its word (or why there is none) and Δ with its interval."""
    if v["status"] == "missing":
        return "-"
    word = v["status"]
    if v.get("ratio") and v.get("mean") is not None:  # faster/than: a ratio of steps
        spread = f" [{v['lo']:.3g}, {v['hi']:.3g}]" if v.get("lo") is not None else ""
        return f"{word}: {v['mean']:.3g}x{spread}"
    if v.get("lo") is not None:
        return f"{word}: Δ {v['mean']:+.3g} [{v['lo']:+.3g}, {v['hi']:+.3g}]"
    if v.get("mean") is None:  # trains/fails: read from the gates, no difference
        return word
    return f"{word}: {v['mean']:.3g}" if v.get("probe") else f"{word}: Δ {v['mean']:+.3g}"


def _heading(name: str, axis: str) -> str:
    return f"{name} steps" if axis == "steps" else name.replace("-", " ")


def render_ladder(results: dict) -> str:
    rungs, axis = results["rungs"], results.get("axis", "steps")
    names = list(rungs)
    first = rungs[names[0]]
    ref, label = first["reference"], next(iter(first["evals"]))
    heads = [_heading(n, axis) for n in names]
    lines = [f"# tfkit lab ladder: {results['claim']}", ""]
    if first.get("title"):
        lines += [first["title"] + (f" ({first['source']})" if first.get("source") else ""), ""]
    what = (f"at {', '.join(names)} steps (every run from scratch, its schedule over its own steps" if axis == "steps"
            else f"at {axis} {', '.join(n.split('-', 1)[1] for n in names)} (every rung at the same tokens per "
                 "parameter of its reference run, the warmup the same share of its steps")
    lines += [f"The same lab {what}; {len(first['seeds'])} paired seed(s)); each rung's full report is in "
              f"{'steps-N' if axis == 'steps' else axis + '-N'}/results.md. Verdicts are read at each rung by the rule "
              "stated there; the trend is the least-squares slope of each claim's per-seed difference against "
              f"log2 of the rung's {'steps' if axis == 'steps' else 'parameters'}, with its 95% t interval.", "",
              f"| rung | steps | tokens seen ({ref}) | parameters | tokens / parameter | epochs |",
              "| --- | --- | --- | --- | --- | --- |"]
    for n, head in zip(names, heads):
        s = (rungs[n].get("scale") or {}).get(ref) or {}
        tokens, params, train = s.get("tokens"), s.get("params"), s.get("train_tokens")
        lines.append(f"| {head} | {s.get('steps', '-')} | {short_count(tokens) if tokens else '-'} | "
                     f"{short_count(params) if params else '-'} | "
                     f"{f'{tokens / params:.3g}' if tokens and params else '-'} | "
                     f"{f'{tokens / train:.3g}' if tokens and train else '-'} |")
    lines += ["", f"{first['metric']} on {label}, mean over seeds:", "",
              "| variant | " + " | ".join(heads) + " |", "|" + " --- |" * (len(names) + 1)]
    for name in first["summary"]:
        cells = [rungs[n]["summary"].get(name, {}).get(label) for n in names]
        lines.append(f"| {name} | " + " | ".join(f"{c['mean']:.3f}" if c else "-" for c in cells) + " |")
    lines += ["", f"## Verdicts at each {'step count' if axis == 'steps' else 'size'}", "",
              "| claim | " + " | ".join(heads) + " | trend of Δ | where the verdict turns |",
              "|" + " --- |" * (len(names) + 3)]
    trends, turned = results.get("trends") or [], results.get("turns") or []
    for i, v in enumerate(first["verdicts"]):
        where = f" on {v['on']}" if v.get("on") else ""
        cells = [_cell(rungs[n]["verdicts"][i]) if i < len(rungs[n]["verdicts"]) else "-" for n in names]
        t = trend_text(trends[i]) if i < len(trends) else "-"
        turn = "; ".join(turned[i]) if i < len(turned) and turned[i] else "-"
        lines.append(f"| {v['claim']}{where} | " + " | ".join(cells) + f" | {t} | {turn} |")
    return "\n".join(lines) + "\n"
