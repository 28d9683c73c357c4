"""What a reader needs beside a verdict word before quoting it (the issue's "verdicts a researcher can quote"):
- power: an inconclusive line says how many seeds would decide it at the spread it measured, or that none would
  at its mean, and the smallest effect its seeds could detect (power.py);
- its p-value as a test, which family.py adjusts by Holm's rule across the lab (and across a record);
- why its margin is what it is (`margin_reason`: the noise floor it was measured against);
- whether its expectation was fixed before the data (registration.py) and what earlier looks at fewer seeds
  read;
- the paper's regime and reported effect beside ours, with the agreement word and the scale ratio (paper.py).
`annotate` adds them to a verdict that verdict.judge decided; the word itself never changes here."""

from __future__ import annotations

from .expect import Expectation
from .paper import comparison
from .power import family_p, power_note
from .registration import earlier_looks, fixed
from .stats import Interval
from .verdict_line import Verdict

NO_TEST = ("not tested", "invalid", "no verdict", "missing")  # lines that are no test of the claim


def predicted_side(exp: Expectation) -> int | None:
    """The side of 0 the paper's effect puts the paired difference on: A < B (better) below, a probe bound naming
    another run on its side; None where the claim has no direction (same, not_worse, thresholds, trains)."""
    if exp.better:
        return -1
    if exp.faster:  # a ratio of steps: its side of 1 (annotate shifts it to 0)
        return 1
    if exp.versus:
        return -1 if exp.below is not None else 1
    return None


def our_scale(results: dict, exp: Expectation) -> dict | None:
    """{params, tokens} of the first run the claim names that the lab measured, else of the reference."""
    scale = results.get("scale") or {}
    names = [n for n in (*(exp.pair if not exp.untested and not exp.probe else ()), exp.run,
                         results.get("reference")) if n]
    rows = results.get("rows", {})
    for name in names:
        name = rows.get(name, {}).get("best_of", name)  # a swept variant: its best run's scale
        if name in scale:
            return scale[name]
    return None


def annotate(v: Verdict, exp: Expectation, results: dict, paper: dict | None) -> Verdict:
    """`v` with its power, p-value, margin reason, registration, earlier looks and paper comparison."""
    v.margin_reason = exp.margin_reason
    registration = results.get("registration")
    v.registered = fixed(registration, exp.hash)
    v.looks = earlier_looks(registration, v.claim, v.on) if registration and registration.get("looks") else []
    interval_line = v.lo is not None and not (exp.untested or exp.trains or exp.faster) and (not exp.probe or exp.versus)
    if interval_line and v.status not in NO_TEST:
        iv = Interval(v.mean, v.sd or 0.0, v.n, v.lo, v.hi)
        v.p = family_p(exp, iv, v.status)
        if v.status == "inconclusive":
            note = power_note(exp, iv)
            v.power, v.seeds_needed, v.detectable = note["text"], note["seeds"], note["detectable"]
    sweep = results.get("sweep") or {}
    if sweep.get("on") and v.on and v.on.split("@")[0] == sweep["on"] and len(results.get("evals", {})) > 1:
        picked = f"read on {sweep['on']}, the text the sweep picked each variant's best {sweep['key']} on"
        v.warning = f"{v.warning}; {picked}" if v.warning else picked
    source = exp.paper or paper
    if source:
        lo, hi = (v.lo - 1.0, v.hi - 1.0) if exp.faster and v.lo is not None else (v.lo, v.hi)
        v.paper = comparison(source, exp.reported, v.status, lo, hi, predicted_side(exp), our_scale(results, exp))
    return v
