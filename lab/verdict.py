"""From paired scores to verdicts a researcher can quote: the mean difference, its 95% interval, one word.

Seeds are paired (seed i of every variant saw the same batches), so a claim about A and B is judged on the
per-seed differences d_i = metric(A, seed i) - metric(B, seed i), lower is better, through their paired t
interval (stats.py: mean ± t(0.975, n-1) · sd / √n). Every verdict is read off that one interval, which
every line prints:
- `better: A, than: B` holds when the whole interval lies below -margin (A better by more than the
  margin), is reversed when it lies above +margin, and is inconclusive otherwise;
- `not_worse: A, than: B` holds when the whole interval lies below +margin (A at most `margin` worse),
  is reversed when it lies above +margin;
- `same: [A, B]` is a TOST equivalence test: it holds when the whole interval lies inside (-tol, +tol)
  (two one-sided t tests at 2.5% each), differs when it lies wholly outside, is inconclusive otherwise.
- `trains: A, fails: B` (A trains at a setting where B does not, e.g. QK-norm at a learning rate where the
  same model without it diverges) is read from the gates, seed by seed, since a run that failed has no
  loss worth a difference: it holds when A trained and B did not in every seed, does not hold when B
  trained in every seed, and is mixed otherwise. Where A failed in some seed it is not tested (the setting
  does not let the claim show), except that A failing and B training in every seed is reversed.
With fewer than MIN_SEEDS seeds, or in a `--quick` lab, a line gives the numbers and no verdict word; a
comparison involving a run that did not train (gates.py) reads "not tested: <variant> did not train", and
one involving a run whose outputs change with tokens its mask hides in training (the mask_leak probe, e.g.
BatchNorm's batch statistics in a GPT) reads "invalid for a causal model", --quick or not.
An `untested` claim (one the spec says this lab cannot test, with why) reads "not tested: <why>" and no
numbers. A probe claim holds where the probe value is below (above) its threshold in every seed; one whose bound
names another run (`probe: attention_entropy, run: A, below: B`) is read like a loss comparison, from the
paired t interval of P(A) - P(B): holds when it lies wholly on the predicted side of 0, reversed when wholly
on the other. A per-layer probe is judged on its mean over layers. The attention-reliance probe adds a
warning to every comparison on a text where removing attention costs less than its threshold: there, head
layouts cannot matter much.
A comparison is judged on its eval text (the first by default, the lab's own held-out text) and every line
also gives Δ and its interval on the lab's other eval texts (the same column: docs-valid@2x beside
code-valid@2x); where two texts' intervals lie wholly on opposite sides of 0 the line is flagged "texts
disagree": the claim holds on one text and is reversed on another, so it is about the text, not only the
design."""

from __future__ import annotations

from .curve_verdicts import judge_speed
from .downstream import column_metric
from .outcomes import judge_training, leaking, untrained
from .probe_verdicts import judge_probe
from .spec import Expectation
from .stats import Interval, mean_sd, paired_interval
from .verdict_line import MIN_SEEDS, Verdict, is_quick, undecided  # noqa: F401 (MIN_SEEDS: report.py's rule)


def decide(exp: Expectation, iv: Interval) -> str:
    """The verdict word for a comparison claim from the 95% interval of d = A - B (module doc)."""
    if exp.same:
        if -exp.tol < iv.lo and iv.hi < exp.tol:
            return "holds"
        return "differs" if iv.lo > exp.tol or iv.hi < -exp.tol else "inconclusive"
    below = exp.margin if exp.not_worse else -exp.margin  # where the whole interval must lie under
    if iv.hi < below:
        return "holds"
    return "reversed" if iv.lo > exp.margin else "inconclusive"


def paired(rows: dict, a: str, b: str, label: str, metric: str) -> list[float]:
    """metric(a) - metric(b) for every seed both rows have on `label`."""
    sa, sb = (rows.get(n, {}).get("scores", {}).get(label, {}) for n in (a, b))
    return [sa[s][metric] - sb[s][metric] for s in sorted(sa) if s in sb
            and sa[s].get(metric) is not None and sb[s].get(metric) is not None]


def claim_deltas(exp: Expectation, rows: dict, label: str, metric: str) -> list[float]:
    """The per-seed differences a comparison is read from: A - B, or (A - B) - (C - D) with `minus`, over the
    seeds every row involved has on `label`."""
    a, b = exp.pair
    if not exp.minus:
        return paired(rows, a, b, label, metric)
    first, second = (by_seed(rows, x, y, label, metric) for x, y in ((a, b), exp.minus))
    return [first[s] - second[s] for s in sorted(first) if s in second]


def by_seed(rows: dict, a: str, b: str, label: str, metric: str) -> dict[str, float]:
    sa, sb = (rows.get(n, {}).get("scores", {}).get(label, {}) for n in (a, b))
    return {s: sa[s][metric] - sb[s][metric] for s in sa if s in sb
            and sa[s].get(metric) is not None and sb[s].get(metric) is not None}


def reliance_warning(results: dict, label: str) -> str:
    probe = results.get("probes", {}).get("attention_reliance")
    if not probe or label not in probe["values"]:
        return ""
    cost, _ = mean_sd(list(probe["values"][label].values()))
    if cost >= probe["threshold"]:
        return ""
    return (f"removing attention from {probe['run']} costs only {cost:.3f} nats on {label} "
            f"(< {probe['threshold']:g}): the model barely uses attention there, so layouts cannot differ much")


def coverage_warning(results: dict, label: str, below: float = 0.99) -> str:
    """Under bits per byte, a row whose tokenizer drops part of the text (byte_coverage < `below`, e.g.
    WordPiece's newlines and indentation) is scored on fewer bytes than the text has: say so."""
    if results.get("metric") != "bits_per_byte":
        return ""
    lossy = []
    for name, row in results["rows"].items():
        values = [s.get("byte_coverage") for s in row["scores"].get(label, {}).values()]
        values = [v for v in values if v is not None]
        if values and min(values) < below:
            lossy.append(f"{name} {min(values):.1%}")
    if not lossy:
        return ""
    return (f"on {label} some tokenizers keep only part of the text's bytes ({', '.join(lossy)}): the rest "
            "(whitespace, unknown characters) is never predicted, so their bits per byte read lower than a "
            "lossless tokenizer's would for the same model quality")


def judge(exp: Expectation, results: dict) -> Verdict:
    """The verdict on one expectation from the lab's results (module doc for the rule)."""
    if exp.untested:
        return Verdict(exp.describe(), "", "not tested", 0, None, None, None, exp.source, why=exp.why,
                       figures="nothing measured")
    label = exp.on or default_label(results, exp)
    if exp.probe:
        return judge_probe(exp, results, label)
    if exp.trains:
        return judge_training(exp, results, results.get("gates", {}).get("label", label))
    if exp.faster:
        return judge_speed(exp, results, "validation")
    names = [*exp.pair, *(exp.minus or ())]
    deltas = claim_deltas(exp, results["rows"], label, column_metric(results, label))
    if not deltas:
        return Verdict(exp.describe(), label, "missing", 0, None, None, None, exp.source)
    iv = paired_interval(deltas)
    failed = list(dict.fromkeys(x for x in map(lambda n: untrained(results, n), names) if x))
    leaks = [x for x in map(lambda n: leaking(results, n), names) if x]
    if leaks:  # a property of the architecture, at any size: --quick shows it too
        status, why = "invalid", "; ".join(leaks)
    elif failed and not is_quick(results):  # in --quick nothing trains far: the gates say so in their table
        status, why = "not tested", "; ".join(failed)
    else:
        why = undecided(iv.n, is_quick(results))
        status = "no verdict" if why else decide(exp, iv)
    others = []
    for other in counterparts(results, label):
        found = claim_deltas(exp, results["rows"], other, column_metric(results, other))
        if found:
            o = paired_interval(found)
            others.append({"on": other, "mean": o.mean, "lo": o.lo, "hi": o.hi, "n": o.n})
    return Verdict(exp.describe(), label, status, iv.n, iv.mean, iv.lo, iv.hi, exp.source,
                   reliance_warning(results, label), why=why, sd=iv.sd, others=others,
                   disagree=disagreement(label, iv, others))


def default_label(results: dict, exp: Expectation) -> str:
    """The column an expectation is read on unless it names one: a downstream row's task column, else the
    first eval text."""
    downstream = results.get("downstream") or {}
    rows = [r for r in (exp.pair or ()) if r in results["rows"]]
    if downstream and rows and all(results["rows"][r]["kind"] == "finetune" for r in rows):
        return downstream["label"]
    return next(iter(results["evals"]))


def counterparts(results: dict, label: str) -> list[str]:
    """The same column on the lab's other eval texts: docs-valid@2x -> code-valid@2x."""
    evals = sorted(results["evals"], key=len, reverse=True)  # the longest label that opens `label`
    base = next((e for e in evals if label == e or label.startswith(e + "@")), None)
    return [] if base is None else [e + label[len(base):] for e in results["evals"] if e != base]


def disagreement(label: str, iv: Interval, others: list[dict]) -> str:
    """Words for the eval texts whose 95% intervals lie wholly on opposite sides of 0 (one says A is better,
    another that B is), or "": a claim read on one text that another text contradicts."""
    def side(lo: float | None, hi: float | None) -> int:
        return 0 if lo is None else -1 if hi < 0 else 1 if lo > 0 else 0

    mine = side(iv.lo, iv.hi)
    against = [o for o in others if side(o["lo"], o["hi"]) == -mine != 0]
    if not against:
        return ""
    word = {-1: "lower", 1: "higher"}
    return (f"Δ is {word[mine]} than 0 on {label} but {word[-mine]} on "
            + ", ".join(o["on"] for o in against) + " (both 95% intervals exclude 0)")


def summary(results: dict) -> dict:
    """{row: {label: {mean, sd, n, delta}}}: `delta` is the mean paired difference to the reference row."""
    rows, ref = results["rows"], results["reference"]
    out: dict = {}
    for name, row in rows.items():
        for label, seeds in row["scores"].items():
            metric = column_metric(results, label)
            values = [v[metric] for v in seeds.values() if v.get(metric) is not None]
            if not values:
                continue
            mean, sd = mean_sd(values)
            deltas = paired(rows, name, ref, label, metric)
            out.setdefault(name, {})[label] = {"mean": mean, "sd": sd, "n": len(values),
                                               "delta": mean_sd(deltas)[0] if deltas and name != ref else None}
    return out
