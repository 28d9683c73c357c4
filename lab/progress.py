"""What a running lab shows: a line for each unit of work as it finishes and, for each training while it runs, its
place (training i of n), its step and the time the lab's trainings have left, from the pace of the runs so far.

A training's own output goes to logs/NAME.log, so a lab whose first training takes minutes showed nothing for
as long. Here the lab reads a running training's step from its metrics.jsonl (a row every train.log_every steps,
read with the trainer's reader), a watcher thread polling it every POLL_EVERY seconds. On a terminal each running
training is a bar redrawn in place; off one (a file, CI) it is a plain line when it starts and then every
PLAIN_EVERY seconds. An estimate rests on measured paces only: seconds per step of the trainings this lab
finished, by group (a fine-tuning's pace says nothing about a pretraining's), or a running training's own pace
since its first logged step; a training with no pace to go by is counted, not guessed. Every time comes from the
clock passed in, so the tests run on a fake one."""

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
    anchor: tuple[float, int] | None = None  # (time, step) when its step was first seen past `base`
    shown: float | None = None  # when its last plain line was printed

    def pace(self, now: float) -> float | None:
        """Its own seconds per step since the anchor (its setup and first steps excluded), once it moved on."""
        if self.anchor is None or self.step <= self.anchor[1]:
            return None
        return (now - self.anchor[0]) / (self.step - self.anchor[1])


def time_left(running: list[Training], pending: list[Training], paces: dict[str, float], concurrency: int,
              now: float) -> tuple[float, list[Training]]:
    """(seconds the unfinished trainings need, those of them with no pace to go by). A running training takes
    its own pace, else its group's; a pending one its group's (whole runs: setup and validations included);
    `concurrency` trainings run at a time."""
    work, unknown = 0.0, []
    for t, own in [*((t, t.pace(now)) for t in running), *((t, None) for t in pending)]:
        pace = own or paces.get(group(t.kind))
        if pace is None:
            unknown.append(t)
        else:
            work += (t.steps - max(t.step, t.base)) * pace
    timed = len(running) + len(pending) - len(unknown)
    return work / max(1, min(concurrency, timed)), unknown


def duration(seconds: float) -> str:
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
    if not unknown:
        return f"{head}, about {duration(seconds)}"
    groups = sorted({group(t.kind) for t in unknown})
    return f"{head}, about {duration(seconds)} and {len(unknown)} not yet timed ({' and '.join(groups)})"


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
        self.measured: dict[str, list[tuple[float, int]]] = {}  # group -> (seconds, steps) of finished runs
        self.bars: dict[str, Any] = {}
        self.lock = threading.RLock()
        self.bar = progress_bar(enabled=self.terminal, total=units, unit="job", desc="lab")

    @property
    def total(self) -> int:
        return len(self.pending) + len(self.running) + sum(len(v) for v in self.measured.values())

    def paces(self, now: float) -> dict[str, float]:
        """Seconds per step by group: the finished runs', else the running ones' own."""
        out = {g: sum(s for s, _ in runs) / max(1, sum(n for _, n in runs)) for g, runs in self.measured.items()}
        for t in self.running.values():
            pace = t.pace(now)
            if pace is not None:
                out.setdefault(group(t.kind), pace)
        return out

    def left(self, now: float) -> str:
        running, pending = list(self.running.values()), list(self.pending.values())
        seconds, unknown = time_left(running, pending, self.paces(now), self.concurrency, now)
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
            now = self.clock()
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
                self.poll()

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
                where = f"started at step {t.base} of {t.steps}" if t.base else f"started, {t.steps} steps"
            self.print(f"lab: {self._name(t)}: {where}; {self.left(now)}")
