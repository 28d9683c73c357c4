"""Attention, written once: self- and cross-attention, MHA/GQA/MQA, fused (flash) and explicit (naive).

Shape convention, stated once: project to (B, T, H, D), transpose once to (B, H, T, D). Queries have
`n_heads` heads, keys/values `n_kv_heads` (MHA when equal, MQA when 1, GQA otherwise), so the K/V
projections and the KV cache are `n_heads / n_kv_heads` times smaller than the query side.

Masks are built once per forward by the model (`self_attention_mask`, `cross_attention_mask`) and passed
to every layer as an `AttnMask`. Which SDPA kernel runs (`attention: flash`):
- no padding, no ALiBi, no KV cache, causal or not: no mask tensor (`is_causal=True` for causal),
  so every fused backend applies (FlashAttention-2, memory-efficient, cuDNN on CUDA; the CPU flash kernel).
- over a KV cache (the prefill and every decode step: keys = every slot of the cache): a boolean
  `attn_mask` hiding the slots past each query (`position_mask`), or ALiBi's float one.
- padding masks: a boolean `attn_mask`; ALiBi: an additive float `attn_mask` with the mask folded in.
  FlashAttention-2 takes no mask, so CUDA uses the memory-efficient or cuDNN kernel; the CPU flash kernel
  takes masks. GQA is passed as `enable_gqa=True` (no K/V copies), except with a mask on CUDA, where
  the memory-efficient kernel takes no grouped K/V: each K/V head's query heads become its query rows
  (`grouped_query_attention`), or, for a per-head mask, K/V are copied to full width. To make a fall back
  to the math path an error rather than a slowdown, wrap the call in
  `torch.nn.attention.sdpa_kernel([...fused backends...])` (tests/test_models_gpu.py does).
`attention: naive` spells every step out (repeat K/V, QK^T/sqrt(d) + mask, softmax, dropout, @V) and can
return the attention weights; `need_weights=True` always takes this path, since fused kernels never
materialise the weights.

Document masks (`data.document_mask`): packed rows carry `doc_ids (B, T)`, each token's document, and a query
sees only keys of its own document (`position_mask(doc_ids=...)`, a bool (B, 1, T, T) built once per forward).
Sliding windows (`model.window`) are a band on the same mask: keys fewer than `window` positions away; a
model with `global_every` builds two masks per forward, the band for windowed layers and the full one.
On a CPU the bool mask goes into SDPA (its flash kernel takes masks; measured in benchmarks/doc_mask.py); on
CUDA the same rule is a flex_attention block mask (models/flex.py), built once per forward too, so whole
blocks of keys outside the document or band are skipped instead of masked. The naive path reads the bool
tensor.

`attn_scale` replaces the 1/sqrt(d) on the scores in both paths (SDPA's `scale=`, a multiply in the naive
one); the default passes no scale, so SDPA and the naive division compute exactly what they always did.

Four options change what is computed, each on every path that can compute it and refused where none can
(models/config.py):
- `attn_score: additive` scores a query and a key by w_h·tanh(q + k), a one-hidden-layer network per head
  (Bahdanau et al., 2015), instead of their dot product; no fused kernel computes it, so it needs
  `attention: naive`. The (B, H, T_q, T_k, D) hidden layer is materialised: it is for the lab, not for speed.
- `shared_qk` (Reformer): the keys come from the query projection, normalised to unit length, and a token
  attends to itself only when no other key is visible (`position_mask(exclude_self=True)`: its own score
  would otherwise be the largest). The mask is then always a tensor, so no is_causal or flex fast path.
- `shared_kv` (K = V): the key projection also makes the values, which are the keys before QK-norm and RoPE;
  no v_proj. Every path computes it (only the projections change).
- `pad_fill`: a padding key's score gets `pad_fill` added instead of being hidden (-inf, the default): a
  float mask, which SDPA and the naive path both add to the scores. Only padding: causal, document and
  window masks stay exact.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .config import ModelConfig
from .band import banded_attention, worth_banding
from .flex import flex_attention, flex_block_mask
from .kv_cache import CrossKV, LayerKV
from .layers import apply_rope, make_norm


@dataclass(frozen=True)
class AttnMask:
    """Which keys each query may see, shared by every layer of one forward.

    tensor: None (attend everywhere), bool (B|1, 1, T_q, T_k) with True = may attend, or an additive float
        (B|1, H, T_q, T_k) bias (ALiBi) with -inf where not allowed.
    is_causal: the tensor is exactly the square causal mask, so SDPA may build it itself (is_causal=True)
        and pick the fastest kernel; the naive path still uses the tensor.
    block: the same rule as a flex_attention BlockMask (CUDA, document masks: models/flex.py), or None.
    band: (window, causal) when the tensor is exactly a sliding window and nothing else, so the fused path
        may compute it a chunk of queries at a time (models/band.py), or None.
    """

    tensor: Tensor | None = None
    is_causal: bool = False
    block: object | None = None
    band: tuple[int, bool] | None = None


def self_attention_mask(q_len: int, *, causal: bool, key_padding: Tensor | None = None,
                        alibi: Tensor | None = None, device: torch.device | None = None,
                        dtype: torch.dtype = torch.float32, doc_ids: Tensor | None = None,
                        window: int | None = None, exclude_self: bool = False,
                        pad_fill: float = -math.inf) -> AttnMask:
    """Mask for self-attention of q_len queries over the same q_len keys, positions 0..q_len-1 (a forward
    without a KV cache; over a cache the model builds `position_mask` from the cache's tables).

    key_padding: (B, q_len) bool, True = real token. alibi: (H,) slopes. doc_ids: (B, q_len), each token's
    document in its packed row: attention stays inside a document. window: keys fewer than `window`
    positions away only. A query may always see its own position, so a padding query (whose output is
    never used) never has an empty softmax row. exclude_self (shared-QK) and pad_fill: `position_mask`.
    """
    for name, rows in (("attention mask", key_padding), ("doc_ids", doc_ids)):
        if rows is not None and rows.shape[-1] != q_len:
            raise ValueError(f"{name} covers {rows.shape[-1]} positions, expected T={q_len}")
    window = None if window is not None and window >= q_len else window  # wider than the sequence: no band
    plain = key_padding is None and alibi is None and doc_ids is None and window is None and not exclude_self
    if plain and (not causal or q_len == 1):
        return AttnMask()  # every key visible: no tensor, any kernel
    positions = torch.arange(q_len, device=device)  # (T,)
    tensor = position_mask(positions, positions, causal=causal, key_padding=key_padding, alibi=alibi, dtype=dtype,
                           doc_ids=doc_ids, window=window, exclude_self=exclude_self, pad_fill=pad_fill)
    block = None
    if not plain and key_padding is None and alibi is None and not exclude_self and positions.is_cuda:
        block = flex_block_mask(q_len, doc_ids, causal=causal, window=window, device=positions.device)  # or None
    only_band = window is not None and key_padding is None and alibi is None and doc_ids is None
    return AttnMask(tensor, is_causal=causal and plain, block=block, band=(window, causal) if only_band else None)


def position_mask(q_pos: Tensor, k_pos: Tensor, *, causal: bool, key_padding: Tensor | None = None,
                  alibi: Tensor | None = None, dtype: torch.dtype = torch.float32,
                  doc_ids: Tensor | None = None, window: int | None = None, exclude_self: bool = False,
                  pad_fill: float = -math.inf) -> Tensor:
    """The mask tensor of queries at positions q_pos (T_q,) over keys at positions k_pos (T_k,).

    bool (B|1, 1, T_q, T_k), True = may attend; with alibi slopes (H,) the additive float bias
    (B|1, H, T_q, T_k), -inf where not allowed. Tensor ops only, so the static decode step builds it from
    a position tensor (queries at that position, keys at every cache slot) without reading the position.
    doc_ids (B, T) (a forward without a cache, q_pos = k_pos): keys of other documents are hidden.
    window: keys `window` or more positions away are hidden (a band; over a cache, the slots behind it).
    exclude_self (shared-QK): a query's own key is hidden unless it sees no other key (Reformer, section 2).
    pad_fill: a finite value <= 0 is added to the scores of padding keys instead of hiding them, which
    makes the result an additive float mask (B, 1|H, T_q, T_k), -inf wherever the other masks hide a key.
    """
    q_pos, k_pos = q_pos[:, None], k_pos[None, :]  # (T_q, 1), (1, T_k)
    if causal:
        allowed = k_pos <= q_pos  # (T_q, T_k)
    else:
        allowed = torch.ones(q_pos.shape[0], k_pos.shape[1], dtype=torch.bool, device=q_pos.device)  # (T_q, T_k)
    if window is not None:
        allowed = allowed & ((q_pos - k_pos).abs() < window)  # (T_q, T_k): the band
    allowed = allowed[None, None]  # (1, 1, T_q, T_k)
    padded = None  # (B, 1, T_q, T_k): padding keys that get pad_fill added instead of being hidden
    if key_padding is not None:
        padding = ~key_padding.bool()[:, None, None, :] & (k_pos != q_pos)  # (B, 1, T_q, T_k)
        if math.isinf(pad_fill):
            allowed = allowed & ~padding  # (B, 1, T_q, T_k)
        else:
            padded = padding
    if doc_ids is not None:
        allowed = allowed & (doc_ids[:, None, :, None] == doc_ids[:, None, None, :])  # (B, 1, T, T)
    if exclude_self:
        allowed = without_self(allowed, q_pos == k_pos)
    if alibi is None and padded is None:
        return allowed
    bias = torch.zeros(allowed.shape[-2:], device=q_pos.device)[None, None]  # (1, 1, T_q, T_k)
    if alibi is not None:
        distance = (q_pos - k_pos).abs().float()  # (T_q, T_k): symmetric, so it also serves encoders
        bias = -alibi.to(device=q_pos.device, dtype=torch.float32)[None, :, None, None] * distance  # (1, H, T_q, T_k)
    if padded is not None:
        bias = bias + padded.float() * pad_fill  # (B, 1|H, T_q, T_k): pad_fill on padding keys only
    return bias.masked_fill(~allowed, float("-inf")).to(dtype)  # (B|1, 1|H, T_q, T_k)


def without_self(allowed: Tensor, own: Tensor) -> Tensor:
    """`allowed` (..., T_q, T_k) with each query's own key (`own`, True on it) hidden, except in a row where it
    is the only visible key (the first token of a causal sequence): shared-QK's q·q would be the largest score."""
    others = allowed & ~own  # (..., T_q, T_k)
    alone = ~others.any(dim=-1, keepdim=True)  # (..., T_q, 1): nothing but itself to attend to
    return others | (allowed & own & alone)


def cross_attention_mask(src_padding: Tensor | None, pad_fill: float = -math.inf,
                         dtype: torch.dtype = torch.float32) -> AttnMask:
    """Decoder queries may see every real source token: src_padding (B, S) bool, True = real. A finite
    pad_fill is added to the padding keys' scores instead (an additive float mask)."""
    if src_padding is None:
        return AttnMask()
    real = src_padding.bool()[:, None, None, :]  # (B, 1, 1, S)
    if math.isinf(pad_fill):
        return AttnMask(real)
    return AttnMask((~real).to(dtype) * pad_fill)  # (B, 1, 1, S): 0 on real keys, pad_fill on padding


def flash_attention(q: Tensor, k: Tensor, v: Tensor, mask: AttnMask, dropout_p: float,
                    scale: float | None = None) -> Tensor:
    """softmax(scale * QK^T + mask)V by PyTorch's fused SDPA (scale None = 1/sqrt(D), SDPA's own default).

    K/V heads are shared, not copied. On CUDA with a mask tensor FlashAttention takes no mask and the
    memory-efficient kernel no grouped K/V (SDPA would run its unfused math path), so a mask shared by all
    heads folds the query heads of each K/V head into its rows (`grouped_query_attention`); only a
    per-head mask (ALiBi) or a band gets full-width K/V (B, H, S, D) copies."""
    gqa = k.shape[1] != q.shape[1]
    if mask.block is not None and dropout_p == 0.0:
        return flex_attention(q, k, v, mask.block, scale=scale, enable_gqa=gqa)  # (B, H, T, D)
    banded = mask.band is not None and q.shape[-2] == k.shape[-2] and worth_banding(q.shape[-2], mask.band[0])
    if gqa and mask.tensor is not None and q.is_cuda and not banded and mask.tensor.dim() == 4 \
            and mask.tensor.shape[1] == 1:  # one mask for every head: decoding over a KV cache, padding
        return grouped_query_attention(q, k, v, mask.tensor, dropout_p, scale)  # (B, H, T, D)
    if gqa and mask.tensor is not None and q.is_cuda:
        groups = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)  # (B, H, S, D)
        gqa = False
    if banded:
        return banded_attention(q, k, v, *mask.band, dropout_p, scale, gqa)  # (B, H, T, D)
    if mask.is_causal:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True, scale=scale,
                                              enable_gqa=gqa)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask.tensor, dropout_p=dropout_p, scale=scale,
                                          enable_gqa=gqa)


def grouped_query_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, dropout_p: float,
                            scale: float | None) -> Tensor:
    """GQA/MQA under a mask shared by all heads, with each K/V head read once: the `groups` query heads of
    a K/V head become extra query rows of it, so SDPA's fused masked kernel runs over (B, H_kv, groups*T)
    queries and the narrow cache instead of K/V copied to full width. The copies made a decode step over
    the KV cache read and write more bytes than MHA's (GQA 0.57x MHA's tokens/s at a 1B-class shape on an
    H100, benchmarks/RESULTS.md), the opposite of what a smaller cache is for.

    q (B, H, T, D); k, v (B, H_kv, S, D); mask (B or 1, 1, T or 1, S), bool (True = attend) or additive."""
    b, h, t, d = q.shape
    kv_heads = k.shape[1]
    groups = h // kv_heads
    folded = q.reshape(b, kv_heads, groups * t, d)  # (B, H_kv, G*T, D): row g*T + t is query head j*G + g
    if mask.shape[2] != 1:  # row g*T + t takes mask row t
        mask = mask.unsqueeze(2).expand(mask.shape[0], 1, groups, t, mask.shape[-1]).reshape(
            mask.shape[0], 1, groups * t, mask.shape[-1])  # (B, 1, G*T, S)
    out = F.scaled_dot_product_attention(folded, k, v, attn_mask=mask, dropout_p=dropout_p, scale=scale)
    return out.reshape(b, h, t, d)  # (B, H_kv, G*T, D) -> (B, H, T, D)


def masked_softmax(scores: Tensor, mask: Tensor | None) -> Tensor:
    """softmax over the last axis, in fp32, of scores (..., T_k) under `mask` (`AttnMask.tensor`: bool with
    True = may attend, or an additive float bias). A row with no visible key (an all-padding source) would
    be NaN; it gets zeros, as SDPA gives."""
    scores = scores.float()
    if mask is not None and mask.dtype == torch.bool:
        scores = scores.masked_fill(~mask, float("-inf"))
    elif mask is not None:
        scores = scores + mask
    return torch.nan_to_num(torch.softmax(scores, dim=-1), nan=0.0)


def naive_attention(q: Tensor, k: Tensor, v: Tensor, mask: AttnMask, dropout_p: float,
                    training: bool, scale: float | None = None,
                    score_weight: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Every step explicit; returns (output (B, H, T_q, D), weights (B, H, T_q, T_k)).
    scale: the factor on QK^T, None = 1/sqrt(D) (`ModelConfig.score_scale`). score_weight (H, D): additive
    scores w_h·tanh(q + k) instead of dot products (`additive_scores`)."""
    groups = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(groups, dim=1)  # (B, H, T_k, D): each K/V head serves `groups` query heads
    v = v.repeat_interleave(groups, dim=1)  # (B, H, T_k, D)
    if score_weight is not None:
        scores = additive_scores(q, k, score_weight)  # (B, H, T_q, T_k)
    else:
        scores = q @ k.transpose(-2, -1)  # (B, H, T_q, T_k)
        scores = scores / math.sqrt(q.shape[-1]) if scale is None else scores * scale
    weights = masked_softmax(scores, mask.tensor).to(q.dtype)  # (B, H, T_q, T_k)
    weights = F.dropout(weights, p=dropout_p, training=training)
    return weights @ v, weights  # (B, H, T_q, D), (B, H, T_q, T_k)


def additive_scores(q: Tensor, k: Tensor, weight: Tensor) -> Tensor:
    """Additive (Bahdanau) scores: score(i, j) = sum_d w[h, d] * tanh(q[i, d] + k[j, d]) per head, a network with
    one tanh hidden layer of D units over the pair (q and k are the projections of its input, their biases its
    hidden bias). q (B, H, T_q, D), k (B, H, T_k, D), weight (H, D) -> (B, H, T_q, T_k). No scale: there is no
    dot product whose variance grows with D."""
    hidden = torch.tanh(q[:, :, :, None, :] + k[:, :, None, :, :])  # (B, H, T_q, T_k, D)
    return torch.einsum("bhqkd,hd->bhqk", hidden, weight.to(hidden.dtype))  # (B, H, T_q, T_k)


class Attention(nn.Module):
    """Multi-head attention with n_heads query heads and n_kv_heads key/value heads.

    Self-attention when `context` is None; cross-attention (queries from x, keys/values from context,
    e.g. the encoder memory) otherwise. With `qk_norm`, each head of q and k is normalised first; RoPE,
    when given, then rotates q and k (self-attention only). With `shared_qk` there is no k_proj (keys are the
    unit-normalised queries); with `attn_score: additive`, `score_weight` (H, D) is the output layer of each
    head's scoring network (module doc).
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.kv_heads, cfg.head_dim
        self.q_proj = nn.Linear(cfg.d_model, self.n_heads * self.head_dim, bias=cfg.bias)
        self.k_proj = None if cfg.shared_qk else nn.Linear(cfg.d_model, self.n_kv_heads * self.head_dim, bias=cfg.bias)
        self.v_proj = None if cfg.shared_kv else nn.Linear(cfg.d_model, self.n_kv_heads * self.head_dim, bias=cfg.bias)
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, cfg.d_model, bias=cfg.bias)
        self.impl = cfg.attention
        self.attn_dropout = cfg.attn_dropout
        self.scale = cfg.score_scale  # None = 1/sqrt(head_dim)
        self.q_norm = make_norm(cfg, self.head_dim) if cfg.qk_norm else None  # over each head's D features
        self.k_norm = make_norm(cfg, self.head_dim) if cfg.qk_norm and not cfg.shared_qk else None
        self.score_weight = None
        if cfg.attn_score == "additive":  # N(0, 1/D): scores of unit variance when tanh's outputs have it
            self.score_weight = nn.Parameter(torch.randn(self.n_heads, self.head_dim) * self.head_dim**-0.5)

    def _heads(self, x: Tensor, proj: nn.Linear, n_heads: int) -> Tensor:
        B, T, _ = x.shape
        return proj(x).view(B, T, n_heads, self.head_dim).transpose(1, 2)  # (B, H, T, D)

    def queries(self, x: Tensor, rope: tuple[Tensor, Tensor] | None = None) -> Tensor:
        """(B, H, T, D) queries of x (B, T, C): projected, QK-normed, rotated; what the scores are made of."""
        q = self._heads(x, self.q_proj, self.n_heads)  # (B, H, T, D)
        if self.q_norm is not None:
            q = self.q_norm(q)  # (B, H, T, D): QK-norm comes before RoPE
        return q if rope is None else apply_rope(q, *rope)

    def keys_values(self, source: Tensor, rope: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor]:
        """(B, H_kv, S, D) keys (projected, QK-normed, rotated) and values of source (B, S, C). Shared-QK: the
        keys are the queries of source before RoPE, each scaled to unit length (Reformer), then rotated. Shared-KV
        (no v_proj): the values are the keys' projection before QK-norm and RoPE."""
        if self.v_proj is None:
            v = self._heads(source, self.k_proj, self.n_kv_heads)  # (B, H_kv, S, D): K = V, one projection
            k = v if self.k_norm is None else self.k_norm(v)  # (B, H_kv, S, D)
            return (k if rope is None else apply_rope(k, *rope)), v
        v = self._heads(source, self.v_proj, self.n_kv_heads)  # (B, H_kv, S, D)
        if self.k_proj is None:
            k = self.queries(source)  # (B, H, S, D): the query projection (and QK-norm), H_kv = H
            k = F.normalize(k, dim=-1)  # (B, H, S, D): k_j = q_j / |q_j|
        else:
            k = self._heads(source, self.k_proj, self.n_kv_heads)  # (B, H_kv, S, D)
            if self.k_norm is not None:
                k = self.k_norm(k)  # (B, H_kv, S, D)
        return (k if rope is None else apply_rope(k, *rope)), v

    def forward(self, x: Tensor, mask: AttnMask, *, context: Tensor | None = None,
                rope: tuple[Tensor, Tensor] | None = None, cache: LayerKV | CrossKV | None = None,
                start_pos: Tensor | None = None, need_weights: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        B, T, C = x.shape
        q = self.queries(x, rope)  # (B, H, T, D)
        if isinstance(cache, CrossKV) and cache.k is not None:
            k, v = cache.k, cache.v  # (B, H_kv, S, D): the encoder memory's keys/values, computed once
        else:
            k, v = self.keys_values(x if context is None else context, rope)  # (B, H_kv, S, D) each
            if isinstance(cache, CrossKV):
                cache.store(k, v)
            elif cache is not None:
                k, v = cache.update(k, v, start_pos)  # (B, H_kv, S_max, D): kv_cache.py
        dropout_p = self.attn_dropout if self.training else 0.0
        if need_weights or self.impl == "naive" or self.score_weight is not None:  # additive: naive only
            y, weights = naive_attention(q, k, v, mask, dropout_p, self.training, self.scale,
                                         self.score_weight)  # (B, H, T, D)
        else:
            y, weights = flash_attention(q, k, v, mask, dropout_p, self.scale), None  # (B, H, T, D)
        y = self.o_proj(y.transpose(1, 2).reshape(B, T, C))  # (B, T, C)
        return (y, weights) if need_weights else y
