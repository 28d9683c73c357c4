"""flex_attention on CUDA: document and window masks as block masks, built once per forward.

A packed row of several documents needs a (B, T, T) rule "same document, and causal". SDPA takes it as a
dense mask, which on CUDA rules out FlashAttention and still computes every block of every other
document. flex_attention takes the rule as a `BlockMask`: a block of 128 x 128 scores that the rule hides
entirely is skipped, a block it keeps entirely runs without the rule, and only the blocks in between
evaluate it. The block mask is built once per forward from `doc_ids` and shared by every layer (masks are
built once, STYLE.md 4).

The blocks are classified here from each block's smallest and largest document id, with plain tensor
ops, rather than by `create_block_mask`, which evaluates the rule on every (q, k) pair, a (B, T, T)
tensor. The classification needs no ordering of the ids: two blocks share a document only if their id
ranges overlap (so a block outside the overlap is skipped safely), and a block is whole only when both
blocks hold one and the same document.

The block mask is built eagerly, outside any compiled graph (`torch.compiler.disable`: one graph break
per forward), and handed to the compiled kernel as an input. The disable is applied at the call, not as a
decorator, because applying it imports TorchDynamo (a second on every command's start). Built inside the
compiled model it went wrong on an H200 (torch 2.11): with `create_block_mask` the kernel read out of
bounds (an illegal memory access, gpt2-small at T=1024), and with these tables the output was off by 45%
and the gradients by more than their size, though the same tables built eagerly and passed to the same
compiled kernel matched dense SDPA (0.3% in bf16) and `create_block_mask`'s tables entry for entry.

Guarded: builds of torch without flex_attention (or without CUDA) get None from `flex_block_mask`, and
attention.py then passes the same rule to SDPA as the bool tensor it also gives the naive path.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

try:
    from torch.nn.attention.flex_attention import BlockMask
    from torch.nn.attention.flex_attention import flex_attention as _flex_attention
except ImportError:  # torch without flex_attention: SDPA with the dense bool mask instead
    BlockMask = _flex_attention = None

BLOCK = 128  # flex_attention's block of queries and of keys


def flex_block_mask(length: int, doc_ids: Tensor | None, *, causal: bool, window: int | None,
                    device: torch.device) -> object | None:
    """The BlockMask of "same document (doc_ids (B, T); None: one per row), causal when `causal`, within
    `window` positions when given" over `length` positions, or None when this torch has no flex_attention.
    Never traced: a compiled model gets it as an input (the module's docstring says why)."""
    if BlockMask is None:
        return None
    return torch.compiler.disable(_block_mask)(length, doc_ids, causal=causal, window=window, device=device)


def _block_mask(length: int, doc_ids: Tensor | None, *, causal: bool, window: int | None,
                device: torch.device) -> object:
    """`flex_block_mask`, built with plain tensor ops."""

    def allowed(b: Tensor, h: Tensor, q: Tensor, k: Tensor) -> Tensor:
        keep = (q - k).abs() < window if window is not None else q >= 0  # q >= 0: every key, as a tensor
        if doc_ids is not None:
            keep = keep & (doc_ids[b, q] == doc_ids[b, k])
        return keep & (k <= q) if causal else keep

    some, every = block_classes(length, doc_ids, causal=causal, window=window, device=device)  # (B, n, n)
    partial = some & ~every
    num, indices = _ordered(partial)
    full_num, full_indices = _ordered(every)
    return BlockMask.from_kv_blocks(num, indices, full_num, full_indices, BLOCK_SIZE=BLOCK, mask_mod=allowed,
                                    seq_lengths=(length, length))


def block_classes(length: int, doc_ids: Tensor | None, *, causal: bool, window: int | None,
                  device: torch.device) -> tuple[Tensor, Tensor]:
    """Which (query block, key block) pairs the rule may keep some scores of, and which it keeps whole:
    two bool (B|1, n, n) tensors, n = ceil(length / BLOCK). `some` may say yes for a block that turns out
    empty (it is then computed under the rule, still exact); `every` says yes only for a whole block."""
    n = -(-length // BLOCK)
    starts = torch.arange(n, device=device) * BLOCK  # (n,): each block's first position
    ends = (starts + BLOCK).clamp(max=length) - 1  # (n,): its last position
    lo = starts[:, None] - ends[None, :]  # (n, n): the smallest q - k between query block and key block
    hi = ends[:, None] - starts[None, :]  # (n, n): the largest
    some = torch.ones(n, n, dtype=torch.bool, device=device)  # (n, n)
    filled = ends - starts + 1 == BLOCK  # (n,): the last block is short when BLOCK does not divide length
    every = filled[:, None] & filled[None, :]  # (n, n): a short block is never whole, as create_block_mask has it
    if causal:  # k <= q
        some, every = some & (hi >= 0), every & (lo >= 0)
    if window is not None:  # |q - k| < window
        nearest = torch.where((lo <= 0) & (hi >= 0), 0, torch.minimum(lo.abs(), hi.abs()))  # (n, n)
        some, every = some & (nearest < window), every & (torch.maximum(lo.abs(), hi.abs()) < window)
    some, every = some[None], every[None]  # (1, n, n)
    if doc_ids is None:
        return some, every
    pad = doc_ids[:, -1:].expand(-1, n * BLOCK - length)  # (B, n * BLOCK - T): the last id again
    blocks = torch.cat([doc_ids, pad], dim=1).view(-1, n, BLOCK)  # (B, n, BLOCK): the last block padded
    first, last = blocks.amin(-1), blocks.amax(-1)  # (B, n): each block's id range
    shared = torch.maximum(first[:, :, None], first[:, None, :]) <= torch.minimum(last[:, :, None], last[:, None, :])
    one = first == last  # (B, n): a block of one document
    same = one[:, :, None] & one[:, None, :] & (first[:, :, None] == first[:, None, :])  # (B, n, n)
    return some & shared, every & same  # (B, n, n)


def _ordered(blocks: Tensor) -> tuple[Tensor, Tensor]:
    """BlockMask's layout of a bool (B, n, n) block table: per query block, how many key blocks (B, 1, n)
    and their indices first, ascending (B, 1, n, n), both int32."""
    num = blocks.sum(-1, dtype=torch.int32)  # (B, n)
    indices = torch.argsort((~blocks).to(torch.int8), dim=-1, stable=True).to(torch.int32)  # (B, n, n)
    return num[:, None], indices[:, None]


@functools.cache
def _compiled():
    """flex_attention compiled once: uncompiled it runs a reference loop that materialises every score."""
    return torch.compile(_flex_attention, dynamic=False)


def flex_attention(q: Tensor, k: Tensor, v: Tensor, block: object, *, scale: float | None,
                   enable_gqa: bool) -> Tensor:
    """softmax(scale * QK^T under `block`)V: q (B, H, T, D), k/v (B, H_kv, T, D) -> (B, H, T, D)."""
    return _compiled()(q, k, v, block_mask=block, scale=scale, enable_gqa=enable_gqa)
