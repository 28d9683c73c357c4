"""Verdicts on probe claims: a probe value against a threshold (holds where every seed is within it), or against
another run's (read like a loss comparison, from the paired t interval of the per-seed differences). A per-layer
probe is judged on its mean over layers, or at the layer an expectation names (`layer`, `than_layer`: the
last block's residual update against the first's)."""

from __future__ import annotations

from .expect import PROBE_SOURCE, Expectation
from .outcomes import untrained
from .stats import Interval, mean_sd, paired_interval
from .verdict_line import MIN_SEEDS, Verdict, difference, is_quick, judge_count, undecided

PER_LAYER = {"attention_entropy": ("attention", "entropy"), "attention_max_prob": ("attention", "max_prob"),
             "attention_spread": ("attention", "spread")}  # expect name -> (results.json probe, its statistic)


def probe_seeds(results: dict, probe: str, run: str | None, label: str, layer: int | None = None) -> dict[str, float]:
    """{seed: value} of `probe` (an `expect: probe:` name) for `run`; a per-layer probe gives its mean over
    layers, or its value at `layer` (negative: from the last; a seed without that layer is left out).
    attention_reliance is kept per eval text (`label`), memory_ratio once for the lab."""
    probes = results.get("probes", {})
    if probe == "memory_ratio":
        return {"-": probes["memory"]["ratio"]} if probes.get("memory") else {}
    if probe == "flash_speedup":
        return {"-": probes["train_speed"]["speedup"]} if "speedup" in probes.get("train_speed", {}) else {}
    if probe == "attention_reliance":
        found = probes.get(probe) or {}
        return dict(found["values"].get(label, {})) if found.get("run") == run else {}
    key, stat = PER_LAYER.get(probe, (probe, None))
    values = (probes.get(key) or {}).get("values", {}).get(run, {})
    out = {}
    for seed, value in values.items():
        layers = value[stat] if stat else value
        if not isinstance(layers, list):
            out[seed] = layers
        elif layer is None:
            out[seed] = sum(layers) / len(layers)
        elif -len(layers) <= layer < len(layers):
            out[seed] = layers[layer]
    return out


def judge_probe(exp: Expectation, results: dict, label: str) -> Verdict:
    """A probe claim: against a threshold, holds where the value is within its bound in every seed; against
    another run, read from the paired t interval of the per-seed differences (module doc)."""
    if exp.versus:
        return judge_probe_pair(exp, results, label)
    values = list(probe_seeds(results, exp.probe, exp.run, label, exp.layer).values())
    on = label if exp.probe == "attention_reliance" else ""
    skipped = (results.get("probes", {}).get(PROBE_SOURCE[exp.probe]) or {}).get("why")
    if skipped:  # a probe this machine cannot measure (train_speed without a GPU)
        return Verdict(exp.describe(), on, "not tested", 0, None, None, None, exp.source, why=f"{skipped}",
                       figures="nothing measured")
    if not values:
        return Verdict(exp.describe(), on, "missing", 0, None, None, None, exp.source)
    holding = sum((v < exp.below) if exp.below is not None else (v > exp.above) for v in values)
    mean, sd = mean_sd(values)
    why = undecided(MIN_SEEDS, is_quick(results))
    status = "no verdict" if why else judge_count(holding, len(values), "reversed")
    return Verdict(exp.describe(), on, status, len(values), mean, None, None, exp.source, why=why, probe=True,
                   holding=holding, sd=sd)


def judge_probe_pair(exp: Expectation, results: dict, label: str) -> Verdict:
    """`probe: P, run: A, below: B` (or above): P(A) - P(B) seed by seed, its 95% paired t interval; holds
    when the interval lies wholly on the predicted side of 0, reversed when wholly on the other."""
    other = exp.layer if exp.than_layer is None else exp.than_layer
    a, b = probe_seeds(results, exp.probe, exp.run, label, exp.layer), probe_seeds(results, exp.probe, exp.versus,
                                                                                   label, other)
    seeds = [s for s in a if s in b]
    if not seeds:
        return Verdict(exp.describe(), "", "missing", 0, None, None, None, exp.source)
    iv = paired_interval([a[s] - b[s] for s in seeds])
    means = [mean_sd([values[s] for s in seeds])[0] for values in (a, b)]
    at = ["" if n is None else f" (layer {n})" for n in (exp.layer, other)]
    figures = (f"{exp.run}{at[0]} {means[0]:.3g}, {exp.versus}{at[1]} {means[1]:.3g}; "
               f"{difference(iv.mean, iv.lo, iv.hi, iv.n)}")
    failed = [x for x in (untrained(results, exp.run), untrained(results, exp.versus)) if x]
    if failed and not is_quick(results):
        status, why = "not tested", "; ".join(failed)
    else:
        why = undecided(iv.n, is_quick(results))
        status = "no verdict" if why else probe_side(iv, -1 if exp.below is not None else 1)
    return Verdict(exp.describe(), "", status, iv.n, iv.mean, iv.lo, iv.hi, exp.source, why=why, sd=iv.sd,
                   figures=figures)


def probe_side(iv: Interval, predicted: int) -> str:
    """holds when the whole interval lies on the `predicted` side of 0 (-1 below, +1 above), reversed when
    on the other, inconclusive when it holds 0."""
    side = -1 if iv.hi < 0 else 1 if iv.lo > 0 else 0
    return "holds" if side == predicted else "reversed" if side == -predicted else "inconclusive"
