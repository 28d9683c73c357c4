"""The compiled CPU decode step, written as reductions that stream memory: what `generation.compiled` uses
on the CPU.

At batch 1, a decode step is a chain of matrix-vector products. Every weight is read once per token for
one multiply-add, so no step can be faster than memory streams the weights. On a CPU the BLAS
matrix-vector kernel behind `F.linear` reaches about half of that speed: 19.6 of 38 GB/s on one core of
the machine in benchmarks/RESULTS.md, and a plain sum over the same weights reaches the 38. Written as an
elementwise product and a sum over the last axis, the same arithmetic is one vectorised loop that
inductor generates in C++, fused with its neighbours. That loop streams each weight row once at near
memory speed (36 GB/s there). Attention for one query is the same story: SDPA's CPU kernel took three
times as long per layer as reading the cache, and two reductions over the cache make the same loop.

`StreamingDecode` is a torch-function mode that makes these substitutions while the decode step is
traced, and leaves every other call alone:
- `F.linear` on one row (B*T = 1);
- `F.scaled_dot_product_attention` for one query without dropout or `is_causal`.

It is only for a compiled graph. Eagerly, `(x * W).sum(-1)` would materialise the whole product. With
several rows, inductor would read each weight once per row, where a matrix product reads it once.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch.nn.functional as F
from torch import Tensor
from torch.overrides import TorchFunctionMode

from .attention import masked_softmax


def row_linear(input: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """`F.linear` for a single row as a multiply and a last-axis sum; several rows go to `F.linear`."""
    if input.numel() != input.shape[-1]:
        return F.linear(input, weight, bias)
    y = (input.unsqueeze(-2) * weight).sum(-1)  # (..., 1, in) * (out, in) -> (..., out)
    return y if bias is None else y + bias


def one_query_attention(query: Tensor, key: Tensor, value: Tensor, attn_mask: Tensor | None = None,
                        dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
                        enable_gqa: bool = False) -> Tensor:
    """`F.scaled_dot_product_attention` for one query per row as reductions over the keys; anything else
    (several queries, dropout, is_causal) goes to SDPA.

    query (B, H, 1, D); key, value (B, H_kv, S, D) with H a multiple of H_kv (GQA/MQA read each key/value
    head once for its `H / H_kv` query heads, never copied); attn_mask broadcastable to (B, H, 1, S): bool,
    True = may attend, or an additive float bias. A row that sees no key gives zeros, as SDPA does.
    """
    B, H, T, D = query.shape
    H_kv, S = key.shape[1], key.shape[2]
    if T != 1 or dropout_p > 0.0 or is_causal:
        return F.scaled_dot_product_attention(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                                              is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)
    groups = H // H_kv
    q = query.reshape(B, H_kv, groups, 1, D)  # (B, H_kv, G, 1, D): the query heads sharing one K/V head
    scores = (q * key.unsqueeze(2)).sum(-1)  # (B, H_kv, G, S)
    scores = scores.float() * (1.0 / math.sqrt(D) if scale is None else scale)
    mask = attn_mask
    if mask is not None:  # (B|1, H|1, 1, S) -> (B|1, H_kv|1, G|1, S), heads grouped as the queries are
        per_head = mask.dim() >= 3 and mask.shape[-3] == H
        mask = mask.reshape(-1, H_kv, groups, S) if per_head else mask.reshape(-1, 1, 1, S)
    weights = masked_softmax(scores, mask)  # (B, H_kv, G, S), fp32
    out = (weights.unsqueeze(-1) * value.unsqueeze(2)).sum(-2)  # (B, H_kv, G, D), fp32 (bf16 values promoted)
    return out.to(query.dtype).reshape(B, H, 1, D)


class StreamingDecode(TorchFunctionMode):
    """While active, one-row `F.linear` and one-query SDPA run as `row_linear` and `one_query_attention`."""

    SUBSTITUTES: dict[Callable, Callable] = {F.linear: row_linear,
                                             F.scaled_dot_product_attention: one_query_attention}

    def __torch_function__(self, func: Callable, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        return self.SUBSTITUTES.get(func, func)(*args, **(kwargs or {}))


def streaming(step: Callable[..., Tensor]) -> Callable[..., Tensor]:
    """`step` run under `StreamingDecode`, for torch.compile to trace."""
    def run(*args: Any) -> Tensor:
        with StreamingDecode():
            return step(*args)
    return run
