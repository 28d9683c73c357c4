"""What a running lab shows: a line for each unit of work as it finishes and, for each training while it runs, its
place (training i of n), its step and the time the lab's trainings have left, from the pace of the runs so far.

A training's own output goes to logs/NAME.log, so a lab whose first training takes minutes showed nothing for
as long. Here the lab reads a running training's step from its metrics.jsonl (a row every train.log_every steps,
read with the trainer's reader), a watcher thread polling it every POLL_EVERY seconds. On a terminal each running
training is a bar redrawn in place; off one (a file, CI) it is a plain line when it starts and then every
PLAIN_EVERY seconds. An estimate rests on measured times only (`needs`): a running training's own pace since
its first logged step, the time finished runs of its group with as many steps took, or their seconds per step
(a fine-tuning's pace says nothing about a pretraining's); a training with nothing to go by is counted, not
guessed. Every time comes from the clock passed in, so the tests run on a fake one."""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from ..progress import interactive, progress_bar

POLL_EVERY = 1.0  # seconds between reads of the running trainings' metrics.jsonl
PLAIN_EVERY = 30.0  # seconds between a running training's lines off a terminal


def group(kind: str) -> str:
    """Trainings whose pace predicts each other's: language-model trainings (train, uptrain) and fine-tunings."""
    return "fine-tuning" if kind == "finetune" else "training"


def last_step(run_dir: Path) -> int:
    """The last step a run's metrics.jsonl shows (0 before its first row)."""
    from ..trainer.metrics import read_metrics

    steps = [row["step"] for row in read_metrics(run_dir / "metrics.jsonl") if isinstance(row.get("step"), int)]
    return max(steps, default=0)


@dataclass
class Training:
    """One training of the lab this `lab run` trains, numbered in the order it starts."""
    key: str
    kind: str
    number: int
    steps: int  # train.max_steps: the step it ends at
    run_dir: Path
    base: int = 0  # the step it started from (a continued training's last logged step)
    step: int = 0  # the last step its metrics.jsonl showed
    began: float | None = None  # when it started
    anchor: tuple[float, int] | None = None  # (time, step) when its step was first seen past `base`
    shown: float | None = None  # when its last plain line was printed

    def pace(self, now: float) -> float | None:
        """Its own seconds per step since the anchor (its setup and first steps excluded), once it moved on."""
        if self.anchor is None or self.step <= self.anchor[1]:
            return None
        return (now - self.anchor[0]) / (self.step - self.anchor[1])


Runs = dict[str, list[tuple[float, int]]]  # group -> (seconds, steps trained) of each training it finished


def needs(t: Training, runs: Runs, fallback: float | None, now: float) -> float | None:
    """Seconds training `t` still needs, from measured paces only (None: none to go by): its own pace once it
    has one; else what finished runs of its group with as many steps took (a whole run: setup, validations
    and checkpoints included, which weigh most in a short run), less what it has run; else its group's
    seconds per step over every finished run; else `fallback`, a running training's own pace of its group."""
    todo, own = t.steps - max(t.step, t.base), t.pace(now)
    if own is not None:
        return todo * own
    done = runs.get(group(t.kind), [])
    alike = [seconds for seconds, steps in done if steps == t.steps - t.base]
    if alike:
        return max(0.0, sum(alike) / len(alike) - (now - t.began if t.began is not None else 0.0))
    steps = sum(n for _, n in done)
    pace = sum(s for s, _ in done) / steps if steps else fallback
    return None if pace is None else todo * pace


def time_left(running: list[Training], pending: list[Training], runs: Runs, concurrency: int,
              now: float) -> tuple[float, list[Training]]:
    """(seconds the unfinished trainings need, those of them with nothing to go by), `concurrency` at a time."""
    fallback = {}
    for t in running:
        if t.pace(now) is not None:
            fallback.setdefault(group(t.kind), t.pace(now))
    work, unknown = 0.0, []
    for t in [*running, *pending]:
        seconds = needs(t, runs, fallback.get(group(t.kind)), now)
        if seconds is None:
            unknown.append(t)
        else:
            work += seconds
    timed = len(running) + len(pending) - len(unknown)
    return work / max(1, min(concurrency, timed)), unknown


def duration(seconds: float) -> str:
    if seconds < 1:
        return "under 1 s"
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.1f} min" if seconds < 90 * 60 else f"{seconds / 3600:.1f} h"


def left_words(seconds: float, unknown: list[Training], count: int) -> str:
    """'5 trainings left, about 4.2 min' / '..., about 1 min and 2 fine-tunings not yet timed'."""
    if count == 0:
        return "no training left"
    head = f"{count} training{'s' if count != 1 else ''} left"
    if len(unknown) == count:
        return f"{head}, time unknown until a pace is measured"
    about = duration(seconds) if seconds < 1 else f"about {duration(seconds)}"
    if not unknown:
        return f"{head}, {about}"
    groups = sorted({group(t.kind) for t in unknown})
    return f"{head}, {about} and {len(unknown)} not yet timed ({' and '.join(groups)})"


class LabProgress:
    """The lab's progress lines (module doc): `step` for a finished unit of work, `begin` / `finish` around a
    training and `watch` while trainings run; `trainings` are those this run will train, in order."""

    def __init__(self, units: int, trainings: list[Training], concurrency: int = 1,
                 clock: Callable[[], float] = time.perf_counter, stream: IO[str] | None = None,
                 terminal: bool | None = None) -> None:
        self.units, self.done, self.clock, self.concurrency = units, 0, clock, concurrency
        self.stream = stream or sys.stdout  # taken now: a training's output is redirected to its log later
        self.terminal = interactive() if terminal is None else terminal
        self.pending = {t.key: t for t in trainings}
        self.running: dict[str, Training] = {}
        self.measured: Runs = {}
        self.bars: dict[str, Any] = {}
        self.lock = threading.RLock()
        self.bar = progress_bar(enabled=self.terminal, total=units, unit="job", desc="lab")

    @property
    def total(self) -> int:
        return len(self.pending) + len(self.running) + sum(len(v) for v in self.measured.values())

    def left(self, now: float) -> str:
        running, pending = list(self.running.values()), list(self.pending.values())
        seconds, unknown = time_left(running, pending, self.measured, self.concurrency, now)
        return left_words(seconds, unknown, len(running) + len(pending))

    def print(self, line: str) -> None:
        with self.lock:
            if self.terminal:
                from tqdm.auto import tqdm

                tqdm.write(line, file=self.stream)
            else:
                print(line, file=self.stream, flush=True)

    def step(self, what: str, started: float | None) -> None:
        """A unit of work finished (`started`: when, on this clock), or was found done before (None)."""
        with self.lock:
            self.done += 1
            self.bar.update(1)
            took = "done before" if started is None else f"{self.clock() - started:.1f} s"
            self.print(f"[{self.done:>3}/{self.units}] {what}: {took}")

    def begin(self, key: str) -> None:
        with self.lock:
            t = self.running[key] = self.pending.pop(key)
            t.base = t.step = last_step(t.run_dir)
            now = t.began = self.clock()
            if self.terminal:
                self.bars[key] = progress_bar(total=t.steps, initial=t.base, unit="step", leave=False,
                                              position=len(self.bars) + 1, desc=self._name(t))
            self._show(t, now, force=True)

    def poll(self) -> None:
        """Read each running training's step and show it (a bar, or a plain line when one is due)."""
        with self.lock:
            now = self.clock()
            for t in list(self.running.values()):
                step = last_step(t.run_dir)
                if step != t.step:
                    t.step = step
                    if t.anchor is None and step > t.base:
                        t.anchor = (now, step)
                self._show(t, now)

    def finish(self, key: str, seconds: float) -> None:
        """A training ended after `seconds` (its own measure): its pace counts for those of its group."""
        with self.lock:
            t = self.running.pop(key)
            bar = self.bars.pop(key, None)
            if bar is not None:
                bar.close()
            trained = max(1, t.steps - t.base)
            self.measured.setdefault(group(t.kind), []).append((seconds, trained))
            self.done += 1
            self.bar.update(1)
            self.print(f"[{self.done:>3}/{self.units}] {t.kind} {t.key}: {seconds:.1f} s "
                       f"({seconds / trained:.2f} s a step); {self.left(self.clock())}")

    @contextlib.contextmanager
    def watch(self, every: float = POLL_EVERY) -> Iterator[None]:
        """Poll the running trainings every `every` seconds from a thread until the block ends."""
        stop = threading.Event()

        def loop() -> None:
            while not stop.wait(every):
                try:
                    self.poll()
                except OSError:  # a metrics.jsonl it cannot read now: the next poll tries again
                    continue

        thread = threading.Thread(target=loop, name="lab-progress", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()

    def close(self) -> None:
        for bar in self.bars.values():
            bar.close()
        self.bar.close()

    def _name(self, t: Training) -> str:
        return f"training {t.number}/{self.total} {t.kind} {t.key}"

    def _show(self, t: Training, now: float, force: bool = False) -> None:
        if self.terminal:
            bar = self.bars[t.key]
            bar.n = t.step
            bar.set_postfix_str(self.left(now), refresh=True)
            return
        if force or t.shown is None or now - t.shown >= PLAIN_EVERY:
            t.shown = now
            if t.step > t.base:
                where = f"step {t.step}/{t.steps}"
            else:
                where = f"started at step {t.base} of {t.steps}" if t.base else \
                    f"started, {t.steps} step{'s' if t.steps != 1 else ''}"
            self.print(f"lab: {self._name(t)}: {where}; {self.left(now)}")
