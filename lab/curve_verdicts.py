"""`faster: A, than: B`: A reaches B's final validation loss in fewer steps, read from the validation curves.

Optimizer papers state their gain as a ratio of steps: Muon reaches AdamW's final loss in 1/1.56 of AdamW's steps
(modded-nanogpt at 124M), about 1/1.4 at 0.1B falling to 1/1.1 at 1.2B (Wen et al., 2025). A loss gap at equal
steps says neither, so this form measures the ratio itself, seed by seed: the target is B's last validation loss,
A's steps to it are read off A's curve (linear between validations: the curve's resolution is train.eval_every),
and the ratio is B's steps over A's. Its verdict comes from the paired t interval of the per-seed ratios: holds
when the whole interval lies above 1 (A faster), reversed when below; a seed where A never reaches the target
makes the claim mixed (reversed if none does), since its ratio is only known to be at most 1."""

from __future__ import annotations

from .expect import Expectation
from .outcomes import untrained
from .stats import paired_interval
from .verdict_line import Verdict, is_quick, undecided


def steps_to(curve: list[list[float]], target: float) -> float | None:
    """The first step at which a validation curve [[step, loss], ...] reaches `target`, linear between points;
    None when it never does."""
    previous = None
    for step, loss in curve:
        if loss <= target:
            if previous is None or previous[1] == loss:
                return float(step)
            (s0, l0) = previous
            return s0 + (step - s0) * (l0 - target) / (l0 - loss)
        previous = (step, loss)
    return None


def judge_speed(exp: Expectation, results: dict, label: str) -> Verdict:
    """The ratio claim (module doc); `label` names the text the curves were validated on (data.valid)."""
    a, b = exp.pair
    rows, curves = results.get("rows", {}), results.get("curves", {})
    ca, cb = (curves.get(rows.get(n, {}).get("best_of", n), {}) for n in (a, b))
    seeds = [s for s in cb if s in ca and ca[s] and cb[s]]
    if not seeds:
        return Verdict(exp.describe(), label, "missing", 0, None, None, None, exp.source)
    ratios, missed, reached = [], [], []
    for seed in seeds:
        target, total = cb[seed][-1][1], cb[seed][-1][0]
        step = steps_to(ca[seed], target)
        if step is None or step <= 0:
            missed.append(seed)
        else:
            ratios.append(total / step)
            reached.append(f"{step:.0f}")
    iv = paired_interval(ratios) if ratios else None
    figures = (f"{a}'s steps to {b}'s final validation loss: {', '.join(reached) or 'never'} (seeds "
               f"{', '.join(s for s in seeds if s not in missed)})" + (f"; never reached in seed(s) {', '.join(missed)}"
                                                                     if missed else ""))
    if iv is not None:
        spread = "" if iv.lo is None else f", 95% CI [{iv.lo:.3g}, {iv.hi:.3g}]"
        figures += f"; {b}'s steps over {a}'s: {iv.mean:.3g}x{spread}, n = {iv.n}"
    failed = [x for x in (untrained(results, a), untrained(results, b)) if x]
    why = undecided(len(seeds), is_quick(results))
    if failed and not is_quick(results):
        status, why = "not tested", "; ".join(failed)
    elif why:
        status = "no verdict"
    elif missed:
        status = "reversed" if not ratios else "mixed"
    elif iv.lo is None:
        status, why = "no verdict", "one seed"
    else:
        status = "holds" if iv.lo > 1.0 else "reversed" if iv.hi < 1.0 else "inconclusive"
    return Verdict(exp.describe(), label, status, len(seeds), iv.mean if iv else None, iv.lo if iv else None,
                   iv.hi if iv else None, exp.source, why=why, sd=iv.sd if iv else None, figures=figures, ratio=True)
