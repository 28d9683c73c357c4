"""Small builders shared by the model tests."""

from tfkit.models import ModelConfig


def tiny_cfg(arch: str, **overrides) -> ModelConfig:
    """A model small enough that a test of every arch x position x head layout runs in seconds."""
    base = dict(arch=arch, vocab_size=61, d_model=32, n_layers=2, n_heads=4, max_seq_len=32)
    return ModelConfig(**{**base, **overrides})
