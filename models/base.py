"""The shared transformer block and model base that GPT, BERT and the encoder-decoder stack.

`Block` is the one layer every family stacks: self-attention (+ cross-attention in a decoder) and a
feed-forward, each a residual branch with its norm before (pre-LN, GPT-2) or after (post-LN, the paper and
BERT) the residual add. `ModelBase` holds what all three families share: position machinery (RoPE angles,
ALiBi slopes), mask building (once per forward), parameter and FLOP counts, and the KV-cache factory.

A decoder forward without a KV cache starts at position 0 (training, scoring, a full recompute). With a
cache it writes its keys/values at `start_pos`, a 0-dim long tensor (None = 0, the prefill), and attends
over the whole cache: the mask and RoPE rows come from the cache's tables indexed by that tensor
(`_decoder_inputs`), so every decode step has the same shapes and no host read (one write mode, gpt-fast's).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from ..errors import ConfigError
from .attention import Attention, AttnMask, position_mask, self_attention_mask
from .config import ModelConfig
from .kv_cache import CrossKV, KVCache, LayerKV
from .layers import FeedForward, alibi_slopes, make_norm, rope_angles, rope_at


class Block(nn.Module):
    """Self-attention (+ cross-attention over `memory` when cross=True) + feed-forward. Without residual
    connections (`model.residual: false`) each sublayer's output replaces its input: the plain stack that
    residual networks were introduced against (He et al., 2016)."""

    def __init__(self, cfg: ModelConfig, cross: bool = False) -> None:
        super().__init__()
        self.pre_norm = cfg.norm_placement == "pre"
        self.residual = cfg.residual
        self.norm_attn, self.attn = make_norm(cfg), Attention(cfg)
        self.norm_cross = make_norm(cfg) if cross else None
        self.cross_attn = Attention(cfg) if cross else None
        self.norm_ffn, self.ffn = make_norm(cfg), FeedForward(cfg)
        self.drop = nn.Dropout(cfg.dropout)

    def _sublayer(self, x: Tensor, norm: nn.Module, fn: nn.Module, *args, rows: Tensor | None = None,
                  **kwargs) -> Tensor:
        """Pre-LN: x + f(norm(x)); post-LN: norm(x + f(x)). Dropout on the branch before the add. Without
        residuals: f(norm(x)) and norm(f(x)).
        rows: the real tokens (B, T), given only to a BatchNorm (`norm_rows`), whose statistics skip padding."""
        if self.pre_norm:
            y = self.drop(fn(norm(x) if rows is None else norm(x, rows), *args, **kwargs))  # (B, T, C)
            return x + y if self.residual else y
        y = self.drop(fn(x, *args, **kwargs))  # (B, T, C)
        y = x + y if self.residual else y
        return norm(y) if rows is None else norm(y, rows)

    def forward(self, x: Tensor, mask: AttnMask, *, rope: tuple[Tensor, Tensor] | None = None,
                cache: LayerKV | None = None, start_pos: Tensor | None = None, memory: Tensor | None = None,
                memory_mask: AttnMask | None = None, cross_cache: CrossKV | None = None,
                rows: Tensor | None = None) -> Tensor:
        x = self._sublayer(x, self.norm_attn, self.attn, mask, rope=rope, cache=cache, start_pos=start_pos, rows=rows)
        if self.cross_attn is not None:
            x = self._sublayer(x, self.norm_cross, self.cross_attn, memory_mask, context=memory, cache=cross_cache,
                               rows=rows)
        return self._sublayer(x, self.norm_ffn, self.ffn, rows=rows)  # (B, T, C)


def block_stack(cfg: ModelConfig, cross: bool = False) -> nn.ModuleList:
    """The n_layers blocks of one stack. With `model.share_layers` (ALBERT's all-shared, Lan et al., 2020,
    section 3.1) every entry is the *same* Block object, not n copies loaded with one set of weights: autograd then
    sums each weight's gradient over the layers that applied it, the optimizer steps it once, `parameters()` and
    `num_params()` count it once, a checkpoint stores it once (safetensors keeps `blocks.0.*` and drops the other
    names of the same tensors; `checkpoints.meta.assign_weights` ties them again on load), and a forward hook on it
    fires once per layer, so the per-layer probes and the KV cache (indexed by layer, not by module) are unchanged.
    Copies would drift apart after the first update unless something re-tied them at every step."""
    if cfg.share_layers:
        block = Block(cfg, cross=cross)
        return nn.ModuleList([block] * cfg.n_layers)
    return nn.ModuleList(Block(cfg, cross=cross) for _ in range(cfg.n_layers))


class ModelBase(nn.Module):
    """What every family shares; subclasses build their modules and call `init_weights`."""

    attention_layers_per_token = 1  # attention layers one token passes through, per n_layers (for FLOPs)
    cross_attention = False  # whether the KV cache needs cross-attention slots

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg

    def _start(self, start_pos: Tensor | None, length: int, kv_cache: KVCache | None) -> Tensor | None:
        """Check the span of `length` tokens at start_pos; returns the position the cache is written at (a
        0-dim tensor, `positions[0]` for the prefill), or None without a cache. A tensor position's bounds
        are the caller's: checking them would read it on the host."""
        if start_pos is not None and (kv_cache is None or start_pos.dim() != 0):
            raise ValueError("start_pos (a 0-dim position tensor) needs a kv_cache holding the earlier positions")
        if start_pos is None and length > self.config.max_seq_len:
            raise ConfigError(f"sequence reaches position {length} but model.max_seq_len is {self.config.max_seq_len}")
        if kv_cache is None:
            return None
        if start_pos is None and length > kv_cache.max_len:
            raise ConfigError(
                f"KV cache holds {kv_cache.max_len} positions but {length} were given; "
                "create it with a larger max_len (at most model.max_seq_len)"
            )
        return kv_cache.positions[0] if start_pos is None else start_pos  # 0-dim

    def norm_rows(self, padding: Tensor | None, length: int) -> Tensor | None:
        """The real tokens (B, T) of the `length` newest positions, for BatchNorm statistics that skip padding;
        None for the other norms (they never look across positions) and when nothing is padding."""
        if self.config.norm != "batchnorm" or padding is None:
            return None
        return padding[:, -length:].bool()  # (B, T)

    def _final_norm(self, norm: nn.Module | None, x: Tensor, rows: Tensor | None) -> Tensor:
        if norm is None:
            return x
        return norm(x) if rows is None else norm(x, rows)

    def _rope(self, x: Tensor, position_ids: Tensor | None = None) -> tuple[Tensor, Tensor] | None:
        """RoPE cos/sin for the positions 0..T-1 of x (B, T, C), (T, D) each, or for `position_ids (B, T)`
        (positions restarted at each packed document), (B, 1, T, D) each; None when positions are not rope."""
        if self.config.positions != "rope":
            return None
        if position_ids is None:
            return rope_angles(self.config, x.shape[1], x.device)  # (T, D) x2
        cos, sin = rope_at(self.config, position_ids)  # (B, T, D) x2: the angles of these positions only
        return cos[:, None], sin[:, None]  # (B, 1, T, D) x2

    def _per_layer(self, mask: Callable[[int | None], AttnMask]) -> list[AttnMask]:
        """One mask per layer from `mask(window)`: the windowed layers share one, the global ones another,
        each built once (`model.window`, `model.global_every`)."""
        windows = [self.config.window if self.config.windowed(i) else None for i in range(self.config.n_layers)]
        built = {window: mask(window) for window in set(windows)}
        return [built[window] for window in windows]

    def _self_masks(self, x: Tensor, causal: bool, padding: Tensor | None = None,
                    doc_ids: Tensor | None = None) -> list[AttnMask]:
        """The self-attention mask of each layer (with the ALiBi bias folded in) for x (B, T, C), built once
        per forward; doc_ids (B, T) keeps attention inside each packed document. Slopes are fp32 and not a
        buffer, so casting the model to bf16 cannot round them."""
        slopes = alibi_slopes(self.config.n_heads) if self.config.positions == "alibi" else None
        return self._per_layer(lambda window: self_attention_mask(
            x.shape[1], causal=causal, key_padding=padding, alibi=slopes, device=x.device, dtype=x.dtype,
            doc_ids=doc_ids, window=window, exclude_self=self.config.shared_qk, pad_fill=self.config.padding_fill))

    def _decoder_inputs(self, x: Tensor, start_pos: Tensor | None, padding: Tensor | None,
                        kv_cache: KVCache | None, doc_ids: Tensor | None = None,
                        position_ids: Tensor | None = None) -> tuple[list[AttnMask], tuple[Tensor, Tensor] | None]:
        """The causal self-attention mask of each layer and RoPE cos/sin of a decoder forward, built once.

        Over a cache (start_pos the 0-dim tensor `_start` gives): queries at start_pos.. over every slot of
        the cache, the mask from the cache's key positions (and ALiBi slopes), RoPE rows indexed from its table.
        doc_ids / position_ids (B, T): packed documents kept apart (training and scoring, never a cache).
        """
        if kv_cache is None:
            return self._self_masks(x, causal=True, padding=padding, doc_ids=doc_ids), self._rope(x, position_ids)
        if padding is not None or doc_ids is not None or position_ids is not None:
            raise ValueError("a forward over the KV cache takes no attention_mask, doc_ids or position_ids: "
                             "every row is one sequence, real up to start_pos")
        q_pos = start_pos + kv_cache.positions[: x.shape[1]]  # (T,)
        masks = self._per_layer(lambda window: AttnMask(position_mask(
            q_pos, kv_cache.positions, causal=True, alibi=kv_cache.alibi, dtype=x.dtype, window=window,
            exclude_self=self.config.shared_qk)))
        rope = None if kv_cache.rope is None else (kv_cache.rope[0][q_pos], kv_cache.rope[1][q_pos])  # (T, D) x2
        return masks, rope  # each mask (1, 1|H, T, S_max)

    def num_params(self, non_embedding: bool = False) -> int:
        """Distinct parameters (a tied matrix, and a block shared across layers, counts once); non_embedding drops the lookup tables
        (token, position, segment embeddings), the N of the scaling-law papers."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            n -= sum(m.weight.numel() for m in self.modules() if isinstance(m, nn.Embedding))
        return n

    def flops_per_token(self, seq_len: int) -> int:
        """Training FLOPs per token: 6 * N_matmul + 12 * n_attn_layers * d_model * seq_len (PaLM appendix B).

        N_matmul is every linear weight a token is multiplied by: the non-embedding parameters less norms and
        biases, *plus* a tied output head (a lookup table on the way in, a full matmul on the way out).
        6 = 2 (multiply-add) * 3 (forward + backward). The second term is QK^T and AV over seq_len keys,
        counted in full even where causal masking skips half. For the encoder-decoder a "token" is one
        source plus one target token (S = T = seq_len): both stacks, and cross-attention, count once.
        BERT counts its MLM head on every position (training applies it to ~15%) and its pooler: a few
        percent high for a small BERT, which makes MFU slightly optimistic there.
        A windowed layer (`model.window`) counts the `window` keys it reads, not seq_len.
        """
        cfg = self.config
        # every use of a linear layer: a shared block (model.share_layers) multiplies each token n_layers times
        n_matmul = sum(m.weight.numel() for _, m in self.named_modules(remove_duplicate=False)
                       if isinstance(m, nn.Linear))
        self_stacks = self.attention_layers_per_token - (1 if self.cross_attention else 0)  # cross reads every key
        keys = sum(min(seq_len, cfg.window) if cfg.windowed(i) else seq_len for i in range(cfg.n_layers))
        keys = self_stacks * keys + (cfg.n_layers * seq_len if self.cross_attention else 0)  # over every layer
        return 6 * n_matmul + 12 * cfg.d_model * keys

    def new_kv_cache(self, batch_size: int, max_len: int | None = None, device: torch.device | str | None = None,
                     dtype: torch.dtype | None = None) -> KVCache:
        """A static cache for incremental decoding, on the model's device and dtype unless told otherwise."""
        weight = next(self.parameters())
        return KVCache(self.config, batch_size, max_len or self.config.max_seq_len,
                       cross=self.cross_attention, device=device or weight.device,
                       dtype=dtype or weight.dtype)
