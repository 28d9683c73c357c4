"""The static KV cache used for incremental decoding (GPT and the encoder-decoder's decoder).

Static means pre-allocated once at `(B, H_kv, S_max, D)` per layer and written by index, as in gpt-fast:
no tensor grows or is concatenated during generation, so memory is known up front. The cache is sized by
the *key/value* head count, which is the whole point of GQA/MQA at inference: the cache shrinks by
`n_heads / n_kv_heads`.

`LayerKV.update` has one mode, gpt-fast's: the new keys/values are written with `index_copy_` at the
position a 0-dim long tensor holds, and the *whole* buffers are returned; the slots past the queries are
hidden by the mask, built from the tables below. The prefill writes at position 0 the same way (the model
passes `positions[0]`). Every decode step then has the same shapes and reads no position on the host, so
it compiles to one graph (and a CUDA graph). `mark_static` lets a CUDA graph write the buffers in place.

Those tables are built here once, on the cache's device, for every forward over the cache to index by the
position tensor: `positions` (0..S_max-1, compared with the query position to give the causal mask), `rope` (the
cos/sin rows of every position, fp32) and `alibi` (the per-head slopes, fp32). They live in the cache and
not in the model because a model cast to bf16 casts its buffers, and bf16 garbles distant RoPE angles.

For the encoder-decoder, cross-attention keys/values depend only on the encoder memory, so each decoder
layer computes them once on the first (prefill) call and reuses them (`CrossKV`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..errors import ConfigError
from .config import ModelConfig
from .layers import alibi_slopes, rope_angles


class LayerKV:
    """Self-attention keys and values of one layer: two `(B, H_kv, S_max, D)` buffers."""

    def __init__(self, batch_size: int, n_kv_heads: int, max_len: int, head_dim: int,
                 device: torch.device | str | None, dtype: torch.dtype) -> None:
        shape = (batch_size, n_kv_heads, max_len, head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)  # (B, H_kv, S_max, D)
        self.v = torch.zeros(shape, device=device, dtype=dtype)  # (B, H_kv, S_max, D)

    @property
    def max_len(self) -> int:
        return self.k.shape[2]

    def update(self, k: Tensor, v: Tensor, start_pos: Tensor) -> tuple[Tensor, Tensor]:
        """Write the new keys/values k, v (B, H_kv, T, D) at positions start_pos..start_pos+T-1 (start_pos a
        0-dim long tensor) and return the whole buffers. The bounds are the caller's to keep: checking them
        would read the position on the host."""
        index = start_pos + torch.arange(k.shape[2], device=self.k.device)  # (T,)
        self.k.index_copy_(2, index, k.to(self.k.dtype))
        self.v.index_copy_(2, index, v.to(self.v.dtype))
        return self.k, self.v  # (B, H_kv, S_max, D)


class CrossKV:
    """Cross-attention keys/values of one decoder layer, computed from the encoder memory once."""

    def __init__(self) -> None:
        self.k: Tensor | None = None  # (B, H_kv, S_src, D)
        self.v: Tensor | None = None  # (B, H_kv, S_src, D)

    def store(self, k: Tensor, v: Tensor) -> None:
        self.k, self.v = k, v


class KVCache:
    """One `LayerKV` per (decoder) layer, plus one `CrossKV` per layer when the model has cross-attention,
    and the position tables the static decode step indexes (module docstring)."""

    def __init__(self, cfg: ModelConfig, batch_size: int, max_len: int, cross: bool = False,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> None:
        if not 1 <= max_len <= cfg.max_seq_len:
            raise ConfigError(f"KV cache max_len must be in 1..model.max_seq_len={cfg.max_seq_len}, got {max_len}")
        dtype = dtype or torch.get_default_dtype()
        self.layers = [
            LayerKV(batch_size, cfg.kv_heads, max_len, cfg.head_dim, device, dtype) for _ in range(cfg.n_layers)
        ]
        self.cross = [CrossKV() for _ in range(cfg.n_layers)] if cross else None
        self.positions = torch.arange(max_len, device=device)  # (S_max,): every key position
        self.rope = rope_angles(cfg, max_len, device) if cfg.positions == "rope" else None  # (S_max, D) x2
        self.alibi = alibi_slopes(cfg.n_heads).to(device) if cfg.positions == "alibi" else None  # (H,) fp32

    @property
    def max_len(self) -> int:
        return self.positions.shape[0]

    def mark_static(self) -> None:
        """Before compiling a step over this cache: tell torch.compile the buffers keep their address, so
        a CUDA graph (reduce-overhead) may write them in place instead of skipping CUDA graphs for a mutated
        input. guard=False: a new cache of the same shapes reuses the compiled step. Not done for every
        cache because importing torch._dynamo takes seconds."""
        import torch._dynamo

        for layer in self.layers:
            torch._dynamo.mark_static_address(layer.k, guard=False)
            torch._dynamo.mark_static_address(layer.v, guard=False)

    def nbytes(self) -> int:
        """Bytes held by the self-attention buffers (what grows with sequence length)."""
        return sum(layer.k.nbytes + layer.v.nbytes for layer in self.layers)


def kv_cache_bytes_per_token(cfg: ModelConfig, dtype: torch.dtype = torch.bfloat16) -> int:
    """Bytes of KV cache one generated token costs: 2 (K and V) * layers * kv_heads * head_dim * bytes.

    For the encoder-decoder this counts the decoder's self-attention layers (n_layers); the cross-attention
    cache is per *source* token and fixed once the source is encoded, so it does not grow with generation.
    """
    bytes_per_element = torch.empty((), dtype=dtype).element_size()
    return 2 * cfg.n_layers * cfg.kv_heads * cfg.head_dim * bytes_per_element
