"""The trend of a claim along a ladder (sizes or steps): the slope of its paired difference against log2 of the
rung's parameters (or steps), with its 95% interval, and the rungs where its verdict turns.

A verdict per rung says what holds at each size; whether an effect grows, shrinks or reverses with size is a
claim about all of them, read from one line fitted through every rung's per-seed differences (one point per
rung and seed; the rungs' seeds are independent runs, so the least-squares interval with n - 2 degrees of
freedom applies). A slope whose interval excludes 0 says the effect changes with size in that direction; where
the verdict word changes from one rung to the next, the report names the two rungs."""

from __future__ import annotations

import math

from .downstream import column_metric
from .spec import Expectation
from .stats import slope_interval
from .outcomes import untrained
from .verdict import claim_deltas, default_label
from .verdict_line import is_quick

WORDS = ("holds", "reversed", "differs", "inconclusive", "does not hold", "mixed")  # a turn is between two of these


def rung_x(results: dict, axis: str) -> float | None:
    """log2 of the rung's position on the axis: its reference run's parameters (a sizes ladder), its steps."""
    if axis == "steps":
        steps = results.get("options", {}).get("steps")
        return math.log2(steps) if steps else None
    scale = (results.get("scale") or {}).get(results.get("reference"), {})
    return math.log2(scale["params"]) if scale.get("params") else None


def trend(exp: Expectation, rungs: dict[str, dict], axis: str) -> dict | None:
    """{slope, lo, hi, n, per, left_out}: the least-squares slope of A - B against log2(axis) over every rung and
    seed where every run the claim reads trained (a rung where one stayed at the unigram loss has a difference of
    noise, which would bend the line: it is named in `left_out`); None for a claim that is no paired difference
    (probes, trains/fails, untested) or with fewer than 2 rungs left."""
    if exp.untested or exp.trains or exp.probe or exp.faster:  # no paired difference (a faster claim's ratios are
        return None  # read per rung)
    xs, ys, left_out = [], [], []
    names = [*exp.pair, *(exp.minus or ())]
    for rung, results in rungs.items():
        x = rung_x(results, axis)
        if x is None:
            continue
        if not is_quick(results) and any(untrained(results, n) for n in names):
            left_out.append(rung)
            continue
        label = exp.on or default_label(results, exp)
        deltas = claim_deltas(exp, results["rows"], label, column_metric(results, label))
        finite = [d for d in deltas if math.isfinite(d)]
        xs += [x] * len(finite)
        ys += finite
    if len(set(xs)) < 2:
        return None
    s = slope_interval(xs, ys)
    return {"slope": s.slope, "lo": s.lo, "hi": s.hi, "n": s.n, "left_out": left_out,
            "per": "doubling of parameters" if axis != "steps" else "doubling of steps"}


def turns(words: list[tuple[str, str]]) -> list[str]:
    """"holds at d_model-64, inconclusive at d_model-128": each pair of neighbouring rungs whose words differ."""
    out = []
    for (a, wa), (b, wb) in zip(words, words[1:]):
        if wa != wb and wa in WORDS and wb in WORDS:
            out.append(f"{wa} at {a}, {wb} at {b}")
    return out


def trend_text(t: dict | None) -> str:
    if not t:
        return "-"
    if t["lo"] is None:
        return f"{t['slope']:+.3g} per {t['per']} (no interval from {t['n']} points)"
    side = "Δ rises" if t["lo"] > 0 else "Δ falls" if t["hi"] < 0 else "no trend resolved"
    left = f"; {', '.join(t['left_out'])} left out: a run did not train" if t.get("left_out") else ""
    return f"{t['slope']:+.3g} per {t['per']}, 95% CI [{t['lo']:+.3g}, {t['hi']:+.3g}] ({side}{left})"
