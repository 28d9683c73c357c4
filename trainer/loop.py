"""The training loop: micro-batches → one optimizer update, with every safety net a long run needs.

One update (`state.step` → `state.step + 1`) consumes `train.grad_accum` global micro-batches, numbered
`state.batches, state.batches + 1, ...`; each rank takes its slice of each. Each micro-batch's summed
loss is divided by the token count of the whole global batch (all micro-batches, all ranks; see
objectives.py), so accumulation and data parallelism reproduce the single-batch gradient exactly.

Semantics a resume depends on:
- `state.step` counts *applied* updates; the LR of update n is `lr_at(n)`, a pure function.
- `state.batches` counts micro-batches consumed, including those of skipped updates: a batch that gave a
  NaN is not retried. A skipped update therefore leaves the step and the schedule where they were and
  moves the data on; after `train.max_bad_steps` skips in a row the run stops (`TrainingDiverged`).
- A metrics row is written every `log_every` updates with that update's own loss (not a window mean, so
  a resumed run's rows equal an uninterrupted run's); a skipped attempt is always logged, with
  `"skipped": true` under the step it tried to become.
- SIGINT / SIGTERM set a flag; the loop finishes the update in progress and stops (under torchrun at the
  end of the window in progress, so that every rank stops at the same step), then the caller saves a
  checkpoint.

The host never waits for the device between two reads (STYLE.md 12). Updates run in *windows*: the
attempts from one read to the next, as many as there are updates to the next log row, validation,
checkpoint or the end of the run. Inside a window the device decides everything an update decides: the
loss scale 1 / global token count, whether the loss and the gradient norm are finite, a skipped update's
no-op optimizer step (`_optimizer_step`), the learning rate (the window's schedule, indexed by the
updates applied so far), the bad updates in a row and, past `max_bad_steps`, that nothing more is applied.
Each attempt leaves a record of device numbers; at the end of the window the host reads them all at once
(one `.tolist()`) and `_replay` turns them into the rows and the state the updates produced, exactly
those of an update-by-update loop. A skipped update ends its window short of the boundary; the next
window starts from the true step. Meanwhile a thread prepares the next update's batches
(data.Prefetcher).
"""

from __future__ import annotations

import math
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from ..errors import TfkitError
from ..progress import progress_bar
from .data import Prefetcher
from .distributed import DistInfo, all_reduce_sum
from .objectives import move_batch
from .optim import autocast_context, clip_grad_norm, set_lr
from .parallel import no_grad_sync
from .recipe import Recipe, TrainSection
from .schedules import lr_at

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

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "TrainState":
        return cls(**{k: float(v) if k == "seconds" else int(v) for k, v in data.items()
                      if k in cls.__dataclass_fields__})


@dataclass
class Loop:
    """Everything the loop touches, built by trainer.run (or by a test)."""

    recipe: Recipe
    model: nn.Module  # the bare model (parameters, checkpoints)
    train_module: nn.Module  # LossModule, possibly DDP-/FSDP-wrapped and compiled: forward(batch) -> sums
    optimizer: torch.optim.Optimizer  # fused AdamW (optim.build_optimizer): its step takes a device-side skip
    scaler: torch.amp.GradScaler
    dataset: object  # .batch(i, batch_size, rank, world_size) -> dict of tensors
    info: DistInfo
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

    @property
    def end(self) -> int:
        return self.horizon or self.recipe.train.max_steps

    def __post_init__(self) -> None:
        if not self.optimizer.defaults.get("fused"):
            raise ValueError("the training loop skips non-finite updates inside the optimizer step (found_inf), "
                             "which only the fused AdamW takes: build it with trainer.optim.build_optimizer")


class StopFlag:
    """SIGINT/SIGTERM → finish the current update, checkpoint, exit. A second signal acts immediately."""

    def __init__(self) -> None:
        self.signum = 0
        self._previous: dict[int, object] = {}

    def __enter__(self) -> "StopFlag":
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                self._previous[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread: no handlers, the run cannot be signalled
                pass
        return self

    def _handle(self, signum, frame) -> None:
        self.signum = signum
        signal.signal(signum, self._previous.get(signum, signal.SIG_DFL))  # the second one is not caught

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def micro_batch_size(recipe: Recipe) -> int:
    """Sequences per micro-batch across all ranks (the `batch_size` handed to dataset.batch)."""
    return recipe.train.batch_size // recipe.train.grad_accum


def _finite(x: float) -> bool:
    return math.isfinite(x)


# --- one window of updates, on the device ---------------------------------------------------------------

@dataclass
class Window:
    """The device-side bookkeeping of the update attempts between two host reads."""

    lrs: Tensor  # (n,) float32: lr_at(step + k) for the window's k-th applied update
    applied: Tensor  # () int64: updates applied so far in the window (the index into lrs)
    bad_run: Tensor  # () int64: bad updates in a row, carried in from state.bad_in_a_row
    first_batch: int  # global micro-batch of the window's first attempt
    end: int  # the run's last step as this window sees it (the schedule's horizon)
    records: list[Tensor] = field(default_factory=list)  # per attempt, (7,) float64: see _attempt

    @classmethod
    def open(cls, loop: Loop, n: int) -> "Window":
        """A window of at most n attempts from the current state (just read, so these small copies to the
        device wait for nothing)."""
        r, s, device = loop.recipe, loop.state, loop.info.device
        d_model = loop.model.config.d_model
        lrs = [lr_at(s.step + k, r.schedule, r.optim.lr, loop.end, d_model) for k in range(n)]
        return cls(torch.tensor(lrs, dtype=torch.float32, device=device),
                   torch.zeros((), dtype=torch.int64, device=device),
                   torch.full((), s.bad_in_a_row, dtype=torch.int64, device=device), s.batches, loop.end)


def window_length(step: int, train: TrainSection, end: int | None = None) -> int:
    """Updates from `step` to the next log row, validation, checkpoint or the end of the run (`end`,
    default train.max_steps): the most the loop may run before it reads."""
    every = (train.log_every, train.eval_every, train.save_every)
    return min([(end or train.max_steps) - step] + [n - step % n for n in every])


def _attempt(loop: Loop, window: Window, micro: list[dict[str, Tensor]], counts: Tensor) -> None:
    """One update attempt, every decision taken on the device; its record joins the window's."""
    r, info, device = loop.recipe, loop.info, loop.info.device
    counts = all_reduce_sum(counts.to(device, non_blocking=True), info)  # (2,) predicted, input tokens: all ranks
    scale = (info.world_size / counts[0].clamp(min=1.0)).float()  # DDP averages over ranks: undo it, / count
    sums = torch.zeros(2, dtype=torch.float64, device=device)  # loss sum, correct
    for j, batch in enumerate(micro):
        batch = move_batch(batch, device)
        with no_grad_sync(loop.train_module, skip=j < len(micro) - 1):
            with autocast_context(r.train.precision, device):
                loss_sum, correct, _ = loop.train_module(batch)
            loop.scaler.scale(loss_sum * scale).backward()
        sums[0] += loss_sum.detach()
        sums[1] += correct
    sums = all_reduce_sum(sums, info)
    loop.scaler.unscale_(loop.optimizer)
    norm = clip_grad_norm(loop.model.parameters(), r.optim.grad_clip)  # () float64
    finite_loss = torch.isfinite(sums[0])
    finite = finite_loss & torch.isfinite(norm)
    if r.train.precision == "fp16":
        # Gradients that overflow fp16 at a loss scale >= 1 are not divergence: the scaler halves its scale and
        # the run goes on. Below a scale of 1 they overflow fp16 unscaled, and count as bad steps.
        loss_scale = loop.scaler.scale(torch.ones((), dtype=torch.float64, device=device))  # () the scale
        bad = ~finite & ~(finite_loss & (loss_scale >= 1.0))
    else:
        bad = ~finite
    applied = finite & (window.bad_run < r.train.max_bad_steps)  # nothing more once the run diverged
    lr = window.lrs.index_select(0, window.applied.view(1)).squeeze(0)  # () this update's, with no read
    _optimizer_step(loop.optimizer, lr, skip=~applied)
    window.applied += applied
    window.bad_run = torch.where(applied, 0, window.bad_run + bad)  # an fp16 overflow leaves it as it was
    loop.scaler.update()  # after every unscale_, or the next one raises; a no-op unless fp16
    loop.optimizer.zero_grad(set_to_none=True)
    window.records.append(torch.stack([sums[0], sums[1], counts[0], counts[1], norm, applied.double(),
                                       bad.double()]))  # loss sum, correct, count, tokens, grad norm, applied, bad


def _optimizer_step(optimizer: torch.optim.Optimizer, lr: Tensor, skip: Tensor) -> None:
    """`optimizer.step()` with the learning rate and the skip decided on the device, read by nobody.

    The fused AdamW takes both: a tensor lr, and `found_inf` (what GradScaler hands it), with which the
    kernel leaves parameters, moments and step counts exactly as they were. That is exact and costs
    nothing, where restoring a saved copy of every parameter and moment (`torch.where`) costs three copies
    of the model, and zeroing the gradients is no skip (the moments still decay, AdamW still decays the
    weights). The float lr of the last update is written back by `_replay`."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    optimizer.found_inf = skip.float()
    try:
        optimizer.step()
    finally:
        del optimizer.found_inf


def _run_window(loop: Loop, stop: StopFlag, n: int) -> Window:
    """Up to n update attempts with no read; the next update's batches are prepared during each one.
    One process stops after the update in progress when a signal came; under torchrun every rank goes on
    to the end of the window, where they vote (`_stop_voted`)."""
    r = loop.recipe
    if loop.loader is None:
        loop.loader = Prefetcher(loop.dataset, micro_batch_size(r), r.train.grad_accum, loop.info)
    window = Window.open(loop, n)
    for k in range(n):
        if k and stop.signum and not loop.info.enabled:
            break
        first = window.first_batch + k * r.train.grad_accum
        micro, counts = loop.loader.get(first)
        loop.loader.prefetch(first + r.train.grad_accum)  # the next update's batches, while this one runs
        _attempt(loop, window, micro, counts)
        loop.loader.wait()  # here rather than in the next update: the time is this update's
    return window


def _replay(loop: Loop, window: Window) -> Iterator[dict]:
    """The window's records, read in one `.tolist()` (the read of a log row), replayed in order into the
    metrics rows and the state the updates produced; the caller stops at a divergence."""
    r, s = loop.recipe, loop.state
    lr = None
    for loss_sum, correct, count, tokens, grad_norm, applied, bad in torch.stack(window.records).tolist():
        lr = lr_at(s.step, r.schedule, r.optim.lr, window.end, loop.model.config.d_model)
        loss = loss_sum / max(count, 1.0)
        s.batches += r.train.grad_accum
        s.tokens += int(tokens)
        row = {"step": s.step + 1, "loss": loss, "accuracy": correct / max(count, 1.0), "lr": lr,
               "grad_norm": grad_norm}
        if applied:
            s.step += 1
            s.bad_in_a_row = 0
        elif not bad:
            row.update(skipped=True, reason="fp16 overflow", grad_norm=None)
        else:
            s.bad_steps += 1
            s.bad_in_a_row += 1
            row.update(skipped=True, reason="non-finite loss or gradient norm", bad_steps=s.bad_steps,
                       loss=loss if _finite(loss) else None, grad_norm=grad_norm if _finite(grad_norm) else None)
        yield row
    if lr is not None:
        set_lr(loop.optimizer, lr)  # a float again, as checkpoints record it


def _stop_voted(stop: StopFlag, info: DistInfo) -> bool:
    """Stop before the next window? This process's flag; under torchrun every rank's, summed in one
    collective (a rank that saw no signal still stops, all at the same step)."""
    if not info.enabled:
        return bool(stop.signum)
    return all_reduce_sum(torch.tensor([float(stop.signum)], dtype=torch.float64), info).tolist()[0] > 0


def train_step(loop: Loop, stop: StopFlag) -> dict | None:
    """One update attempt and its metrics row (a window of one, so one read), or None when a stop was
    requested before it began: for callers that drive the updates themselves (benchmarks)."""
    if _stop_voted(stop, loop.info):
        loop.state.interrupted = int(stop.signum) or signal.SIGTERM  # a rank that saw no signal still stops
        return None
    (row,) = _replay(loop, _run_window(loop, stop, 1))
    return row


def run_loop(loop: Loop, last_checkpoint: Callable[[], object] = lambda: None) -> TrainState:
    """Train until `train.max_steps` updates are applied (or the time budget's horizon is reached) or a
    signal arrives; returns the final state.

    Checkpoints every `save_every` updates (the caller saves the final one), validates every
    `eval_every`. Raises TrainingDiverged after `max_bad_steps` consecutive skipped updates."""
    r, s, info = loop.recipe, loop.state, loop.info
    loop.train_module.train()
    loop.optimizer.zero_grad(set_to_none=True)
    loop.horizon = r.train.max_steps
    if loop.budget is not None:
        loop.budget.start(s.step)
    bar = progress_bar(total=r.train.max_steps, initial=s.step, desc="pretrain", unit="step", dynamic_ncols=True,
                       enabled=info.is_main and r.log.progress)
    loop.loader = Prefetcher(loop.dataset, micro_batch_size(r), r.train.grad_accum, info)
    try:
        with StopFlag() as stop, loop.loader:
            loop.loader.prefetch(s.batches)  # the first update's batches, before the clock starts: each
            loop.loader.wait()  # window's time then holds the batches of its updates' successors instead
            _train(loop, stop, bar, last_checkpoint)
    finally:
        loop.loader = None
    bar.close()
    return s


def _train(loop: Loop, stop: StopFlag, bar: tqdm, last_checkpoint: Callable[[], object]) -> None:
    """Windows of updates until the end, a stop or a divergence; their rows, validations, checkpoints."""
    r, s, info = loop.recipe, loop.state, loop.info
    window_tokens, counted, window_start = 0, s.tokens, time.perf_counter()
    unlogged = None  # the last row, when it was not logged: written if the time budget ends the run on it
    while s.step < _plan(loop, bar, info):
        if _stop_voted(stop, info):
            s.interrupted = int(stop.signum) or signal.SIGTERM  # a rank that saw no signal still stops
            return
        reached = False  # did the window end with an applied update, so at its boundary (unless stopped)?
        n = min(window_length(s.step, r.train, loop.end), loop.window_cap)
        for row in _replay(loop, _run_window(loop, stop, n)):
            window_tokens, counted = window_tokens + s.tokens - counted, s.tokens
            reached = not row.get("skipped")
            if not reached:
                loop.log(row)
                _say(bar, f"step {row['step']}: skipped ({row['reason']}; loss={row['loss']}, "
                          f"grad_norm={row['grad_norm']})", info.is_main)
                if s.bad_in_a_row >= r.train.max_bad_steps:
                    bar.close()
                    raise TrainingDiverged(
                        f"training diverged: {s.bad_in_a_row} updates in a row had a non-finite loss or gradient "
                        f"norm (train.max_bad_steps={r.train.max_bad_steps}) at step {s.step}; last good "
                        f"checkpoint: {last_checkpoint() or 'none'}; try a lower optim.lr or optim.grad_clip")
                continue
            bar.update(1)
            unlogged = row
            if s.step % r.train.log_every == 0 or s.step == loop.end:
                unlogged = None
                elapsed = max(time.perf_counter() - window_start, 1e-9)
                row["tokens"] = s.tokens
                row["tokens_per_sec"] = window_tokens / elapsed
                if loop.peak_flops:
                    row["mfu"] = loop.flops_per_token * row["tokens_per_sec"] / (loop.peak_flops * info.world_size)
                window_tokens, window_start = 0, time.perf_counter()
                bar.set_postfix(_postfix(row), refresh=False)
                _say(bar, _log_line(row, loop.end), info.is_main)
                loop.log(row)
        s.seconds = loop.budget.spent() if loop.budget is not None else s.seconds
        if not reached:
            continue
        paused = time.perf_counter()  # validation and checkpoints do not count against tokens/s
        if s.step % r.train.eval_every == 0 and s.step < loop.end:
            val = loop.validate(s.step)
            _say(bar, f"step {s.step}: val_loss {val['val_loss']:.4f}  val_ppl {val['val_ppl']:.2f}  "
                      f"val_acc {val['val_accuracy']:.3f}", info.is_main)
            _took(loop, "validation", paused)
        if s.step % r.train.save_every == 0 and s.step < loop.end:
            saving = time.perf_counter()
            loop.save(s)
            _took(loop, "checkpoint", saving)
        window_start += time.perf_counter() - paused
    if unlogged is not None and s.step == unlogged["step"]:  # the budget ended the run between log rows
        unlogged.update(tokens=s.tokens, tokens_per_sec=window_tokens / max(time.perf_counter() - window_start, 1e-9))
        loop.log(unlogged)


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


def _took(loop: Loop, what: str, since: float) -> None:
    if loop.budget is not None:
        loop.budget.took(what, time.perf_counter() - since)


def _postfix(row: dict) -> dict:
    out = {"loss": f"{row['loss']:.3f}", "lr": f"{row['lr']:.2e}", "tok/s": f"{row['tokens_per_sec']:.0f}"}
    if "mfu" in row:
        out["mfu"] = f"{100 * row['mfu']:.1f}%"
    return out


def _log_line(row: dict, max_steps: int) -> str:
    line = (f"step {row['step']}/{max_steps}  loss {row['loss']:.4f}  acc {row['accuracy']:.3f}  "
            f"lr {row['lr']:.3e}  gnorm {row['grad_norm']:.3f}  {row['tokens_per_sec']:.0f} tok/s")
    return line + (f"  mfu {100 * row['mfu']:.1f}%" if "mfu" in row else "")


def _say(bar: tqdm, text: str, main: bool) -> None:
    """A log line from rank 0, above the progress bar when there is one."""
    if main:
        (print if bar.disable else bar.write)(text)
