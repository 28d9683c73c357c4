"""flex_attention on CUDA: document and window masks as block masks, built once per forward.

A packed row of several documents needs a (B, T, T) rule "same document, and causal". SDPA takes it as a
dense mask, which on CUDA rules out FlashAttention and still computes every block of every other
document. flex_attention takes the rule as a `BlockMask`: a block of 128 x 128 scores that the rule hides
entirely is skipped, so a row of short documents costs what its documents cost. The block mask is built
once per forward from `doc_ids` and shared by every layer (masks are built once, STYLE.md 4).

Guarded: builds of torch without flex_attention (or without CUDA) get None from `flex_block_mask`, and
attention.py then passes the same rule to SDPA as the bool tensor it also gives the naive path.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

try:
    from torch.nn.attention.flex_attention import create_block_mask
    from torch.nn.attention.flex_attention import flex_attention as _flex_attention
except ImportError:  # torch without flex_attention: SDPA with the dense bool mask instead
    create_block_mask = _flex_attention = None


def flex_block_mask(length: int, doc_ids: Tensor | None, *, causal: bool, window: int | None,
                    device: torch.device) -> object | None:
    """The BlockMask of "same document (doc_ids (B, T); None: one per row), causal when `causal`, within
    `window` positions when given" over `length` positions, or None when this torch has no flex_attention."""
    if create_block_mask is None:
        return None

    def allowed(b: Tensor, h: Tensor, q: Tensor, k: Tensor) -> Tensor:
        keep = (q - k).abs() < window if window is not None else q >= 0  # q >= 0: every key, as a tensor
        if doc_ids is not None:
            keep = keep & (doc_ids[b, q] == doc_ids[b, k])
        return keep & (k <= q) if causal else keep

    batch = None if doc_ids is None else doc_ids.shape[0]
    return create_block_mask(allowed, batch, None, length, length, device=device)


@functools.cache
def _compiled():
    """flex_attention compiled once: uncompiled it runs a reference loop that materialises every score."""
    return torch.compile(_flex_attention, dynamic=False)


def flex_attention(q: Tensor, k: Tensor, v: Tensor, block: object, *, scale: float | None,
                   enable_gqa: bool) -> Tensor:
    """softmax(scale * QK^T under `block`)V: q (B, H, T, D), k/v (B, H_kv, T, D) -> (B, H, T, D)."""
    return _compiled()(q, k, v, block_mask=block, scale=scale, enable_gqa=enable_gqa)
