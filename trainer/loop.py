"""The training loop: updates until the end of the run, with every safety net a long run needs.

One update (`state.step` → `state.step + 1`, `step.train_step`) consumes `train.grad_accum` global
micro-batches, numbered `state.batches, state.batches + 1, ...`; each rank takes its slice of each.

Semantics a resume depends on:
- `state.step` counts *applied* updates; the LR of update n is `lr_at(n)`, a pure function.
- `state.batches` counts micro-batches consumed, including those of skipped updates: a batch that gave a
  NaN is not retried. A skipped update therefore leaves the step and the schedule where they were and
  moves the data on; after `train.max_bad_steps` skips in a row the run stops (`TrainingDiverged`).
- A metrics row is written every `log_every` updates with that update's own loss and accuracy, and their
  means over the updates since the previous row (`loss_mean`, `accuracy_mean`, what the printed line shows:
  one batch's accuracy jumps about); the sums behind the means are part of the state a checkpoint keeps, so
  a resumed run's rows equal an uninterrupted run's. A skipped attempt is always logged, with
  `"skipped": true` under the step it tried to become.
- SIGINT / SIGTERM / SIGUSR1 set a flag; the loop finishes the update in progress and stops (under torchrun at
  the end of the window in progress, so that every rank stops at the same step), then the caller saves a
  checkpoint.

The step itself, and the windows of updates between two reads of the device, are in step.py; this module
turns the windows' rows into log lines, validations and checkpoints.
"""

from __future__ import annotations

import contextlib
import math
import signal
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING

import torch
from torch import nn

from ..errors import TfkitError
from ..progress import progress_bar
from .batch_plan import BatchPlan, plan_batches
from .data import Prefetcher
from .distributed import DistInfo, all_reduce_sum
from .metrics import mfu, peak_flops
from .optim import set_lr
from .recipe import Recipe
from .schedules import lr_at
from .step import Update, Window, micro_batch_size, train_step, window_length
from .validation import source_summary

if TYPE_CHECKING:
    from tqdm import tqdm  # the type of the bars progress_bar makes

    from .budget import TimeBudget


class TrainingDiverged(TfkitError):
    """Too many consecutive updates had a non-finite loss or gradient norm."""


@dataclass
class TrainState:
    step: int = 0  # optimizer updates applied
    batches: int = 0  # global micro-batches consumed (index of the next one)
    tokens: int = 0  # input tokens consumed, all ranks
    bad_steps: int = 0  # skipped updates (non-finite loss or gradient norm), in total
    bad_in_a_row: int = 0  # ... consecutively, up to now
    interrupted: int = 0  # signal number that stopped the run (0 = none)
    seconds: float = 0.0  # training time spent, all starts of the run (what train.max_time counts)
    micro_rows: int = 0  # sequences each process computed at once (batch_plan): kept by a resume on another count
    # the updates applied since the last log row: loss sum, correct and predicted tokens, for the row's running
    # means (`loss_mean`, `accuracy_mean`: one batch's accuracy jumps about); kept in checkpoints like the rest
    since_log_loss: float = 0.0
    since_log_correct: float = 0.0
    since_log_count: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "TrainState":
        floats = {f.name for f in fields(cls) if f.type in ("float", float)}
        return cls(**{k: float(v) if k in floats else int(v) for k, v in data.items()
                      if k in cls.__dataclass_fields__})

    def means(self) -> dict[str, float]:
        """The loss and accuracy over the predicted tokens of the updates since the last log row."""
        count = max(self.since_log_count, 1.0)
        return {"loss_mean": self.since_log_loss / count, "accuracy_mean": self.since_log_correct / count}


def mfu_basis(model: nn.Module, recipe: Recipe, device: torch.device) -> dict[str, float | None]:
    """The Loop's `flops_per_token` and `peak_flops` (None off CUDA: MFU not reported). A seq2seq model
    counts the FLOPs of a (source, target) token pair; the loop counts both tokens."""
    per_token = model.flops_per_token(recipe.data.seq_len)
    if recipe.objective.name == "seq2seq":
        per_token /= 2
    peak = peak_flops(torch.cuda.get_device_name(device), recipe.train.precision) if device.type == "cuda" else None
    return {"flops_per_token": per_token, "peak_flops": peak}


@dataclass
class Loop:
    """What a run owns across its updates, built by trainer.run (or by a test): the recipe (schedule, when to
    log, validate and save), the data, where rows, checkpoints and validations go, the state, the time budget;
    and `update`, what each update computes with (step.train_step's inputs)."""

    recipe: Recipe
    update: Update
    dataset: object  # .batch(i, batch_size, rank, world_size) -> dict of tensors
    log: Callable[[dict], None]  # metrics row sink (rank 0 writes, others drop)
    save: Callable[[TrainState], object]  # write a checkpoint of the current state
    validate: Callable[[int], dict]  # step -> validation row (already logged by the callee)
    flops_per_token: float = 0.0
    peak_flops: float | None = None  # per device; None = MFU not reported
    state: TrainState = field(default_factory=TrainState)
    loader: Prefetcher | None = field(default=None, repr=False)  # made by the first update, closed by run_loop
    budget: TimeBudget | None = None  # train.max_time: sets `horizon` from the pace of the updates
    horizon: int = 0  # the step the run ends at: train.max_steps, or what the time budget leaves
    window_cap: int = 1 << 62  # the most updates before the next read: the time budget's, else no limit
    batch_plan: BatchPlan | None = None  # how an update's rows are split over processes; None = the recipe's

    @property
    def plan(self) -> BatchPlan:
        return self.batch_plan or plan_batches(self.recipe.train.batch_size, self.recipe.train.grad_accum,
                                               self.info.world_size)

    @property
    def end(self) -> int:
        return self.horizon or self.recipe.train.max_steps

    @property
    def info(self) -> DistInfo:
        return self.update.info


STOPPING = ("stopping: finishing the update in progress, then saving a checkpoint and exiting (under a load this "
            "takes seconds); a second Ctrl-C stops at once, and the last checkpoint stays whole")


class StopFlag:
    """SIGINT / SIGTERM / SIGUSR1 → finish the current update, checkpoint, exit (with 128 + the signal, which
    tells a requeue script that the run is unfinished). SIGTERM and SIGUSR1 are a scheduler's warning before
    it stops the job (Slurm's `--signal=USR1@120`, a cloud's preemption notice): sent again, or by both srun and
    torchrun, they change nothing, the save goes on. A second Ctrl-C acts immediately (every file is written
    under a temporary name first, so what was saved stays whole). With `say`, the first signal is answered at
    once on stderr: the update in progress and the save can take seconds, and silence after a Ctrl-C reads as
    a hang."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)

    def __init__(self, say: bool = False) -> None:
        self.signum, self.say = 0, say
        self._previous: dict[int, object] = {}

    def __enter__(self) -> "StopFlag":
        for sig in self.SIGNALS:
            try:
                self._previous[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread: no handlers, the run cannot be signalled
                pass
        return self

    def _handle(self, signum, frame) -> None:
        if self.signum:
            if signum == signal.SIGINT:  # a second Ctrl-C: whatever handled it before the run does, at once
                previous = self._previous.get(signum)
                if callable(previous):
                    previous(signum, frame)
                elif previous != signal.SIG_IGN:
                    raise KeyboardInterrupt
            return  # a scheduler's repeated warning: the save it asked for is under way
        self.signum = signum
        if self.say:
            print(f"\n{STOPPING}", file=sys.stderr, flush=True)

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def stop_voted(stop: StopFlag, info: DistInfo) -> bool:
    """Stop before the next window? This process's flag; under torchrun every rank's, summed in one
    collective (a rank that saw no signal still stops, all at the same step)."""
    if not info.enabled:
        return bool(stop.signum)
    return all_reduce_sum(torch.tensor([float(stop.signum)], dtype=torch.float64), info).tolist()[0] > 0


def run_loop(loop: Loop, last_checkpoint: Callable[[], object] = lambda: None) -> TrainState:
    """Train until `train.max_steps` updates are applied (or the time budget's horizon is reached) or a
    signal arrives; returns the final state.

    Checkpoints every `save_every` updates (the caller saves the final one), validates every
    `eval_every`. Raises TrainingDiverged after `max_bad_steps` consecutive skipped updates."""
    r, s, info = loop.recipe, loop.state, loop.info
    loop.update.train_module.train()
    loop.update.optimizer.zero_grad(set_to_none=True)
    loop.horizon = r.train.max_steps
    if loop.budget is not None:
        loop.budget.start(s.step)
    bar = progress_bar(total=r.train.max_steps, initial=s.step, desc="pretrain", unit="step", dynamic_ncols=True,
                       enabled=info.is_main and r.log.progress)
    loop.loader = Prefetcher(loop.dataset, loop.plan, info)
    try:
        with StopFlag(say=info.is_main) as stop, loop.loader:
            loop.loader.prefetch(s.batches)  # the first update's batches, before the clock starts: each
            loop.loader.wait()  # window's time then holds the batches of its updates' successors instead
            _train(loop, stop, bar, last_checkpoint)
    finally:
        loop.loader = None
    bar.close()
    return s


def _train(loop: Loop, stop: StopFlag, bar: tqdm, last_checkpoint: Callable[[], object]) -> None:
    """Windows of updates until the end, a stop or a divergence; their rows, validations, checkpoints."""
    s, info = loop.state, loop.info
    pace = Pace(s.tokens)
    unlogged = None  # the last row, when it was not logged: written if the time budget ends the run on it
    while s.step < _plan(loop, bar, info):
        if stop_voted(stop, info):
            s.interrupted = int(stop.signum) or signal.SIGTERM  # a rank that saw no signal still stops
            return
        reached = False  # did the window end with an applied update, so at its boundary (unless stopped)?
        for row in replay(loop, run_window(loop, stop, _next_window(loop))):
            reached = not row.get("skipped")
            if not reached:
                _skipped(loop, row, bar, last_checkpoint)
                continue
            bar.update(1)
            unlogged = row
            if s.step % loop.recipe.train.log_every == 0 or s.step == loop.end:
                unlogged = None
                _log_row(loop, row, pace, bar)
                s.since_log_loss = s.since_log_correct = s.since_log_count = 0.0
        s.seconds = loop.budget.spent() if loop.budget is not None else s.seconds
        if reached:
            _validate_and_save(loop, pace, bar)
    if unlogged is not None and s.step == unlogged["step"]:  # the budget ended the run between log rows
        loop.log(dict(unlogged, tokens=s.tokens, tokens_per_sec=pace.rate(s.tokens)))


class Pace:
    """Tokens per second since the last log row, validations and checkpoints left out."""

    def __init__(self, tokens: int) -> None:
        self.tokens, self.since = tokens, time.perf_counter()

    def rate(self, tokens: int) -> float:
        return (tokens - self.tokens) / max(time.perf_counter() - self.since, 1e-9)

    def restart(self, tokens: int) -> None:
        self.tokens, self.since = tokens, time.perf_counter()

    def pause(self, seconds: float) -> None:
        self.since += seconds


def _next_window(loop: Loop) -> int:
    """Updates until the next read: the next log row, validation, checkpoint or end, within the budget's cap."""
    n = min(window_length(loop.state.step, loop.recipe.train, loop.end), loop.window_cap)
    if loop.budget is not None:
        n = min(n, max(1, loop.budget.next_validation(loop.end) - loop.state.step))
    return n


def _skipped(loop: Loop, row: dict, bar: tqdm, last_checkpoint: Callable[[], object]) -> None:
    """Log a skipped update; past train.max_bad_steps in a row, stop the run."""
    s, r = loop.state, loop.recipe
    loop.log(row)
    _say(bar, f"step {row['step']}: skipped ({row['reason']}; loss={row['loss']}, grad_norm={row['grad_norm']})",
         loop.info.is_main)
    if s.bad_in_a_row >= r.train.max_bad_steps:
        bar.close()
        raise TrainingDiverged(
            f"training diverged: {s.bad_in_a_row} updates in a row had a non-finite loss or gradient norm "
            f"(train.max_bad_steps={r.train.max_bad_steps}) at step {s.step}; last good checkpoint: "
            f"{last_checkpoint() or 'none'}; try a lower optim.lr or optim.grad_clip")


def _log_row(loop: Loop, row: dict, pace: Pace, bar: tqdm) -> None:
    """A training row with its throughput (and MFU on a known GPU): metrics, console, progress bar."""
    row.update(tokens=loop.state.tokens, tokens_per_sec=pace.rate(loop.state.tokens))
    utilisation = mfu(loop.flops_per_token, row["tokens_per_sec"], loop.peak_flops, loop.info.world_size)
    if utilisation is not None:
        row["mfu"] = utilisation
    pace.restart(loop.state.tokens)
    bar.set_postfix(_postfix(row), refresh=False)
    _say(bar, _log_line(row, loop.end), loop.info.is_main)
    loop.log(row)


def _validate_and_save(loop: Loop, pace: Pace, bar: tqdm) -> None:
    """The validation and checkpoint due at this step (the run's last ones are the caller's); their time
    is left out of tokens/s and, under a time budget, reserved for the end of the run."""
    s, train = loop.state, loop.recipe.train
    paused = time.perf_counter()
    spaced = loop.budget is not None and loop.budget.validation_due(s.step, loop.end)
    if s.step < loop.end and (s.step % train.eval_every == 0 or spaced):
        with _timing(loop, "validation"):
            val = loop.validate(s.step)
        shown = (f"val_loss {val['val_loss']:.4f}  val_ppl {val['val_ppl']:.2f}  val_acc {val['val_accuracy']:.3f}"
                 if "val_ppl" in val else  # a fine-tuning run's row: its task scores (trainer/task.py)
                 "  ".join(f"{k} {v:.4f}" for k, v in val.items() if k.startswith("val_") and k != "val_examples"))
        shown += "".join(f"  {k.removeprefix('task/')} {v:.3f}" for k, v in val.items() if k.startswith("task/"))
        _say(bar, f"step {s.step}: {shown}{source_summary(val)}", loop.info.is_main)
    if s.step % train.save_every == 0 and s.step < loop.end:
        with _timing(loop, "checkpoint"):
            loop.save(s)
    pace.pause(time.perf_counter() - paused)


def _plan(loop: Loop, bar: tqdm, info: DistInfo) -> int:
    """The step the run ends at and the longest next window, re-estimated from the time budget before each
    window (short windows until the pace is known); the same on every rank (rank 0's, shared), or the
    ranks' collectives would part. The progress bar's total follows the horizon."""
    if loop.budget is None:
        return loop.end
    plan = [loop.budget.horizon(loop.state.step, loop.recipe.train.max_steps), loop.budget.window_cap(loop.state.step)]
    if info.enabled:
        shared = torch.tensor([float(v) if info.is_main else 0.0 for v in plan], dtype=torch.float64,
                              device=info.device)
        plan = [int(v) for v in all_reduce_sum(shared, info).tolist()]
    horizon, loop.window_cap = plan
    if horizon != loop.horizon:
        loop.horizon = bar.total = horizon
        bar.refresh()
    return horizon


def _timing(loop: Loop, what: str) -> contextlib.AbstractContextManager:
    """Under a time budget, the validation or checkpoint inside is timed on the budget's clock (the end of
    the run will need as long); without one, nothing."""
    return loop.budget.timing(what) if loop.budget is not None else contextlib.nullcontext()


def _postfix(row: dict) -> dict:
    out = {"loss": f"{row['loss']:.3f}", "lr": f"{row['lr']:.2e}", "tok/s": f"{row['tokens_per_sec']:.0f}"}
    if "mfu" in row:
        out["mfu"] = f"{100 * row['mfu']:.1f}%"
    return out


def _log_line(row: dict, max_steps: int) -> str:
    line = (f"step {row['step']}/{max_steps}  loss {row['loss_mean']:.4f}  acc {row['accuracy_mean']:.3f}  "
            f"lr {row['lr']:.3e}  gnorm {row['grad_norm']:.3f}  {row['tokens_per_sec']:.0f} tok/s")
    return line + (f"  mfu {100 * row['mfu']:.1f}%" if "mfu" in row else "")


def _say(bar: tqdm, text: str, main: bool) -> None:
    """A log line from rank 0, above the progress bar when there is one."""
    if main:
        (print if bar.disable else bar.write)(text)


# --- windows of updates between two host reads (step.py) ------------------------------------------------------

def run_window(loop: Loop, stop: StopFlag, n: int) -> Window:
    """Up to n update attempts with no read; the next update's batches are prepared during each one.
    One process stops after the update in progress when a signal came; under torchrun every rank goes on
    to the end of the window, where they vote (loop.stop_voted)."""
    grad_accum = loop.recipe.train.grad_accum
    if loop.loader is None:
        loop.loader = Prefetcher(loop.dataset, loop.plan, loop.info)
    r, s, d_model = loop.recipe, loop.state, loop.update.model.config.d_model  # d_model: the noam schedule's scale
    lrs = [lr_at(s.step + k, r.schedule, r.optim.lr, loop.end, d_model) for k in range(n)]
    window = Window.new(lrs, s.bad_in_a_row, s.batches, loop.end, loop.info.device)
    for k in range(n):
        if k and stop.signum and not loop.info.enabled:
            break
        first = window.first_batch + k * grad_accum
        micro, counts = loop.loader.get(first)
        loop.loader.prefetch(first + grad_accum)  # the next update's batches, while this one runs
        train_step(loop.update, window, micro, counts)
        loop.loader.wait()  # here rather than in the next update: the time is this update's
    return window



def replay(loop: Loop, window: Window) -> Iterator[dict]:
    """The window's records, read in one `.tolist()`, replayed in order into the metrics rows and the
    state the updates produced; the caller stops at a divergence. A skipped attempt's row carries
    `"skipped": true` under the step it tried to become, and null for a non-finite loss or norm."""
    r, s = loop.recipe, loop.state
    for loss_sum, correct, count, tokens, grad_norm, applied, bad in torch.stack(window.records).tolist():
        loss = loss_sum / max(count, 1.0)
        row = {"step": s.step + 1, "loss": loss, "accuracy": correct / max(count, 1.0),
               "lr": lr_at(s.step, r.schedule, r.optim.lr, window.end, loop.update.model.config.d_model),
               "grad_norm": grad_norm}
        s.batches += r.train.grad_accum
        s.tokens += int(tokens)
        set_lr(loop.update.optimizer, row["lr"])  # a float again, as checkpoints record it
        if applied:
            s.step, s.bad_in_a_row = s.step + 1, 0
            s.since_log_loss, s.since_log_correct = s.since_log_loss + loss_sum, s.since_log_correct + correct
            s.since_log_count += count
            row.update(s.means())
        elif not bad:
            row.update(skipped=True, reason="fp16 overflow", grad_norm=None)
        else:
            s.bad_steps, s.bad_in_a_row = s.bad_steps + 1, s.bad_in_a_row + 1
            row.update(skipped=True, reason="non-finite loss or gradient norm", bad_steps=s.bad_steps,
                       loss=loss if math.isfinite(loss) else None,
                       grad_norm=grad_norm if math.isfinite(grad_norm) else None)
        yield row

