"""Named model sizes per architecture: `tiny` (trains in seconds on a CPU, for CI and smoke runs) and
`small` (the published base models, so parameter counts can be checked against the papers).

A size is just a dict of ModelConfig fields; `sized_config` applies a recipe's overrides on top.
"""

from __future__ import annotations

from dataclasses import fields

from ..errors import ConfigError
from .config import ARCHS, ModelConfig

_TINY = dict(vocab_size=8192, d_model=128, n_layers=2, n_heads=4, max_seq_len=256)

SIZES: dict[str, dict[str, dict]] = {
    "gpt": {
        "tiny": dict(_TINY, arch="gpt"),
        # GPT-2 124M (Radford et al. 2019): learned positions, pre-LN, tanh-approximated GELU, tied head, biases.
        "small": dict(arch="gpt", vocab_size=50257, d_model=768, n_layers=12, n_heads=12, max_seq_len=1024,
                      positions="learned", norm="layernorm", norm_placement="pre", activation="gelu_tanh",
                      bias=True, tie_embeddings=True, dropout=0.1, attn_dropout=0.1, norm_eps=1e-5),
    },
    "bert": {
        "tiny": dict(_TINY, arch="bert", norm_placement="post", norm_eps=1e-12),
        # BERT-base (Devlin et al. 2019): post-LN, GELU, 2 segment types, MLM decoder tied to the embeddings.
        "small": dict(arch="bert", vocab_size=30522, d_model=768, n_layers=12, n_heads=12, d_ff=3072,
                      max_seq_len=512, positions="learned", norm="layernorm", norm_placement="post",
                      activation="gelu", bias=True, tie_embeddings=True, type_vocab_size=2,
                      dropout=0.1, attn_dropout=0.1, norm_eps=1e-12),
    },
    "transformer": {
        "tiny": dict(_TINY, arch="transformer", positions="sinusoidal", norm_placement="post",
                     activation="relu", scale_embeddings=True, init="xavier"),
        # The base model of "Attention Is All You Need" (Vaswani et al. 2017): 6+6 layers, sinusoidal
        # positions, post-LN, ReLU, embeddings scaled by sqrt(d_model) and shared by encoder, decoder and
        # output projection (37k shared BPE vocabulary), dropout 0.1 on embeddings and residual branches.
        "small": dict(arch="transformer", vocab_size=37000, d_model=512, n_layers=6, n_heads=8, d_ff=2048,
                      max_seq_len=512, positions="sinusoidal", norm="layernorm", norm_placement="post",
                      activation="relu", bias=True, tie_embeddings=True, scale_embeddings=True,
                      dropout=0.1, attn_dropout=0.0, init="xavier"),
    },
}


def size_names(arch: str) -> list[str]:
    if arch not in SIZES:
        raise ConfigError(f"model.arch: got {arch!r}, expected one of {', '.join(ARCHS)}")
    return list(SIZES[arch])


def sized_config(arch: str, size: str, **overrides) -> ModelConfig:
    """The named size of `arch` with `overrides` (ModelConfig fields) applied, validated."""
    names = size_names(arch)
    if size not in names:
        raise ConfigError(f"model.size: unknown size {size!r} for arch {arch!r}, expected one of {', '.join(names)}")
    known = {f.name for f in fields(ModelConfig)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise ConfigError(f"model: unknown keys {', '.join(unknown)}")
    if overrides.get("arch", arch) != arch:
        raise ConfigError(f"model.arch: override {overrides['arch']!r} contradicts the requested arch {arch!r}")
    return ModelConfig(**{**SIZES[arch][size], **overrides}).validate()
