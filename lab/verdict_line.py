"""One verdict: what the literature expects, the word the lab gives it and the numbers that word is read from,
as results.json keeps it and results.md prints it on one line (verdict.py decides the word, annotate.py adds
what a reader needs beside it: power, registration, the paper, the family-wise view)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

MIN_SEEDS = 3  # below this the t interval is too wide to decide anything (t(0.975, 1) = 12.7)
# a line without a verdict word says why: status -> how
UNDECIDED = {"no verdict": "no verdict ({})", "not tested": "not tested: {}",
             "invalid": "invalid for a causal model: {}"}
DECIDED = ("holds", "reversed", "differs")  # the words an interval gives, which Holm's rule may take back
FAMILY_LEVEL = 0.05  # the family-wise level: the two-sided level every interval is read at


def _num(x: float) -> str:
    return f"{x:+.3g}"


def difference(mean: float, lo: float | None, hi: float | None, n: int) -> str:
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
    p: float | None = None  # two-sided-equivalent p of its word (power.family_p): what family.py adjusts
    holm: float | None = None  # that p adjusted by Holm's rule over the lab's (or the record's) family
    power: str = ""  # an inconclusive line: the seeds that would decide it, the smallest detectable effect
    seeds_needed: int | None = None
    detectable: float | None = None
    margin_reason: str = ""  # why the margin or tol is what it is
    registered: str = ""  # "fixed before the data" | "written after the data" | "" (registration.py)
    looks: list = field(default_factory=list)  # what earlier looks at fewer seeds read: "inconclusive at 3 seeds"
    paper: dict | None = None  # the paper beside it: cite, regime, reported, agreement, scale ratios (paper.py)
    ratio: bool = False  # mean / lo / hi are a ratio of steps (faster/than), not a difference

    @property
    def numbers(self) -> str:
        if self.figures:
            return self.figures
        if self.probe:
            spread = f" ± {self.sd:.3g}" if self.sd else ""
            return f"value {self.mean:.3g}{spread}, {self.holding}/{self.n} seeds within the bound"
        return difference(self.mean, self.lo, self.hi, self.n)

    @property
    def line(self) -> str:
        if self.status == "missing":
            return f"{self.claim}: no scores to compare — {self.source}"
        where = f" on {self.on}" if self.on else ""
        word = UNDECIDED[self.status].format(self.why) if self.status in UNDECIDED else self.status
        also = "".join(f" — on {o['on']}: {difference(o['mean'], o['lo'], o['hi'], o['n'])}" for o in self.others)
        note = f" [texts disagree: {self.disagree}]" if self.disagree else ""
        note += f" [warning: {self.warning}]" if self.warning else ""
        return f"{self.claim}{where}: {word} — {self.numbers}{also} — {self.source}{note}{self.notes}"

    @property
    def notes(self) -> str:
        """What a reader needs beside the word (annotate.py): the power of an inconclusive line, the margin's
        reason, Holm's family-wise word, the registration, earlier looks, the paper's direction."""
        out = f" [power: {self.power}]" if self.power else ""
        out += f" [margin: {self.margin_reason}]" if self.margin_reason else ""
        if self.holm is not None and self.status in DECIDED:
            kept = "kept" if self.holm < FAMILY_LEVEL else "not kept"
            out += f" [Holm: {kept}, p {self.p:.2g} -> {self.holm:.2g}]"
        out += f" [expectation {self.registered}]" if self.registered else ""
        out += f" [second look: {'; '.join(self.looks)} before these {self.n}]" if self.looks else ""
        out += f" [paper: {self.paper['agreement']}]" if self.paper else ""
        return out

    def to_dict(self) -> dict:
        return {**asdict(self), "line": self.line}


def undecided(n: int, quick: bool) -> str:
    """Why a comparison of n seeds gets no verdict word, or "" when it gets one."""
    if quick:
        return "quick run: a tiny size checks the lab runs, not the claim"
    if n < MIN_SEEDS:
        return f"{n} seed{'s' if n != 1 else ''}; a verdict needs {MIN_SEEDS}"
    return ""


def judge_count(holding: int, n: int, failed: str) -> str:
    return "holds" if holding == n else failed if holding == 0 else "mixed"


def is_quick(results: dict) -> bool:
    return bool(results.get("options", {}).get("quick"))
