"""A tfkit model as the HuggingFace class that computes the same function: which class a config is exported as
(`export_family`, every field without an equivalent refused by name) and its config.json and state dict
(`tfkit_to_hf`), pure functions of the config and the weights. export-hf writes them as a folder
(hf_export.py), a classifier's body goes through them (hf_classifier.py), and export-gguf maps from them
(gguf_export.py).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..errors import ConfigError
from ..models.config import ModelConfig
from .hf_names import EXPORT_ARCHITECTURE, RULES, join_to_hf

# What each HF class fixes, as (field, allowed values, what HF has); checked in this order.
SCALED = ("attn_scale", ("sqrt_d",), "attention scores scaled by 1/sqrt(head size)")  # every HF family
# QK-norm exports as Qwen3 (per head, before RoPE, as tfkit's), never as OLMo 2: that one normalises q and k
# across all heads at once and places its norms after each sublayer.
PLAIN_QK = ("qk_norm", (False,), "no QK-norm (Qwen3 has it: a gpt with rope, rmsnorm, swiglu and no biases)")
WHOLE_CONTEXT = ("window", (None,), "attention over the whole context (Mistral has a window)")
# What no HF family computes (the lab's options): each is refused by every family, naming the field.
STANDARD = (("attn_score", ("dot",), "dot-product attention scores"),
            ("shared_qk", (False,), "separate query and key projections"),
            ("shared_kv", (False,), "separate key and value projections"),
            ("pad_fill", ("-inf",), "padding masked out exactly (the dtype's minimum added to its scores)"),
            ("residual", (True,), "residual connections"),
            ("share_layers", (False,), "weights of its own in every layer (no cross-layer sharing)"))
EVERY_FAMILY = (SCALED, PLAIN_QK, WHOLE_CONTEXT, *STANDARD)
REQUIREMENTS = {
    "bert": [("positions", ("learned",), "absolute learned positions"), ("norm", ("layernorm",), "LayerNorm"),
             ("norm_placement", ("post",), "post-LN"), ("activation", ("gelu", "gelu_tanh", "relu"), "gelu or relu"),
             ("bias", (True,), "biases everywhere"), ("scale_embeddings", (False,), "unscaled embeddings"), *EVERY_FAMILY],
    "gpt2": [("norm", ("layernorm",), "LayerNorm"), ("norm_placement", ("pre",), "pre-LN"),
             ("activation", ("gelu", "gelu_tanh", "relu"), "gelu or relu"), ("bias", (True,), "biases everywhere"),
             ("scale_embeddings", (False,), "unscaled embeddings"), *EVERY_FAMILY],
    "llama": [("norm", ("rmsnorm",), "RMSNorm"), ("norm_placement", ("pre",), "pre-LN"),
              ("activation", ("swiglu",), "SwiGLU"), ("scale_embeddings", (False,), "unscaled embeddings"), *EVERY_FAMILY],
    "qwen3": [("norm", ("rmsnorm",), "RMSNorm"), ("norm_placement", ("pre",), "pre-LN"),
              ("activation", ("swiglu",), "SwiGLU"), ("bias", (False,), "no MLP biases"),
              ("scale_embeddings", (False,), "unscaled embeddings"), SCALED, WHOLE_CONTEXT, *STANDARD],
    "mistral": [("norm", ("rmsnorm",), "RMSNorm"), ("norm_placement", ("pre",), "pre-LN"),
                ("activation", ("swiglu",), "SwiGLU"), ("bias", (False,), "no biases"),
                ("global_every", (None,), "the window on every layer"),
                ("scale_embeddings", (False,), "unscaled embeddings"), SCALED, PLAIN_QK, *STANDARD],
}
HF_ACTIVATION = {"gelu": "gelu", "relu": "relu", "gelu_tanh": "gelu_new"}  # tfkit name -> transformers name
FAMILY_NAME = {"bert": "bert (BERT)", "gpt2": "gpt with learned positions (GPT-2)",
               "llama": "gpt with rope positions (Llama)", "qwen3": "gpt with rope positions and qk_norm (Qwen3)",
               "mistral": "gpt with rope positions and a window (Mistral)"}


def export_family(cfg: ModelConfig) -> str:
    """The HF family a config is exported as; ConfigError naming every field without an HF equivalent."""
    if cfg.arch == "bert":
        family = "bert"
    elif cfg.arch == "gpt" and cfg.positions in ("learned", "rope"):
        family = "gpt2" if cfg.positions == "learned" else _rope_family(cfg)
    elif cfg.arch == "gpt":
        raise ConfigError(f"model.positions={cfg.positions} has no HuggingFace equivalent for gpt "
                          "(export supports learned -> GPT-2 and rope -> Llama)")
    else:
        raise ConfigError(f"model.arch={cfg.arch} has no HuggingFace equivalent (export supports bert and gpt)")
    problems = [f"model.{name}={getattr(cfg, name)} has no HuggingFace equivalent for {FAMILY_NAME[family]}, "
                f"which has {what}" for name, allowed, what in REQUIREMENTS[family] if getattr(cfg, name) not in allowed]
    if family in ("bert", "gpt2") and cfg.kv_heads != cfg.n_heads:
        problems.append(grouped_kv_problem(family, cfg, regrouped_exports=not problems))
    if problems:
        raise ConfigError("; ".join(problems))
    return family


def _rope_family(cfg: ModelConfig) -> str:
    """The HF class of a gpt with RoPE: Qwen3 for QK-norm, Mistral for a window, Llama otherwise."""
    return "qwen3" if cfg.qk_norm else "mistral" if cfg.window is not None else "llama"


def grouped_kv_problem(family: str, cfg: ModelConfig, regrouped_exports: bool) -> str:
    """Why grouped K/V does not export as BERT or GPT-2, and what does: the same checkpoint regrouped to
    MHA (copying each K/V head to its group computes the same function), when nothing else stands in the
    way, or, for a decoder, a model trained with the recipe keys that make it a Llama, the one HF family
    with grouped K/V (the llama-tiny recipe)."""
    to_mha = (f"; `tfkit convert-mqa-to-gqa CHECKPOINT --kv-heads {cfg.n_heads} --out DIR` regroups it to MHA, "
              "the same function, which exports" if regrouped_exports else "")
    if family == "bert":
        return (f"model.n_kv_heads={cfg.n_kv_heads} has no HuggingFace equivalent for {FAMILY_NAME[family]}: no "
                f"HuggingFace encoder has grouped K/V{to_mha}")
    llama = ["model.positions=rope", *(f"model.{name}={_yaml(allowed[0])}" for name, allowed, _ in REQUIREMENTS["llama"]
                                       if getattr(cfg, name) not in allowed)]
    return (f"model.n_kv_heads={cfg.n_kv_heads} has no HuggingFace equivalent for {FAMILY_NAME[family]}, which "
            f"has multi-head attention only{to_mha}; a Llama exports with grouped K/V: train one with "
            f"{' '.join(llama)} (the llama-tiny recipe)")


def _yaml(value) -> str:
    """A recipe value as an override (SECTION.KEY=VALUE) takes it (YAML: false, not False)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def _hf_config(family: str, cfg: ModelConfig, dtype: torch.dtype) -> dict:
    common = {"architectures": [EXPORT_ARCHITECTURE[family]], "vocab_size": cfg.vocab_size,
              "initializer_range": cfg.init_std, "tie_word_embeddings": cfg.tie_embeddings,
              "pad_token_id": cfg.pad_token_id, "dtype": str(dtype).removeprefix("torch.")}
    if family == "bert":
        return {**common, "model_type": "bert", "hidden_size": cfg.d_model, "num_hidden_layers": cfg.n_layers,
                "num_attention_heads": cfg.n_heads, "intermediate_size": cfg.ffn_dim, "hidden_act": HF_ACTIVATION[cfg.activation],
                "hidden_dropout_prob": cfg.dropout, "attention_probs_dropout_prob": cfg.attn_dropout,
                "max_position_embeddings": cfg.max_seq_len, "type_vocab_size": max(cfg.type_vocab_size, 1),
                "layer_norm_eps": cfg.norm_eps, "position_embedding_type": "absolute"}
    if family == "gpt2":
        return {**common, "model_type": "gpt2", "n_embd": cfg.d_model, "n_layer": cfg.n_layers,
                "n_head": cfg.n_heads, "n_inner": cfg.d_ff,  # None = 4 * n_embd in both
                "n_positions": cfg.max_seq_len,
                "activation_function": HF_ACTIVATION[cfg.activation], "resid_pdrop": cfg.dropout, "embd_pdrop": cfg.dropout,
                "attn_pdrop": cfg.attn_dropout, "layer_norm_epsilon": cfg.norm_eps, "scale_attn_weights": True,
                "bos_token_id": None, "eos_token_id": None}
    llama = {**common, "model_type": "llama", "hidden_size": cfg.d_model, "intermediate_size": cfg.ffn_dim,
             "num_hidden_layers": cfg.n_layers, "num_attention_heads": cfg.n_heads,
             "num_key_value_heads": cfg.kv_heads, "head_dim": cfg.head_dim, "hidden_act": "silu",
             "max_position_embeddings": cfg.max_seq_len, "rms_norm_eps": cfg.norm_eps,
             "rope_theta": cfg.rope_theta, "rope_parameters": _rope_parameters(cfg),
             "attention_bias": cfg.bias, "mlp_bias": cfg.bias, "attention_dropout": cfg.attn_dropout,
             "bos_token_id": None, "eos_token_id": None}
    if family == "llama":
        return llama
    del llama["mlp_bias"]  # neither Qwen3's MLP nor Mistral has biases (the requirements saw to it)
    if family == "mistral":
        del llama["attention_bias"]
        return {**llama, "model_type": "mistral", "sliding_window": cfg.window}
    return {**llama, "model_type": "qwen3", "use_sliding_window": False, "sliding_window": None}


def _rope_parameters(cfg: ModelConfig) -> dict:
    """Llama's `rope_parameters`: tfkit's linear and yarn scaling are transformers' own rope types (the
    trained length of yarn is max_seq_len / rope_factor, YaRN's other values transformers' defaults)."""
    params = {"rope_type": cfg.rope_scaling or "default", "rope_theta": cfg.rope_theta}
    if cfg.rope_scaling is not None:
        params["factor"] = cfg.rope_factor
    if cfg.rope_scaling == "yarn":
        params["original_max_position_embeddings"] = round(cfg.max_seq_len / cfg.rope_factor)
    return params


def tfkit_to_hf(cfg: ModelConfig, state: dict[str, Tensor]) -> tuple[dict, dict[str, Tensor]]:
    """(config.json dict, state dict) of the HF model computing what tfkit's `cfg` + `state` compute.

    Tied weights are stored once, as transformers saves them. A config without an HF equivalent is a
    ConfigError naming the fields; a state that does not fit the config is a KeyError naming the tensor.
    """
    family = export_family(cfg)
    state = dict(state)
    if family == "bert" and cfg.type_vocab_size == 0:
        # HF BERT always adds a segment embedding; one zero row adds nothing, so the function is unchanged.
        cfg = ModelConfig(**{**cfg.to_dict(), "type_vocab_size": 1})
        state["embed.seg.weight"] = state["embed.tok.weight"].new_zeros(1, cfg.d_model)
    hf_state: dict[str, Tensor] = {}
    stored: set[int] = set()
    for rule in RULES[family](cfg):
        if rule.group != "pooler":
            tensor = join_to_hf(rule, state)
            # safetensors refuses two names for one memory (untied BERT stores its output bias twice)
            hf_state[rule.hf] = tensor.clone() if tensor.data_ptr() in stored else tensor
            stored.add(tensor.data_ptr())
    dtype = state["embed.tok.weight"].dtype
    return _hf_config(family, cfg, dtype), hf_state
