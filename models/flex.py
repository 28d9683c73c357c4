"""flex_attention on CUDA: document (and window) masks as block masks, built once per forward.

A packed row of several documents needs a (B, T, T) rule "same document, and causal". SDPA takes it as a
dense mask, which on CUDA rules out FlashAttention and still computes every block of every other
document. flex_attention takes the rule as a `BlockMask`: a block of 128 x 128 scores that the rule hides
entirely is skipped, so a row of short documents costs what its documents cost. The block mask is built
once per forward from `doc_ids` and shared by every layer (masks are built once, STYLE.md 4).

Guarded: builds of torch without flex_attention (or without CUDA) get None from `document_block_mask`, and
attention.py then passes the same rule to SDPA as the bool tensor it also gives the naive path.
"""

from __future__ import annotations

import functools

from torch import Tensor

try:
    from torch.nn.attention.flex_attention import create_block_mask
    from torch.nn.attention.flex_attention import flex_attention as _flex_attention
except ImportError:  # torch without flex_attention: SDPA with the dense bool mask instead
    create_block_mask = _flex_attention = None


def document_block_mask(doc_ids: Tensor, *, causal: bool, window: int | None = None) -> object | None:
    """The BlockMask of "same document (and causal) (and within `window` positions)" for doc_ids (B, T),
    or None when this torch has no flex_attention."""
    if create_block_mask is None:
        return None

    def same_document(b: Tensor, h: Tensor, q: Tensor, k: Tensor) -> Tensor:
        allowed = doc_ids[b, q] == doc_ids[b, k]
        if causal:
            allowed = allowed & (k <= q)
        if window is not None:
            allowed = allowed & ((q - k).abs() < window)
        return allowed

    B, T = doc_ids.shape
    return create_block_mask(same_document, B, None, T, T, device=doc_ids.device)


@functools.cache
def _compiled():
    """flex_attention compiled once: uncompiled it runs a reference loop that materialises every score."""
    import torch

    return torch.compile(_flex_attention, dynamic=False)


def flex_attention(q: Tensor, k: Tensor, v: Tensor, block: object, *, scale: float | None,
                   enable_gqa: bool) -> Tensor:
    """softmax(scale * QK^T under `block`)V: q (B, H, T, D), k/v (B, H_kv, T, D) -> (B, H, T, D)."""
    return _compiled()(q, k, v, block_mask=block, scale=scale, enable_gqa=enable_gqa)
