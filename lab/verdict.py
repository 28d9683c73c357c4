"""From paired scores to verdicts: does the literature's ordering hold here, and how surely?

Seeds are paired (seed i of every variant saw the same batches), so a claim "A beats B" is judged on the
per-seed differences d_i = metric(A, seed i) - metric(B, seed i), not on two independent means:
- holds: the mean difference favours A by more than the noise, `max(margin, 2 * sd / sqrt(n))`;
- reversed: it favours B by more than the noise;
- within noise: otherwise.
Each verdict also says in how many seeds the difference alone went each way ("holds in 2/3 seeds").
A `same` claim holds in the seeds where |d_i| <= tol; a probe claim where the probe value is below (above)
its threshold. The attention-reliance probe adds a warning to every comparison on a text where removing
attention costs less than its threshold: there, head layouts cannot matter much."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from .spec import Expectation


@dataclass
class Verdict:
    claim: str  # what the literature expects, e.g. "kv2-mean < kv2-first"
    on: str  # the eval label it was judged on ("" for a probe without one)
    status: str  # holds | reversed | within noise | differs | mixed | missing
    holding: int  # seeds where the expectation held on its own
    n: int  # seeds compared
    mean: float | None  # mean paired difference (or probe value)
    sd: float | None
    source: str
    warning: str = ""
    probe: bool = False  # the numbers are probe values, not differences


    @property
    def line(self) -> str:
        if self.status == "missing":
            return f"{self.claim}: no scores to compare — {self.source}"
        verdict = {"holds": f"holds in {self.holding}/{self.n} seeds", "within noise": "within noise",
                   "reversed": f"reversed in {self.n - self.holding}/{self.n} seeds",
                   "differs": f"differs in {self.n - self.holding}/{self.n} seeds",
                   "mixed": f"mixed: holds in {self.holding}/{self.n} seeds"}[self.status]
        where = f" on {self.on}" if self.on else ""
        spread = f" ± {self.sd:.3g}" if self.sd else ""
        what = f"value {self.mean:.3g}" if self.probe else f"Δ {self.mean:+.3g}"
        value = f" ({what}{spread})" if self.mean is not None else ""
        note = f" [warning: {self.warning}]" if self.warning else ""
        return f"{self.claim}{where}: {verdict}{value} — {self.source}{note}"

    def to_dict(self) -> dict:
        return {**asdict(self), "line": self.line}


def mean_sd(values: list[float]) -> tuple[float, float]:
    n = len(values)
    mean = sum(values) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else 0.0
    return mean, sd


def judge_better(deltas: list[float], margin: float) -> tuple[str, int]:
    """(status, seeds where A was better by more than margin) for d_i = A - B, lower is better."""
    mean, sd = mean_sd(deltas)
    noise = max(margin, 2 * sd / math.sqrt(len(deltas))) if len(deltas) > 1 else margin
    holding = sum(d < -margin for d in deltas)
    if mean < -noise:
        return "holds", holding
    if mean > noise:
        return "reversed", holding
    return "within noise", holding


def judge_count(holding: int, n: int, failed: str) -> str:
    return "holds" if holding == n else failed if holding == 0 else "mixed"


def paired(rows: dict, a: str, b: str, label: str, metric: str) -> list[float]:
    """metric(a) - metric(b) for every seed both rows have on `label`."""
    sa, sb = (rows.get(n, {}).get("scores", {}).get(label, {}) for n in (a, b))
    return [sa[s][metric] - sb[s][metric] for s in sorted(sa) if s in sb
            and sa[s].get(metric) is not None and sb[s].get(metric) is not None]


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


def probe_values(results: dict, exp: Expectation, label: str) -> list[float]:
    probe = results.get("probes", {}).get(exp.probe) or {}
    if exp.probe == "memory_ratio":
        memory = results.get("probes", {}).get("memory")
        return [memory["ratio"]] if memory else []
    if exp.probe == "attention_reliance":
        values = probe["values"].get(label, {}) if probe.get("run") == exp.run else {}
    else:
        values = probe.get("values", {}).get(exp.run, {})
    return list(values.values())


def judge(exp: Expectation, results: dict) -> Verdict:
    rows, metric = results["rows"], results["metric"]
    label = exp.on or next(iter(results["evals"]))
    if exp.probe:
        values = probe_values(results, exp, label)
        on = label if exp.probe == "attention_reliance" else ""
        if not values:
            return Verdict(exp.describe(), on, "missing", 0, 0, None, None, exp.source)
        holding = sum((v < exp.below) if exp.below is not None else (v > exp.above) for v in values)
        mean, sd = mean_sd(values)
        return Verdict(exp.describe(), on, judge_count(holding, len(values), "reversed"), holding, len(values),
                       mean, sd, exp.source, probe=True)
    a, b = (exp.better, exp.than) if exp.better else exp.same
    deltas = paired(rows, a, b, label, metric)
    if not deltas:
        return Verdict(exp.describe(), label, "missing", 0, 0, None, None, exp.source)
    mean, sd = mean_sd(deltas)
    if exp.same:
        holding = sum(abs(d) <= exp.tol for d in deltas)
        status = judge_count(holding, len(deltas), "differs")
    else:
        status, holding = judge_better(deltas, exp.margin)
    return Verdict(exp.describe(), label, status, holding, len(deltas), mean, sd, exp.source,
                   reliance_warning(results, label))


def summary(results: dict) -> dict:
    """{row: {label: {mean, sd, n, delta}}}: `delta` is the mean paired difference to the reference row."""
    rows, metric, ref = results["rows"], results["metric"], results["reference"]
    out: dict = {}
    for name, row in rows.items():
        for label, seeds in row["scores"].items():
            values = [v[metric] for v in seeds.values() if v.get(metric) is not None]
            if not values:
                continue
            mean, sd = mean_sd(values)
            deltas = paired(rows, name, ref, label, metric)
            out.setdefault(name, {})[label] = {"mean": mean, "sd": sd, "n": len(values),
                                               "delta": mean_sd(deltas)[0] if deltas and name != ref else None}
    return out
