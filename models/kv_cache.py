"""The static KV cache used for incremental decoding (GPT and the encoder-decoder's decoder).

Static means pre-allocated once at `(B, H_kv, S_max, D)` per layer and written by index at `start_pos`,
as in gpt-fast: no tensor grows or is concatenated during generation, so memory is known up front and a
decode step has fixed shapes (compile-friendly). The cache is sized by the *key/value* head count, which
is the whole point of GQA/MQA at inference: the cache shrinks by `n_heads / n_kv_heads`.

For the encoder-decoder, cross-attention keys/values depend only on the encoder memory, so each decoder
layer computes them once on the first decode call and reuses them (`CrossKV`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..errors import ConfigError
from .config import ModelConfig


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

    def update(self, k: Tensor, v: Tensor, start_pos: int) -> tuple[Tensor, Tensor]:
        """Write the new keys/values at positions start_pos.. and return every key/value so far."""
        end = start_pos + k.shape[2]
        if end > self.max_len:
            raise ConfigError(
                f"KV cache holds {self.max_len} positions but positions up to {end} were requested; "
                "create it with a larger max_len (at most model.max_seq_len)"
            )
        self.k[:, :, start_pos:end] = k.to(self.k.dtype)
        self.v[:, :, start_pos:end] = v.to(self.v.dtype)
        return self.k[:, :, :end], self.v[:, :, :end]  # (B, H_kv, start_pos+T, D)


class CrossKV:
    """Cross-attention keys/values of one decoder layer, computed from the encoder memory once."""

    def __init__(self) -> None:
        self.k: Tensor | None = None  # (B, H_kv, S_src, D)
        self.v: Tensor | None = None  # (B, H_kv, S_src, D)

    def store(self, k: Tensor, v: Tensor) -> None:
        self.k, self.v = k, v


class KVCache:
    """One `LayerKV` per (decoder) layer, plus one `CrossKV` per layer when the model has cross-attention."""

    def __init__(self, cfg: ModelConfig, batch_size: int, max_len: int, cross: bool = False,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> None:
        if not 1 <= max_len <= cfg.max_seq_len:
            raise ConfigError(f"KV cache max_len must be in 1..model.max_seq_len={cfg.max_seq_len}, got {max_len}")
        dtype = dtype or torch.get_default_dtype()
        self.layers = [
            LayerKV(batch_size, cfg.kv_heads, max_len, cfg.head_dim, device, dtype) for _ in range(cfg.n_layers)
        ]
        self.cross = [CrossKV() for _ in range(cfg.n_layers)] if cross else None

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
