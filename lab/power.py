"""What a comparison could have shown: its p-value as a test, and, where it stayed inconclusive, how many seeds
would decide it at the spread it measured or the smallest effect its seeds could detect.

Three seeds give t(0.975, 2) = 4.30: at the seed-to-seed spread of these runs (sd 0.04-0.2 nats for a paired
difference) an equality within 0.05 is out of reach before the first run, so "inconclusive" says nothing
until it says how far from a verdict it was. Each verdict word of verdict.py is a pair of one-sided t tests
at (1 - LEVEL) / 2 each; `word_ps` gives the one-sided p-value of every word a form can reach (the word
holds exactly where its p is below 0.025), and `family_p` the two-sided-equivalent p of the line's own word
(twice the one-sided one, so the family's level is 0.05 as the interval's is), which family.py adjusts by
Holm's rule across a lab or a record."""

from __future__ import annotations

from .expect import Expectation
from .stats import LEVEL, Interval, above_p, below_p, half_width, seeds_needed

ALPHA = 1.0 - LEVEL  # the two-sided level every interval is read at (0.05)


def word_ps(exp: Expectation, iv: Interval) -> dict[str, float]:
    """word -> the one-sided p-value of the test that gives it, for a comparison (better, not_worse, same) or a
    probe compared with another run (`versus`: the predicted side of 0); {} below 2 seeds."""
    if iv.lo is None:
        return {}
    if exp.same:
        return {"holds": max(above_p(iv, -exp.tol), below_p(iv, exp.tol)),
                "differs": min(above_p(iv, exp.tol), below_p(iv, -exp.tol))}
    if exp.versus:
        low, high = below_p(iv, 0.0), above_p(iv, 0.0)
        return {"holds": low, "reversed": high} if exp.below is not None else {"holds": high, "reversed": low}
    bound = exp.margin if exp.not_worse else -exp.margin
    return {"holds": below_p(iv, bound), "reversed": above_p(iv, exp.margin)}


def family_p(exp: Expectation, iv: Interval, status: str) -> float | None:
    """The two-sided-equivalent p of a judged line: of its word, or (inconclusive) of the word it came nearest
    to; None for a line that is no such test (below 2 seeds)."""
    ps = word_ps(exp, iv)
    if not ps:
        return None
    one_sided = ps[status] if status in ps else min(ps.values())
    return min(1.0, 2.0 * one_sided)


def gaps(exp: Expectation, iv: Interval) -> dict[str, float]:
    """word -> how far the observed mean lies beyond the bound that word needs (positive: more seeds at this
    spread would reach it; zero or less: no number of seeds does at this mean)."""
    m = iv.mean
    if exp.same:
        return {"holds": exp.tol - abs(m), "differs": abs(m) - exp.tol}
    if exp.versus:
        return {"holds": -m, "reversed": m} if exp.below is not None else {"holds": m, "reversed": -m}
    if exp.not_worse:
        return {"holds": exp.margin - m, "reversed": m - exp.margin}
    return {"holds": -exp.margin - m, "reversed": m - exp.margin}


def detectable(exp: Expectation, iv: Interval) -> float:
    """The smallest |Δ| these seeds could have called at this spread: the bound (margin, tol or 0) plus the
    interval's half-width."""
    bound = exp.tol if exp.same else 0.0 if exp.versus else exp.margin
    return bound + half_width(iv.sd, iv.n)


def power_note(exp: Expectation, iv: Interval) -> dict:
    """For an inconclusive line: {"seeds", "word", "detectable", "text"}: the seeds that would decide it at the
    observed mean and spread (the word they would give), or that none would, and the smallest detectable |Δ|."""
    reachable = {w: g for w, g in gaps(exp, iv).items() if g > 0}
    smallest = detectable(exp, iv)
    out = {"seeds": None, "word": None, "detectable": smallest}
    if reachable:
        word, gap = max(reachable.items(), key=lambda item: item[1])
        out.update(seeds=seeds_needed(iv.sd, gap), word=word)
        need = f"about {out['seeds']} seeds" if out["seeds"] else "more than 1000 seeds"
        text = f"at this mean and spread (sd {iv.sd:.3g}) {need} would make it {word}"
    else:
        where = f"inside ±{exp.margin:g}" if exp.better else "on the bound a verdict needs"
        text = f"the mean lies {where}, so no number of seeds decides it at this mean (sd {iv.sd:.3g})"
    out["text"] = f"{text}; the smallest |Δ| {iv.n} seeds detect at this spread is {smallest:.3g}"
    return out
