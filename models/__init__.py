"""tfkit models: BERT, GPT and the encoder-decoder Transformer, built from one config.

`build_model(cfg)` is the only constructor the rest of tfkit uses; see ARCHITECTURE.md for the contracts.

Names are imported on first use (PEP 562): `tfkit.models.config` and `tfkit.models.sizes` are plain
Python, and the CLI reads recipes through them, so `tfkit --help` or `tfkit recipes list` must not pay
the seconds that importing torch takes.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import nn

    from .config import ModelConfig

_EXPORTS = {
    "BERT": "bert", "GPT": "gpt", "Transformer": "transformer", "ModelConfig": "config",
    "KVCache": "kv_cache", "kv_cache_bytes_per_token": "kv_cache",
    "sized_config": "sizes", "size_names": "sizes",
}


def model_class(arch: str) -> type[nn.Module]:
    """The class of a family (`bert`, `gpt`, `transformer`)."""
    name = {"bert": "BERT", "gpt": "GPT", "transformer": "Transformer"}[arch]
    return getattr(importlib.import_module(f".{arch}", __name__), name)


def build_model(cfg: ModelConfig) -> nn.Module:
    """A freshly initialised model of family `cfg.arch` (the config is validated first)."""
    cfg.validate()
    return model_class(cfg.arch)(cfg)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["build_model", "model_class", *_EXPORTS]
