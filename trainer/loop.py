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
- SIGINT / SIGTERM set a flag; the loop finishes the update in progress, and every rank stops at the same
  step (the flag travels with the per-step all-reduce), then the caller saves a checkpoint.
"""

from __future__ import annotations

import math
import signal
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import nn

from ..errors import TfkitError
from ..progress import progress_bar
from .distributed import DistInfo, all_reduce_sum
from .objectives import count_inputs, count_targets, move_batch
from .optim import autocast_context, clip_grad_norm, set_lr
from .parallel import no_grad_sync
from .recipe import Recipe
from .schedules import lr_at

if TYPE_CHECKING:
    from tqdm import tqdm  # the type of the bars progress_bar makes


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

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "TrainState":
        return cls(**{k: int(v) for k, v in data.items() if k in cls.__dataclass_fields__})


@dataclass
class Loop:
    """Everything the loop touches, built by trainer.run (or by a test)."""

    recipe: Recipe
    model: nn.Module  # the bare model (parameters, checkpoints)
    train_module: nn.Module  # LossModule, possibly DDP-/FSDP-wrapped and compiled: forward(batch) -> sums
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    dataset: object  # .batch(i, batch_size, rank, world_size) -> dict of tensors
    info: DistInfo
    log: Callable[[dict], None]  # metrics row sink (rank 0 writes, others drop)
    save: Callable[[TrainState], object]  # write a checkpoint of the current state
    validate: Callable[[int], dict]  # step -> validation row (already logged by the callee)
    flops_per_token: float = 0.0
    peak_flops: float | None = None  # per device; None = MFU not reported
    state: TrainState = field(default_factory=TrainState)


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


def train_step(loop: Loop, stop: StopFlag) -> dict | None:
    """One update attempt. Returns its metrics row, or None when a stop was requested before it began."""
    r, s, info = loop.recipe, loop.state, loop.info
    accum = r.train.grad_accum
    micro = [loop.dataset.batch(s.batches + j, micro_batch_size(r), info.rank, info.world_size) for j in range(accum)]
    local_count = sum(count_targets(b) for b in micro)
    global_count, stop_votes = all_reduce_sum(torch.tensor([local_count, stop.signum], dtype=torch.float64),
                                              info).tolist()
    if stop_votes:
        s.interrupted = int(stop.signum) or signal.SIGTERM  # a rank that saw no signal still stops
        return None
    lr = lr_at(s.step, r.schedule, r.optim.lr, r.train.max_steps, loop.model.config.d_model)
    set_lr(loop.optimizer, lr)
    scale = info.world_size / max(global_count, 1.0)  # DDP averages over ranks; undo that, divide by count
    # Running sums stay on the device: reading a value (float(x)) waits for the GPU to drain, and one such
    # wait per micro-batch would leave the GPU idle while the next one is prepared and launched.
    stats = torch.zeros(3, dtype=torch.float64, device=info.device)  # loss sum, correct, input tokens
    stats[2] = sum(count_inputs(b) for b in micro)  # known on the host already
    for j, batch in enumerate(micro):
        batch = move_batch(batch, info.device)
        with no_grad_sync(loop.train_module, skip=j < accum - 1):
            with autocast_context(r.train.precision, info.device):
                loss_sum, correct, _ = loop.train_module(batch)
            loop.scaler.scale(loss_sum * scale).backward()
        stats[0] += loss_sum.detach()
        stats[1] += correct
    stats = all_reduce_sum(stats, info)
    loop.scaler.unscale_(loop.optimizer)
    norm = clip_grad_norm(loop.model.parameters(), r.optim.grad_clip)
    loss_sum, correct, tokens, grad_norm = torch.cat([stats, norm.reshape(1)]).tolist()  # the one read per update
    loss = loss_sum / max(global_count, 1.0)
    s.batches += accum
    s.tokens += int(tokens)
    row = {"step": s.step + 1, "loss": loss, "accuracy": correct / max(global_count, 1.0), "lr": lr,
           "grad_norm": grad_norm}
    if _finite(loss) and _finite(grad_norm):
        loop.scaler.step(loop.optimizer)
        s.step += 1
        s.bad_in_a_row = 0
    elif r.train.precision == "fp16" and _finite(loss) and loop.scaler.get_scale() >= 1.0:
        # An fp16 overflow: the scaler halves its scale and the run goes on; nothing diverged. Below a
        # scale of 1 the gradients overflow fp16 unscaled, and overflows count as bad steps.
        row.update(skipped=True, reason="fp16 overflow", grad_norm=None)
    else:
        s.bad_steps += 1
        s.bad_in_a_row += 1
        row.update(skipped=True, reason="non-finite loss or gradient norm", bad_steps=s.bad_steps,
                   loss=loss if _finite(loss) else None, grad_norm=grad_norm if _finite(grad_norm) else None)
    loop.scaler.update()  # after every unscale_, or the next one raises; a no-op unless fp16
    loop.optimizer.zero_grad(set_to_none=True)
    return row


def run_loop(loop: Loop, last_checkpoint: Callable[[], object] = lambda: None) -> TrainState:
    """Train until `train.max_steps` updates are applied or a signal arrives; returns the final state.

    Checkpoints every `save_every` updates (the caller saves the final one), validates every
    `eval_every`. Raises TrainingDiverged after `max_bad_steps` consecutive skipped updates."""
    r, s, info = loop.recipe, loop.state, loop.info
    loop.train_module.train()
    loop.optimizer.zero_grad(set_to_none=True)
    bar = progress_bar(total=r.train.max_steps, initial=s.step, desc="pretrain", unit="step", dynamic_ncols=True,
                       enabled=info.is_main and r.log.progress)
    window_tokens, window_start = 0, time.perf_counter()
    with StopFlag() as stop:
        while s.step < r.train.max_steps:
            tokens_before = s.tokens
            row = train_step(loop, stop)
            if row is None:
                break
            window_tokens += s.tokens - tokens_before
            if row.get("skipped"):
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
            if s.step % r.train.log_every == 0 or s.step == r.train.max_steps:
                elapsed = max(time.perf_counter() - window_start, 1e-9)
                row["tokens"] = s.tokens
                row["tokens_per_sec"] = window_tokens / elapsed
                if loop.peak_flops:
                    row["mfu"] = loop.flops_per_token * row["tokens_per_sec"] / (loop.peak_flops * info.world_size)
                window_tokens, window_start = 0, time.perf_counter()
                bar.set_postfix(_postfix(row), refresh=False)
                _say(bar, _log_line(row, r.train.max_steps), info.is_main)
                loop.log(row)
            paused = time.perf_counter()  # validation and checkpoints do not count against tokens/s
            if s.step % r.train.eval_every == 0 and s.step < r.train.max_steps:
                val = loop.validate(s.step)
                _say(bar, f"step {s.step}: val_loss {val['val_loss']:.4f}  val_ppl {val['val_ppl']:.2f}  "
                          f"val_acc {val['val_accuracy']:.3f}", info.is_main)
            if s.step % r.train.save_every == 0 and s.step < r.train.max_steps:
                loop.save(s)
            window_start += time.perf_counter() - paused
    bar.close()
    return s


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
