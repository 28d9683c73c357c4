"""The training step, `train_step`: one optimizer update from its micro-batches, decided on the device.

How a window works. The host never waits for the device between two log rows (STYLE.md 12), so updates
run in *windows*: the update attempts from one host read to the next, as many as there are updates to the
next log row, validation, checkpoint or the end of the run (`window_length`). `Window.new` copies to the
device what the window needs from the host (the learning rates of its next updates and the bad updates in
a row so far); `train_step` then decides everything an update decides on the device: the loss scale
1 / global token count, whether loss and gradient norm are finite, the skip of a non-finite update inside
the fused AdamW (`found_inf`), this update's learning rate (indexed by the updates applied so far in the
window) and, past `train.max_bad_steps` bad updates in a row, that nothing more is applied. Each attempt
appends a record of seven device numbers (loss sum, correct, predicted tokens, input tokens, grad norm,
applied, bad). At the window's end `replay` (loop.py, which runs the windows) reads all records in one `.tolist()` and turns them, in order,
into the metrics rows and the state (step, batches, tokens, skips) exactly as an update-by-update loop
would have produced them. A skipped update ends its window short of the boundary; the next window starts
from the true step. Meanwhile a thread prepares the next update's batches (data.Prefetcher).

One update consumes `train.grad_accum` global micro-batches; each micro-batch's summed loss is divided by
the token count of the whole global batch (all micro-batches, all ranks; see objectives.py), so
accumulation and data parallelism reproduce the single-batch gradient exactly.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from .distributed import DistInfo, all_reduce_sum
from .objectives import move_batch
from .optim import autocast_context, clip_grad_norm
from .parallel import no_grad_sync
from .recipe import Recipe, TrainSection


@dataclass
class Update:
    """What one update computes with, `train_step`'s real inputs; the rest of a run (data, schedule, logging,
    checkpoints, time budget) is the loop's (loop.Loop).

    The loss: `train_module` is objectives.LossModule (DDP- or FSDP-wrapped and compiled as the recipe says),
    whose forward is `objectives.compute_loss(model, batch, objective)`, which dispatches to the objective's own
    function (`clm_loss`, `mlm_loss`, `seq2seq_loss`, `task_loss`): three calls from `train_step`."""

    train_module: nn.Module  # forward(batch) -> (loss sum, correct, predicted tokens)
    model: nn.Module  # the bare model: the parameters clipped and stepped
    optimizer: torch.optim.Optimizer  # fused AdamW (optim.build_optimizer): its step takes a device-side skip
    scaler: torch.amp.GradScaler
    info: DistInfo  # the ranks losses and token counts are summed over
    precision: str  # fp32 | bf16 | fp16: the autocast, and for fp16 which overflows count as bad
    grad_clip: float | None
    max_bad_steps: int  # bad updates in a row after which nothing more is applied

    def __post_init__(self) -> None:
        if not self.optimizer.defaults.get("fused"):
            raise ValueError("the training step skips non-finite updates inside the optimizer step (found_inf), "
                             "which only the fused AdamW takes: build it with trainer.optim.build_optimizer")

    @functools.cached_property
    def float_lr(self) -> bool:
        """Whether the learning rate goes to the optimizer as a Python float: for FSDP2's sharded parameters
        (DTensors). torch 2.13 has no meta kernel for the fused AdamW that takes a tensor lr, so DTensor's
        sharding propagation runs it on real zero tensors of the parameters' *global* shapes at the first
        update: parameters, gradients and both moments of the whole model, 4x its size, on every rank (a
        307M GPT on 4 CPU processes was killed for memory there). The float costs one read of the window's
        applied-update count per update, which on a CPU waits for nothing."""
        return any(hasattr(p, "_local_tensor") for p in self.model.parameters())

    @classmethod
    def of(cls, recipe: Recipe, model: nn.Module, train_module: nn.Module, optimizer: torch.optim.Optimizer,
           scaler: torch.amp.GradScaler, info: DistInfo) -> Update:
        """The update a recipe's run makes."""
        return cls(train_module, model, optimizer, scaler, info, recipe.train.precision, recipe.optim.grad_clip,
                   recipe.train.max_bad_steps)


@dataclass
class Window:
    """The device-side bookkeeping of the update attempts between two host reads."""

    lrs: Tensor  # (n,) float32: lr_at(step + k) for the window's k-th applied update
    host_lrs: list[float]  # the same on the host (Update.float_lr)
    applied: Tensor  # () int64: updates applied so far in the window (the index into lrs)
    bad_run: Tensor  # () int64: bad updates in a row, carried in from state.bad_in_a_row
    first_batch: int  # global micro-batch of the window's first attempt
    end: int  # the run's last step as this window sees it (the schedule's horizon)
    records: list[Tensor] = field(default_factory=list)  # per attempt, (7,) float64: see train_step

    @classmethod
    def new(cls, lrs: list[float], bad_in_a_row: int, first_batch: int, end: int, device: torch.device) -> Window:
        """A window whose k-th applied update takes `lrs[k]`, from the state just read (so these small copies to
        the device wait for nothing)."""
        return cls(torch.tensor(lrs, dtype=torch.float32, device=device), list(lrs),
                   torch.zeros((), dtype=torch.int64, device=device),
                   torch.full((), bad_in_a_row, dtype=torch.int64, device=device), first_batch, end)


def window_length(step: int, train: TrainSection, end: int | None = None) -> int:
    """Updates from `step` to the next log row, validation, checkpoint or the end of the run (`end`,
    default train.max_steps): the most the loop may run before it reads."""
    every = (train.log_every, train.eval_every, train.save_every)
    return min([(end or train.max_steps) - step] + [n - step % n for n in every])


def train_step(update: Update, window: Window, micro: list[dict[str, Tensor]], counts: Tensor) -> None:
    """One update attempt from the micro-batches of one global batch (`counts`: (2,) predicted and input
    tokens of this rank's share), every decision taken on the device; its record joins the window's."""
    u, info, device = update, update.info, update.info.device
    counts = all_reduce_sum(counts.to(device, non_blocking=True), info)  # (2,) predicted, input tokens: all ranks
    scale = (info.world_size / counts[0].clamp(min=1.0)).float()  # DDP averages over ranks: undo it, / count
    sums = torch.zeros(2, dtype=torch.float64, device=device)  # loss sum, correct
    for j, batch in enumerate(micro):
        batch = move_batch(batch, device)
        with no_grad_sync(u.train_module, skip=j < len(micro) - 1):
            with autocast_context(u.precision, device):
                loss_sum, correct, _ = u.train_module(batch)  # objectives.compute_loss, under the wrappers
            u.scaler.scale(loss_sum * scale).backward()
        sums[0] += loss_sum.detach()
        sums[1] += correct
    sums = all_reduce_sum(sums, info)
    u.scaler.unscale_(u.optimizer)
    norm = clip_grad_norm(u.model.parameters(), u.grad_clip)  # () float64
    finite_loss = torch.isfinite(sums[0])
    finite = finite_loss & torch.isfinite(norm)
    if u.precision == "fp16":
        # Gradients that overflow fp16 at a loss scale >= 1 are not divergence: the scaler halves its scale and
        # the run goes on. Below a scale of 1 they overflow fp16 unscaled, and count as bad steps.
        loss_scale = u.scaler.scale(torch.ones((), dtype=torch.float64, device=device))  # () the scale
        bad = ~finite & ~(finite_loss & (loss_scale >= 1.0))
    else:
        bad = ~finite
    applied = finite & (window.bad_run < u.max_bad_steps)  # nothing more once the run diverged
    if u.float_lr:
        lr = window.host_lrs[min(int(window.applied), len(window.host_lrs) - 1)]
    else:
        lr = window.lrs.index_select(0, window.applied.view(1)).squeeze(0)  # () this update's, with no read
    _optimizer_step(u.optimizer, lr, skip=~applied)
    window.applied += applied
    window.bad_run = torch.where(applied, 0, window.bad_run + bad)  # an fp16 overflow leaves it as it was
    u.scaler.update()  # after every unscale_, or the next one raises; a no-op unless fp16
    u.optimizer.zero_grad(set_to_none=True)
    window.records.append(torch.stack([sums[0], sums[1], counts[0], counts[1], norm, applied.double(),
                                       bad.double()]))  # (7,) as the module docstring lists them


def _optimizer_step(optimizer: torch.optim.Optimizer, lr: Tensor | float, skip: Tensor) -> None:
    """`optimizer.step()` with the learning rate and the skip decided on the device, read by nobody.

    The fused AdamW takes both: a tensor lr, and `found_inf` (what GradScaler hands it), with which the
    kernel leaves parameters, moments and step counts exactly as they were. That is exact and costs
    nothing, where restoring a saved copy of every parameter and moment (`torch.where`) costs three copies
    of the model, and zeroing the gradients is no skip (the moments still decay, AdamW still decays the
    weights). The float lr of the last update is written back by `replay`."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    optimizer.found_inf = skip.float()
    try:
        optimizer.step()
    finally:
        del optimizer.found_inf


def micro_batch_size(recipe: Recipe) -> int:
    """Sequences per micro-batch across all ranks (the `batch_size` handed to dataset.batch)."""
    return recipe.train.batch_size // recipe.train.grad_accum
