"""tfkit models: BERT, GPT and the encoder-decoder Transformer, built from one config.

`build_model(cfg)` is the only constructor the rest of tfkit uses; see ARCHITECTURE.md for the contracts.
"""

from __future__ import annotations

from torch import nn

from .bert import BERT
from .config import ModelConfig
from .gpt import GPT
from .io import load_model, read_config, resolve_checkpoint, save_model
from .kv_cache import KVCache, kv_cache_bytes_per_token
from .sizes import sized_config, size_names
from .transformer import Transformer

FAMILIES: dict[str, type[nn.Module]] = {"bert": BERT, "gpt": GPT, "transformer": Transformer}


def build_model(cfg: ModelConfig) -> nn.Module:
    """A freshly initialised model of family `cfg.arch` (the config is validated first)."""
    cfg.validate()
    return FAMILIES[cfg.arch](cfg)


__all__ = [
    "BERT", "GPT", "KVCache", "ModelConfig", "Transformer", "build_model", "kv_cache_bytes_per_token",
    "load_model", "read_config", "resolve_checkpoint", "save_model", "size_names", "sized_config",
]
