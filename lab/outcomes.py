"""What the gates say about a run, as verdicts read it: whether it (or the run it was converted or uptrained from)
trained, whether it leaks what its mask hides, and the `trains: A, fails: B` form, whose predicted outcome is a
run that does not train, decided from the gates seed by seed (verdict.py's module doc states the rule)."""

from __future__ import annotations

from .expect import Expectation
from .verdict_line import Verdict, is_quick, undecided

LEAK_TOL = 1e-5  # mask_leak above this: the run sees tokens its mask hides (float rounding stays far below)


def untrained(results: dict, name: str) -> str:
    """"NAME did not train (figures)" when a seed of run `name`, or of the run it was converted or
    uptrained from, failed its gate (gates.py); "" otherwise."""
    runs = results.get("gates", {}).get("runs", {})
    while name in runs:
        failed = {seed: g for seed, g in runs[name]["seeds"].items() if g["status"] != "trained"}
        if failed:
            return f"{name} did not train ({'; '.join(_gate_figures(seed, g) for seed, g in failed.items())})"
        name = runs[name].get("source")
    return ""


def _gate_figures(seed: str, g: dict) -> str:
    if g.get("why"):  # stopped by the trainer: no checkpoint, no figures
        return f"seed {seed}: {g['status']} ({g['why']})"
    if g.get("matthews") is not None:  # a downstream fine-tuning (downstream.py)
        return f"seed {seed}: {g['status']}, Matthews correlation {g['matthews']:.3f} on the held-out labels"
    return (f"seed {seed}: {g['status']}, loss {g['loss']:.3f} against unigram {g['unigram']:.3f} and step 0 "
            f"{g['step0']:.3f}")


def leaking(results: dict, name: str) -> str:
    """Why run `name` is invalid for a causal model: the mask_leak probe (train mode) saw its outputs
    change with tokens its mask hides (BatchNorm's batch statistics); "" when not measured or exact."""
    seeds = results.get("probes", {}).get("mask_leak", {}).get("values", {}).get(name, {})
    worst = max(seeds.values(), default=0.0)
    if worst <= LEAK_TOL:
        return ""
    return (f"{name}'s outputs change by up to {worst:.3g} when only tokens its mask hides change "
            "(mask_leak, train mode): it sees later tokens while it trains")


def seed_gates(results: dict, name: str) -> dict:
    """{seed: gate} of run `name`, or of the run it stands for (a conversion's source, a swept variant's best
    run): the outcomes gates.py recorded; {} when the lab has none."""
    runs = results.get("gates", {}).get("runs", {})
    while name in runs and not runs[name]["seeds"]:
        name = runs[name].get("source")
    return runs[name]["seeds"] if name in runs else {}


def _outcomes(name: str, gates: dict) -> str:
    """'B trained 0/3 (diverged: seeds 1, 2; did not learn: seed 3), loss 7.1, 6.9, 6.8': one run's gates."""
    failed: dict[str, list[str]] = {}
    for seed, g in gates.items():
        if g["status"] != "trained":
            failed.setdefault(g["status"], []).append(seed)
    which = "; ".join(f"{status}: seed{'s' if len(s) > 1 else ''} {', '.join(s)}" for status, s in failed.items())
    trained = len(gates) - sum(map(len, failed.values()))
    losses = ", ".join(f"{g['loss']:.3f}" for g in gates.values())
    return f"{name} trained {trained}/{len(gates)}{f' ({which})' if which else ''}, loss {losses}"


def judge_training(exp: Expectation, results: dict, label: str) -> Verdict:
    """A trains where B does not, seed by seed from the gates (module doc); the figures are both runs' gate
    outcomes and losses, with the unigram and step-0 figures they were held against."""
    a, b = exp.pair
    ga, gb = seed_gates(results, a), seed_gates(results, b)
    seeds = [s for s in ga if s in gb]
    if not seeds:
        return Verdict(exp.describe(), label, "missing", 0, None, None, None, exp.source)
    ga, gb = ({s: g[s] for s in seeds} for g in (ga, gb))
    figures = f"{_outcomes(a, ga)}; {_outcomes(b, gb)}"
    known = [(s, g[s]) for g in (gb, ga) for s in seeds if g[s]["unigram"] is not None]  # a divergence has none
    if known:
        seed, first = known[0]
        figures += f"; against unigram {first['unigram']:.3f} and step 0 {first['step0']:.3f} (seed {seed})"
    a_ok, b_ok = ([g[s]["status"] == "trained" for s in seeds] for g in (ga, gb))
    why = undecided(len(seeds), is_quick(results))
    if why:
        status = "no verdict"
    elif not any(a_ok) and all(b_ok):
        status = "reversed"
    elif not all(a_ok):
        status, why = "not tested", untrained(results, a)
    else:
        status = "holds" if not any(b_ok) else "does not hold" if all(b_ok) else "mixed"
    return Verdict(exp.describe(), label, status, len(seeds), None, None, None, exp.source, why=why,
                   figures=figures)
