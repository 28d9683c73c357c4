"""Sliding-window attention a chunk of queries at a time (`model.window` where no flex_attention runs).

A window of W keys is a band in the (T, T) score matrix. Given to SDPA as a dense boolean mask, the band
costs what full attention costs, every score computed and then hidden, and more than causal attention,
which SDPA computes with its fused `is_causal` kernel (benchmarks/RESULTS.md: 0.67x of full causal at
T=2048, W=256, on a CPU). Here the queries go in chunks of W: the chunk starting at s sees only keys
s-W+1 .. s+W-1 (up to its own end when causal), so a chunk's scores are W x 2W and the layer's cost grows
as T * W instead of T^2. Each chunk is one SDPA call with the band's small mask, so it is exact, and
autograd differentiates it as any SDPA call. On CUDA with flex_attention the band is a block mask instead
(models/flex.py) and this is not used.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

MIN_CHUNKS = 4  # shorter sequences (T < 4 W) save too little to leave one SDPA call over the dense band


def worth_banding(length: int, window: int) -> bool:
    """Whether chunking a band of `window` over `length` positions costs less than the dense band."""
    return length >= MIN_CHUNKS * window


def banded_attention(q: Tensor, k: Tensor, v: Tensor, window: int, causal: bool, dropout_p: float,
                     scale: float | None, enable_gqa: bool) -> Tensor:
    """softmax(scale * QK^T under |q - k| < window, and k <= q when causal)V, a chunk of `window` queries at a
    time: q (B, H, T, D), k/v (B, H_kv, T, D) -> (B, H, T, D)."""
    length = q.shape[-2]
    positions = torch.arange(length, device=q.device)  # (T,)
    outs = []
    for start in range(0, length, window):
        end = min(start + window, length)
        low, high = max(0, start - window + 1), end if causal else min(length, end + window - 1)
        q_pos, k_pos = positions[start:end, None], positions[None, low:high]  # (C, 1), (1, K)
        band = (q_pos - k_pos).abs() < window  # (C, K)
        if causal:
            band = band & (k_pos <= q_pos)
        outs.append(F.scaled_dot_product_attention(q[:, :, start:end], k[:, :, low:high], v[:, :, low:high],
                                                   attn_mask=band, dropout_p=dropout_p, scale=scale,
                                                   enable_gqa=enable_gqa))  # (B, H, C, D)
    return torch.cat(outs, dim=2)  # (B, H, T, D)
