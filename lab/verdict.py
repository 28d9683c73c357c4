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

from dataclasses import asdict, dataclass, field

from .downstream import column_metric
from .spec import Expectation
from .stats import Interval, mean_sd, paired_interval

PER_LAYER = {"attention_entropy": ("attention", "entropy"), "attention_max_prob": ("attention", "max_prob"),
             "attention_spread": ("attention", "spread")}  # expect name -> (results.json probe, its statistic)
MIN_SEEDS = 3  # below this the t interval is too wide to decide anything (t(0.975, 1) = 12.7)
LEAK_TOL = 1e-5  # mask_leak above this: the run sees tokens its mask hides (float rounding stays far below)
# a line without a verdict word says why: status -> how
UNDECIDED = {"no verdict": "no verdict ({})", "not tested": "not tested: {}",
             "invalid": "invalid for a causal model: {}"}


def _num(x: float) -> str:
    return f"{x:+.3g}"


def _difference(mean: float, lo: float | None, hi: float | None, n: int) -> str:
    if lo is None:
        return f"Δ {_num(mean)}, n = {n} (no interval from one seed)"
    return f"Δ {_num(mean)}, 95% CI [{_num(lo)}, {_num(hi)}], n = {n}"


@dataclass
class Verdict:
    claim: str  # what the literature expects, e.g. "kv2-mean < kv2-first"
    on: str  # the eval label it was judged on ("" for a probe without one)
    status: str  # holds | reversed | differs | inconclusive | mixed (probes, trains/fails) | does not hold
    #              (trains/fails) | no verdict | not tested | invalid | missing
    n: int  # seeds compared
    mean: float | None  # mean paired difference (or probe value)
    lo: float | None  # the 95% interval of `mean` (None below 2 seeds, and for probes)
    hi: float | None
    source: str
    warning: str = ""
    why: str = ""  # why there is no verdict word ("2 seeds; a verdict needs 3", "--quick", a run's gate)
    probe: bool = False  # the numbers are probe values, not differences
    holding: int = 0  # probes: seeds where the threshold held
    sd: float | None = None
    figures: str = ""  # trains/fails: each run's gate outcome and losses, which stand in for a difference
    others: list = field(default_factory=list)  # the same comparison on the other eval texts: {on, mean, lo, hi, n}
    disagree: str = ""  # the eval texts whose intervals point opposite ways, said in words

    @property
    def numbers(self) -> str:
        if self.figures:
            return self.figures
        if self.probe:
            spread = f" ± {self.sd:.3g}" if self.sd else ""
            return f"value {self.mean:.3g}{spread}, {self.holding}/{self.n} seeds within the bound"
        return _difference(self.mean, self.lo, self.hi, self.n)

    @property
    def line(self) -> str:
        if self.status == "missing":
            return f"{self.claim}: no scores to compare — {self.source}"
        where = f" on {self.on}" if self.on else ""
        word = UNDECIDED[self.status].format(self.why) if self.status in UNDECIDED else self.status
        also = "".join(f" — on {o['on']}: {_difference(o['mean'], o['lo'], o['hi'], o['n'])}" for o in self.others)
        note = f" [texts disagree: {self.disagree}]" if self.disagree else ""
        note += f" [warning: {self.warning}]" if self.warning else ""
        return f"{self.claim}{where}: {word} — {self.numbers}{also} — {self.source}{note}"

    def to_dict(self) -> dict:
        return {**asdict(self), "line": self.line}


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


def undecided(n: int, quick: bool) -> str:
    """Why a comparison of n seeds gets no verdict word, or "" when it gets one."""
    if quick:
        return "quick run: a tiny size checks the lab runs, not the claim"
    if n < MIN_SEEDS:
        return f"{n} seed{'s' if n != 1 else ''}; a verdict needs {MIN_SEEDS}"
    return ""


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


def probe_seeds(results: dict, probe: str, run: str | None, label: str) -> dict[str, float]:
    """{seed: value} of `probe` (an `expect: probe:` name) for `run`; a per-layer probe gives its mean over
    layers. attention_reliance is kept per eval text (`label`), memory_ratio once for the lab."""
    probes = results.get("probes", {})
    if probe == "memory_ratio":
        return {"-": probes["memory"]["ratio"]} if probes.get("memory") else {}
    if probe == "attention_reliance":
        found = probes.get(probe) or {}
        return dict(found["values"].get(label, {})) if found.get("run") == run else {}
    key, stat = PER_LAYER.get(probe, (probe, None))
    values = (probes.get(key) or {}).get("values", {}).get(run, {})
    out = {}
    for seed, value in values.items():
        layers = value[stat] if stat else value
        out[seed] = sum(layers) / len(layers) if isinstance(layers, list) else layers
    return out


def judge_probe(exp: Expectation, results: dict, label: str) -> Verdict:
    """A probe claim: against a threshold, holds where the value is within its bound in every seed; against
    another run, read from the paired t interval of the per-seed differences (module doc)."""
    if exp.versus:
        return judge_probe_pair(exp, results, label)
    values = list(probe_seeds(results, exp.probe, exp.run, label).values())
    on = label if exp.probe == "attention_reliance" else ""
    if not values:
        return Verdict(exp.describe(), on, "missing", 0, None, None, None, exp.source)
    holding = sum((v < exp.below) if exp.below is not None else (v > exp.above) for v in values)
    mean, sd = mean_sd(values)
    why = undecided(MIN_SEEDS, _quick(results))
    status = "no verdict" if why else judge_count(holding, len(values), "reversed")
    return Verdict(exp.describe(), on, status, len(values), mean, None, None, exp.source, why=why, probe=True,
                   holding=holding, sd=sd)


def judge_probe_pair(exp: Expectation, results: dict, label: str) -> Verdict:
    """`probe: P, run: A, below: B` (or above): P(A) - P(B) seed by seed, its 95% paired t interval; holds
    when the interval lies wholly on the predicted side of 0, reversed when wholly on the other."""
    a, b = (probe_seeds(results, exp.probe, run, label) for run in (exp.run, exp.versus))
    seeds = [s for s in a if s in b]
    if not seeds:
        return Verdict(exp.describe(), "", "missing", 0, None, None, None, exp.source)
    iv = paired_interval([a[s] - b[s] for s in seeds])
    means = [mean_sd([values[s] for s in seeds])[0] for values in (a, b)]
    figures = f"{exp.run} {means[0]:.3g}, {exp.versus} {means[1]:.3g}; {_difference(iv.mean, iv.lo, iv.hi, iv.n)}"
    failed = [x for x in (untrained(results, exp.run), untrained(results, exp.versus)) if x]
    if failed and not _quick(results):
        status, why = "not tested", "; ".join(failed)
    else:
        why = undecided(iv.n, _quick(results))
        status = "no verdict" if why else _probe_side(iv, -1 if exp.below is not None else 1)
    return Verdict(exp.describe(), "", status, iv.n, iv.mean, iv.lo, iv.hi, exp.source, why=why, sd=iv.sd,
                   figures=figures)


def _quick(results: dict) -> bool:
    return bool(results.get("options", {}).get("quick"))


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
    why = undecided(len(seeds), _quick(results))
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
    a, b = exp.pair
    deltas = paired(results["rows"], a, b, label, column_metric(results, label))
    if not deltas:
        return Verdict(exp.describe(), label, "missing", 0, None, None, None, exp.source)
    iv = paired_interval(deltas)
    failed = list(dict.fromkeys(x for x in (untrained(results, a), untrained(results, b)) if x))
    leaks = [x for x in (leaking(results, a), leaking(results, b)) if x]
    if leaks:  # a property of the architecture, at any size: --quick shows it too
        status, why = "invalid", "; ".join(leaks)
    elif failed and not _quick(results):  # in --quick nothing trains far: the gates say so in their table
        status, why = "not tested", "; ".join(failed)
    else:
        why = undecided(iv.n, _quick(results))
        status = "no verdict" if why else decide(exp, iv)
    others = []
    for other in counterparts(results, label):
        found = paired(results["rows"], a, b, other, column_metric(results, other))
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


def _probe_side(iv: Interval, predicted: int) -> str:
    """holds when the whole interval lies on the `predicted` side of 0 (-1 below, +1 above), reversed when
    on the other, inconclusive when it holds 0."""
    side = -1 if iv.hi < 0 else 1 if iv.lo > 0 else 0
    return "holds" if side == predicted else "reversed" if side == -predicted else "inconclusive"


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
