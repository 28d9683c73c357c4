"""BatchNorm for sequences: each feature normalised over the batch's positions, the contrast to LayerNorm.

LayerNorm (and RMSNorm) normalise each position over its own features, so a position's output never
depends on the rest of the batch. BatchNorm normalises each feature over the other positions of the batch
(B*T rows) while training and over running statistics in eval mode; `model.norm: batchnorm` lets the lab
show what that dependence does to a transformer. LayerNorm and RMSNorm are torch's own (layers.make_norm).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class BatchNorm(nn.BatchNorm1d):
    """BatchNorm over the last dimension of (..., C), with running statistics (momentum 0.1) for eval mode.

    Training normalises by the batch's statistics and updates the running ones; eval mode uses the running
    statistics, so each position is normalised alone and KV-cached decoding equals a full forward. `rows`
    (the padding mask, True = real token) keeps padding out of the statistics: the models pass it where a
    batch has one (seq2seq; tfkit's MLM and CLM batches are packed and have none). Without it every row
    counts, as in the MLM head, which sees the padding slots of its fixed-size target gather. A causal
    model's later positions count too: while training, a token's normalisation sees the batch's future.
    Each process keeps its own statistics (DDP broadcasts rank 0's buffers every forward);
    `train.activation_checkpointing` recomputes a block's forward, which updates the running statistics a
    second time with the same batch (gradients are unaffected). bias=False keeps the gain, drops the shift."""

    def __init__(self, dim: int, eps: float, bias: bool = True) -> None:
        super().__init__(dim, eps=eps)
        if not bias:
            self.register_parameter("bias", None)

    def reset_parameters(self) -> None:
        self.reset_running_stats()
        nn.init.ones_(self.weight)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def forward(self, x: Tensor, rows: Tensor | None = None) -> Tensor:
        """x (..., C); rows (...) bool, True = a real position (None: all are)."""
        if rows is None or not self.training:
            return super().forward(x.reshape(-1, x.shape[-1])).view(x.shape)  # (N, C) rows -> (..., C)
        return self._masked(x, rows)

    def _masked(self, x: Tensor, rows: Tensor) -> Tensor:
        """Training statistics of the real rows only, in fp32 and with no data-dependent shape (no sync)."""
        flat = x.reshape(-1, x.shape[-1]).float()  # (N, C)
        keep = rows.reshape(-1, 1).to(flat.dtype)  # (N, 1)
        n = keep.sum().clamp(min=1.0)  # () real rows
        mean = (flat * keep).sum(0) / n  # (C,)
        var = (((flat - mean) * keep) ** 2).sum(0) / n  # (C,) biased, what the batch is normalised by
        with torch.no_grad():  # as BatchNorm1d: an exponential average, the variance unbiased
            self.num_batches_tracked += 1
            self.running_mean.lerp_(mean, self.momentum)
            self.running_var.lerp_(var * n / (n - 1).clamp(min=1.0), self.momentum)
        y = (flat - mean) * torch.rsqrt(var + self.eps) * self.weight  # (N, C)
        if self.bias is not None:
            y = y + self.bias
        return y.to(x.dtype).view(x.shape)
