"""What every benchmark shares: interleaved timing, peak memory, the result row, the table and the JSON.

Every number the suite reports is a *ratio* against a baseline measured in the same process, because a
ratio survives what absolute numbers do not: a noisy shared host, a different CPU, a throttled GPU. To
make the ratio fair, the candidates are timed in interleaved rounds (tfkit, baseline, baseline, tfkit,
...), so a disturbance hits both, and the ratio is the median of the per-round ratios of neighbours in time.
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch


@dataclass
class Context:
    """What one run of the suite was asked for, plus where sections leave what they could not measure."""

    suite: str  # cpu | gpu
    quick: bool  # seconds instead of minutes: tiny shapes, few rounds (for CI); not for recorded numbers
    compile: bool  # also measure torch.compile'd models
    device: torch.device
    eager: bool = True  # train section: also the eager rows (off where a lease has time for the compiled ones only)
    profile: bool = False  # train section: the compiled tfkit step's top kernels, once per case
    clock: str = "wall"  # wall | cpu (process CPU time: steadier than wall time on a busy shared host)
    corpus: Path | None = None  # text file for the tokenizer section; None = the built-in corpus
    corpus_mb: float = 50.0  # corpora section: megabytes written in every format
    finetune_data: Path = Path("../shared/data/ag_news_test.csv")  # finetune section: AG News' labelled test CSV
    cache: Path = Path.home() / ".cache" / "tfkit-bench"  # finetune section: the downloaded encoder, kept
    notes: list[str] = field(default_factory=list)  # skipped or failed pieces, printed under the table
    started: float = field(default_factory=time.perf_counter)

    @property
    def timer(self) -> Callable[[], float]:
        """The clock samples are taken with; a GPU's work happens off the CPU, so it is always timed by the wall."""
        return time.process_time if self.clock == "cpu" and self.device.type != "cuda" else time.perf_counter

    def log(self, message: str) -> None:
        """Progress on stderr (the table on stdout stays clean), with the time since the run began."""
        print(f"[{time.perf_counter() - self.started:6.1f}s] {message}", file=sys.stderr, flush=True)

    def skip(self, message: str) -> None:
        self.notes.append(message)
        self.log(f"skipped: {message}")


def sync(device: torch.device) -> None:
    """Wait for queued GPU work, so a wall-clock interval covers the kernels and not just their launches."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass(frozen=True)
class Goal:
    """A target stated as the minimum acceptable ratio (see Row.ratio), with the words the issue used; or, for
    a parity claim ("the same accuracy within 0.5 points"), as the largest gap |tfkit - baseline| in the
    row's unit, whichever side is ahead."""

    text: str  # e.g. ">= 1.3x HF compiled", "overhead <= 5%"
    min_ratio: float
    max_gap: float | None = None  # a parity goal: passed when |tfkit - baseline| <= max_gap (min_ratio unused)


@dataclass
class Row:
    """One comparison: tfkit's value and the baseline's, in the same unit, from the same run.

    `ratio` is oriented so that > 1 always means tfkit is better: tfkit/baseline for rates (tokens/s),
    baseline/tfkit for costs (ms, MB, seconds). A baseline of None (skipped, out of memory) has no ratio.
    """

    section: str  # train | attention | tokenizer | corpora | batches | decode | cli
    case: str  # what ran, including the baseline's name and the shape
    unit: str  # tok/s, ms, MB, s
    tfkit: float
    baseline: float | None
    higher_is_better: bool = True
    goal: Goal | None = None
    note: str = ""  # shown in the table (e.g. "+3.1% over SDPA", "naive: out of memory")
    paired: float | None = None  # the ratio from interleaved timing (paired_ratio), when there is one
    extra: dict = field(default_factory=dict)  # JSON only: samples, MFU, peak memory, ...

    @property
    def ratio(self) -> float | None:
        """The paired ratio when timed in rounds (it can differ slightly from the quotient of the two
        medians shown), else the quotient of the two values."""
        if self.paired is not None:
            return self.paired
        if self.baseline is None or not self.tfkit or not self.baseline:
            return None
        return self.tfkit / self.baseline if self.higher_is_better else self.baseline / self.tfkit

    def line(self) -> str:
        """The row as one progress line, logged when it is measured: a run cut off later keeps it."""
        ratio = "-" if self.ratio is None else f"{self.ratio:.2f}x"
        base = "-" if self.baseline is None else f"{self.baseline:,.4g}"
        return (f"{self.section}: {self.case}: tfkit {self.tfkit:,.4g} vs {base} {self.unit}, ratio {ratio}"
                f"{', goal ' + self.goal.text if self.goal else ''}{'; ' + self.note if self.note else ''}")

    @property
    def passed(self) -> bool | None:
        if self.goal is None or self.ratio is None:
            return None
        if self.goal.max_gap is not None:
            return abs(self.tfkit - self.baseline) <= self.goal.max_gap
        return self.ratio >= self.goal.min_ratio

    def to_dict(self) -> dict:
        return {**asdict(self), "goal": asdict(self.goal) if self.goal else None, "ratio": self.ratio,
                "passed": self.passed}


def time_interleaved(fns: dict[str, Callable[[], object]], device: torch.device, *, warmup: int, rounds: int,
                     calls: int, timer: Callable[[], float] = time.perf_counter) -> dict[str, list[float]]:
    """Seconds per call of each function, one sample per round; rounds alternate the order of the functions.

    Every function is first called `warmup` times (allocator, autotuning, torch.compile). A round calls each
    function `calls` times back to back and records the mean; the order is reversed on every other round so
    neither side always runs on a cache the other just warmed, or right after a host hiccup. `timer` is
    the wall clock, or `time.process_time` to count only the CPU time this process got (Context.timer).
    """
    names = list(fns)
    for name in names:
        for _ in range(warmup):
            fns[name]()
    sync(device)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names if r % 2 == 0 else reversed(names):
            sync(device)
            start = timer()
            for _ in range(calls):
                fns[name]()
            sync(device)
            samples[name].append((timer() - start) / calls)
    return samples


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def paired_ratio(candidate: list[float], baseline: list[float]) -> float:
    """Median over rounds of baseline_time / candidate_time (> 1: the candidate is faster).

    Pairs come from the same round, i.e. neighbours in time, so a slow patch on a shared host cancels."""
    return statistics.median(b / c for c, b in zip(candidate, baseline))


def peak_memory_mb(fn: Callable[[], object], device: torch.device) -> float | None:
    """Peak CUDA memory allocated during one call, in MB, above what was allocated before; None on CPU
    (PyTorch has no per-call peak for host memory, and process RSS would mostly measure the allocator)."""
    if device.type != "cuda":
        return None
    sync(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    fn()
    sync(device)
    return (torch.cuda.max_memory_allocated(device) - before) / 2**20


def is_oom(exc: BaseException) -> bool:
    """A GPU (or host) out-of-memory error, which a benchmark reports as a result rather than a crash."""
    return isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc).lower()


def machine() -> dict:
    """What the numbers were measured on; recorded in the JSON and in RESULTS.md."""
    cpu = platform.processor() or platform.machine()
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=5).stdout
        cpu = next((line.split(":", 1)[1].strip() for line in lscpu.splitlines() if line.startswith("Model name")), cpu)
    except (OSError, subprocess.SubprocessError):
        pass
    info = {"cpu": cpu, "cores": os.cpu_count(), "torch": torch.__version__, "python": platform.python_version(),
            "load_avg_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
            "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None}
    try:
        import transformers
        import tokenizers

        info.update(transformers=transformers.__version__, tokenizers=tokenizers.__version__)
    except ImportError:
        pass
    return info


def _fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "tok/s" or (abs(value) >= 1000 and unit not in ("s",)):
        return f"{value:,.0f} {unit}"
    return f"{value:.3g} {unit}" if abs(value) < 100 else f"{value:.0f} {unit}"


def table(rows: list[Row]) -> str:
    """The one table: a Markdown table, so it reads in a terminal and pastes into RESULTS.md unchanged."""
    head = ["section", "case", "tfkit", "baseline", "ratio", "goal", "pass", "note"]
    lines = []
    for r in rows:
        ratio = "-" if r.ratio is None else f"{r.ratio:.2f}x"
        verdict = {None: "", True: "PASS", False: "MISS"}[r.passed]
        lines.append([r.section, r.case, _fmt(r.tfkit, r.unit), _fmt(r.baseline, r.unit), ratio,
                      r.goal.text if r.goal else "", verdict, r.note])
    widths = [max(len(x) for x in col) for col in zip(head, *lines)]
    fmt = lambda cells: "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"  # noqa: E731
    return "\n".join([fmt(head), fmt(["-" * w for w in widths]), *map(fmt, lines)])


def write_json(path: Path, payload: dict) -> None:
    """Results as JSON (NaN/inf written as null so any reader accepts the file)."""

    def clean(x):
        if isinstance(x, float) and not math.isfinite(x):
            return None
        if isinstance(x, dict):
            return {k: clean(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [clean(v) for v in x]
        return x

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(clean(payload), indent=2) + "\n", encoding="utf-8")
