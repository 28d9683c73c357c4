"""Validation during training (`validate`): the same fixed batches every time, so successive numbers compare.

Scoring a finished checkpoint on a corpus is `tfkit eval`, in `evaluate.py`.

`dataset.eval_batches(n, ...)` gives n batches of validation examples spread evenly through them, with
fixed seeds, so every evaluation measures the model on identical tokens (and an MLM model on identical
masks). Under data parallelism each rank evaluates its slice of each batch and the sums are all-reduced, so
the result does not depend on the number of processes.

With a list of sources (`mixture.ValidSources`), each source is scored alone, with its bits per byte, and the
run's val_loss is their weighted mean (`validate_sources`); the rows add `val_bpb`, `val_loss/NAME` and
`val_bpb/NAME`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from ..errors import DataError
from ..tokenization.masking import IGNORE_INDEX
from ..tokenization.mixture import ValidSources
from .distributed import DistInfo, all_reduce_sum
from .objectives import move_batch
from .optim import autocast_context
from .parallel import reshard


@dataclass
class ValidationResult:
    loss: float  # mean cross-entropy per predicted token (nats)
    accuracy: float  # fraction of predicted tokens whose argmax is right
    tokens: int  # predicted tokens evaluated
    bytes: int | None = None  # UTF-8 bytes of text the predicted tokens stand for (validation per source)
    sources: dict[str, ValidationResult] | None = None  # validation per source: each source's own
    weights: dict[str, float] | None = None  # validation per source: each source's weight in the mixed figure

    @property
    def bits_per_byte(self) -> float | None:
        """The mixed figure's (`validate_sources`) or one source's bits per byte; None without byte counts."""
        if self.sources is not None:
            return mixed_bits_per_byte(self.sources, self.weights)
        return self.loss * self.tokens / math.log(2) / self.bytes if self.bytes else None

    @property
    def criterion(self) -> float:
        """What keep_best minimises: the loss."""
        return self.loss

    @property
    def perplexity(self) -> float:
        return math.exp(min(self.loss, 700.0))  # exp overflows past ~709

    def row(self, step: int) -> dict:
        return {"step": step, "val_loss": self.loss, "val_accuracy": self.accuracy, "val_ppl": self.perplexity,
                "val_tokens": self.tokens, **source_columns(self)}


def source_columns(result: ValidationResult) -> dict:
    """A row's columns of validation per source: `val_bpb` (the mixed figure), `val_loss/NAME`, `val_bpb/NAME`."""
    if result.sources is None:
        return {}
    out = {"val_bpb": result.bits_per_byte}
    for name, own in result.sources.items():
        out[f"val_loss/{name}"], out[f"val_bpb/{name}"] = own.loss, own.bits_per_byte
    return out


def source_summary(row: dict) -> str:
    """`  (docs 4.1234, code 3.2101)`: each source's validation loss, for the printed line; '' for one corpus."""
    own = [f"{k.split('/', 1)[1]} {v:.4f}" for k, v in row.items() if k.startswith("val_loss/")]
    return f"  ({', '.join(own)})" if own else ""


def mixed_bits_per_byte(sources: dict[str, ValidationResult], weights: dict[str, float]) -> float | None:
    """Bits per byte of the mixture: its expected bits per token over its expected bytes per token."""
    if any(not r.bytes for r in sources.values()):
        return None
    bits = sum(weights[n] * r.loss / math.log(2) for n, r in sources.items())
    return bits / sum(weights[n] * r.bytes / r.tokens for n, r in sources.items())


def validate_sources(loss_module: nn.Module, sources: ValidSources, n_batches: int, batch_size: int, info: DistInfo,
                     precision: str) -> ValidationResult:
    """Each source's validation (its first n batches) and the mixed figure: the loss and accuracy under the
    sources' weights (the expected loss of a token drawn as training draws them), tokens summed."""
    own = {}
    for name, data in sources.datasets.items():
        try:
            own[name] = validate(loss_module, data, n_batches, batch_size, info, precision, sources.byte_table)
        except DataError as exc:
            raise DataError(f"validation source {name}: {exc}") from None
    w = sources.weights
    return ValidationResult(loss=sum(w[n] * r.loss for n, r in own.items()),
                            accuracy=sum(w[n] * r.accuracy for n, r in own.items()),
                            tokens=sum(r.tokens for r in own.values()), sources=own, weights=dict(w))


@torch.no_grad()
def validate(loss_module: nn.Module, dataset, n_batches: int, batch_size: int, info: DistInfo,
             precision: str, byte_table: np.ndarray | None = None) -> ValidationResult:
    """Loss and accuracy of `loss_module` (see objectives.LossModule) over n validation batches (spread through
    the set: `eval_batches`); with `byte_table` (token id -> bytes of text), the bytes its predicted tokens
    stand for. A list of sources is `validate_sources`'."""
    if isinstance(dataset, ValidSources):
        return validate_sources(loss_module, dataset, n_batches, batch_size, info, precision)
    was_training = loss_module.training
    loss_module.eval()
    totals = torch.zeros(3, dtype=torch.float64, device=info.device)  # loss sum, correct, count
    n_bytes = 0  # counted on the host, from the batches' own labels
    try:
        for batch in dataset.eval_batches(n_batches, batch_size, info.rank, info.world_size):
            if byte_table is not None:
                labels = batch["labels"]
                n_bytes += int(byte_table[labels[labels != IGNORE_INDEX].numpy()].sum())
            batch = move_batch(batch, info.device)
            with autocast_context(precision, info.device):
                loss_sum, correct, count = loss_module(batch)
            totals += torch.stack([loss_sum.detach().double(), correct.double(), count.double()])
    finally:
        loss_module.train(was_training)
        reshard(loss_module)
    totals = torch.cat([totals, torch.tensor([float(n_bytes)], dtype=torch.float64, device=info.device)])
    loss_sum, correct, count, n_bytes = all_reduce_sum(totals, info).tolist()
    if not count:
        raise DataError(f"the validation data gives nothing to score at eval.batch_size {batch_size} (fewer examples "
                        "than processes, or no predicted token); use more validation text (data.valid / "
                        "data.valid_fraction)")
    return ValidationResult(loss=loss_sum / count, accuracy=correct / count, tokens=int(count),
                            bytes=None if byte_table is None else int(n_bytes))
