"""Validation during training (`validate`): the same fixed batches every time, so successive numbers compare.

Scoring a finished checkpoint on a corpus is `tfkit eval`, in `evaluate.py`.

`dataset.eval_batches(n, ...)` walks the first n batches of validation examples in order with fixed
seeds, so every evaluation measures the model on identical tokens (and an MLM model on identical masks). Under data
parallelism each rank evaluates its slice of each batch and the sums are all-reduced, so the result does
not depend on the number of processes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from ..errors import DataError
from .distributed import DistInfo, all_reduce_sum
from .objectives import move_batch
from .optim import autocast_context
from .parallel import reshard


@dataclass
class ValidationResult:
    loss: float  # mean cross-entropy per predicted token (nats)
    accuracy: float  # fraction of predicted tokens whose argmax is right
    tokens: int  # predicted tokens evaluated

    @property
    def criterion(self) -> float:
        """What keep_best minimises: the loss."""
        return self.loss

    @property
    def perplexity(self) -> float:
        return math.exp(min(self.loss, 700.0))  # exp overflows past ~709

    def row(self, step: int) -> dict:
        return {"step": step, "val_loss": self.loss, "val_accuracy": self.accuracy, "val_ppl": self.perplexity,
                "val_tokens": self.tokens}


@torch.no_grad()
def validate(loss_module: nn.Module, dataset, n_batches: int, batch_size: int, info: DistInfo,
             precision: str) -> ValidationResult:
    """Loss and accuracy of `loss_module` (see objectives.LossModule) over the first n validation batches."""
    was_training = loss_module.training
    loss_module.eval()
    totals = torch.zeros(3, dtype=torch.float64, device=info.device)  # loss sum, correct, count
    try:
        for batch in dataset.eval_batches(n_batches, batch_size, info.rank, info.world_size):
            batch = move_batch(batch, info.device)
            with autocast_context(precision, info.device):
                loss_sum, correct, count = loss_module(batch)
            totals += torch.stack([loss_sum.detach().double(), correct.double(), count.double()])
    finally:
        loss_module.train(was_training)
        reshard(loss_module)
    loss_sum, correct, count = all_reduce_sum(totals, info).tolist()
    if not count:
        raise DataError(f"the validation data gives nothing to score at eval.batch_size {batch_size} (fewer examples "
                        "than processes, or no predicted token); use more validation text (data.valid / "
                        "data.valid_fraction)")
    return ValidationResult(loss=loss_sum / count, accuracy=correct / count, tokens=int(count))
