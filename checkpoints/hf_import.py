"""Import a HuggingFace BERT, GPT-2, Llama or Qwen3 folder as a tfkit checkpoint (`tfkit import-hf`); their
`*ForSequenceClassification` as a classifier checkpoint of `tfkit finetune`'s kind (hf_classifier.py).

Works from `config.json` and the raw state dict only (transformers is never imported), so importing needs
nothing beyond tfkit's own dependencies. Every HF option that changes the function the model computes is
either mapped onto a `ModelConfig` field or refused with a ConfigError naming it: a model that imports is
one tfkit computes exactly as transformers does (tests/test_hf_import.py checks logits to 1e-5), GPT-2's
tanh-approximated GELU (`gelu_new`) included: it maps onto `activation: gelu_tanh`.

Weights HF does not have (the MLM head of a bare `BertModel`, the untied LM head of a bare `LlamaModel`,
the pooler of `BertForMaskedLM`) are initialised like tfkit's own init from a fixed seed, so an import is
a pure function of its input and import -> export -> import gives identical tensors (a bare `BertModel`'s
pooler excepted: `BertForMaskedLM`, the export target, has none). Each one is reported as an
`HFInteropWarning`, as is a dropped NSP head.
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import torch
from torch import Tensor

from ..errors import CheckpointError, ConfigError, DataError
from ..files import staged_folder
from ..models import build_model
from ..models.config import ModelConfig, type_problem
from ..models.heads import SequenceClassifier
from ..replacing import TFKIT_MODEL, check_new_folder
from .hf_classifier import split_classifier, take_head_weights
from .hf_names import BASE_PREFIX, RULES, TIED_ALIASES, HFInteropWarning, hf_shape, read_json, split_to_tfkit
from .hf_weights import check_declared_sizes, header_shapes, read_hf_weights
from .hf_tokenizer import import_tokenizer
from .meta import SkipMetaInit, assign_weights, parameters_on_meta
from .weights import save_model

SUPPORTED = {
    "bert": ("BertModel", "BertForMaskedLM", "BertForPreTraining"),
    "gpt2": ("GPT2Model", "GPT2LMHeadModel"),
    "llama": ("LlamaModel", "LlamaForCausalLM", "MistralModel", "MistralForCausalLM"),
    "qwen3": ("Qwen3Model", "Qwen3ForCausalLM"),
}
# Base models of the causal families: an untied lm_head may be missing from these only (BERT's MLM head,
# group "head" too, is initialised whatever the architecture, as before).
BARE_MODELS = ("GPT2Model", "LlamaModel", "MistralModel", "Qwen3Model")
MODEL_TYPES = {"bert": "bert", "gpt2": "gpt2", "llama": "llama", "mistral": "llama", "qwen3": "qwen3"}
# The architecture a config.json without `architectures` is taken for, by model_type.
DEFAULT_ARCHITECTURE = {"bert": "BertForPreTraining", "gpt2": "GPT2LMHeadModel", "llama": "LlamaForCausalLM",
                        "mistral": "MistralForCausalLM", "qwen3": "Qwen3ForCausalLM"}
# HF activation name -> tfkit's; gelu_new / gelu_pytorch_tanh are GPT-2's tanh approximation.
ACTIVATIONS = {"gelu": "gelu", "relu": "relu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh"}
# Buffers some HF versions save next to the weights; derived from the config, never learned.
BUFFERS = re.compile(r"(\.attn\.(masked_)?bias|\.rotary_emb\.inv_freq|\.position_ids)$")
DROPPED = ("cls.seq_relationship.",)  # BERT's next-sentence head: tfkit has no NSP objective
# The type of every HF key the mapping below reads (None where the mapping handles null), checked before the
# mapping does arithmetic or comparisons with them; rope sections' own keys are named `section.key`.
HF_TYPES = {
    **dict.fromkeys(("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                     "max_position_embeddings", "type_vocab_size", "n_embd", "n_layer", "n_head", "n_positions"), int),
    **dict.fromkeys(("layer_norm_eps", "layer_norm_epsilon", "rms_norm_eps", "hidden_dropout_prob",
                     "attention_probs_dropout_prob", "resid_pdrop", "attn_pdrop", "attention_dropout",
                     "initializer_range", "rope_theta", "partial_rotary_factor"), float),
    **dict.fromkeys(("tie_word_embeddings", "is_decoder", "add_cross_attention", "scale_attn_weights",
                     "scale_attn_by_inverse_layer_idx", "attention_bias", "mlp_bias"), bool),
    **dict.fromkeys(("n_inner", "num_key_value_heads", "head_dim", "sliding_window", "pad_token_id"), int | None),
    **dict.fromkeys(("model_type", "hidden_act", "activation_function"), str),
    "position_embedding_type": str | None,
    "architectures": list[str] | None,
    **{f"{section}.{key}": float for section in ("rope_parameters", "rope_scaling")
       for key in ("rope_theta", "partial_rotary_factor")},
}


def _warn(message: str) -> None:
    warnings.warn(message, HFInteropWarning, stacklevel=3)


def _type_problems(hf: dict) -> list[str]:
    """One line per HF key whose value has the wrong JSON type, e.g. `n_layer: got '2', expected an integer`."""
    flat = {**hf, **{f"{section}.{key}": value for section in ("rope_parameters", "rope_scaling")
                     if isinstance(hf.get(section), dict) for key, value in hf[section].items()}}
    return [f"{key}: got {flat[key]!r}, expected {expected}" for key, hint in HF_TYPES.items()
            if key in flat and (expected := type_problem(flat[key], hint))]


def _family(hf: dict, source: str | Path) -> tuple[str, str]:
    """(family, architecture name) of a config.json, or a ConfigError naming the file and what is
    unsupported; a tfkit checkpoint (its config.json has tfkit_version) is named as one, since it needs
    no import."""
    if "tfkit_version" in hf:
        raise ConfigError(f"{source}: this is already a tfkit checkpoint (its config.json has tfkit_version), "
                          "not a HuggingFace model; every tfkit command reads it as it is")
    arch = (hf.get("architectures") or [None])[0]
    family = MODEL_TYPES.get(str(hf.get("model_type")))
    supported = ", ".join(a for archs in SUPPORTED.values() for a in archs)
    if family is None or (arch is not None and arch not in SUPPORTED[family]):
        name = arch or f"model_type={hf.get('model_type')!r}"
        raise ConfigError(f"{source}: {name} is not supported by import-hf (supported: {supported})")
    return family, arch or DEFAULT_ARCHITECTURE[hf["model_type"]]


def _activation(hf: dict, key: str, default: str, problems: list[str]) -> str:
    act = hf.get(key, default)
    if act not in ACTIVATIONS:
        problems.append(f"{key}={act!r} (tfkit has {', '.join(ACTIVATIONS)} for this architecture)")
    return ACTIVATIONS.get(act, "gelu")


def _bert_config(hf: dict, problems: list[str]) -> dict:
    if hf.get("position_embedding_type", "absolute") not in (None, "absolute"):
        problems.append(f"position_embedding_type={hf['position_embedding_type']!r} "
                        "(tfkit BERT has absolute learned positions only)")
    for flag in ("is_decoder", "add_cross_attention"):
        if hf.get(flag):
            problems.append(f"{flag}=true (tfkit BERT is an encoder without cross-attention)")
    return dict(
        arch="bert", d_model=hf["hidden_size"], n_layers=hf["num_hidden_layers"], n_heads=hf["num_attention_heads"],
        d_ff=hf["intermediate_size"], max_seq_len=hf["max_position_embeddings"], positions="learned",
        norm="layernorm", norm_placement="post", norm_eps=hf.get("layer_norm_eps", 1e-12),
        activation=_activation(hf, "hidden_act", "gelu", problems), bias=True,
        tie_embeddings=hf.get("tie_word_embeddings", True), dropout=hf.get("hidden_dropout_prob", 0.1),
        attn_dropout=hf.get("attention_probs_dropout_prob", 0.1), type_vocab_size=hf.get("type_vocab_size", 2),
        pad_token_id=hf.get("pad_token_id", 0),
    )


def _gpt2_config(hf: dict, problems: list[str]) -> dict:
    if not hf.get("scale_attn_weights", True):
        problems.append("scale_attn_weights=false (tfkit always scales attention scores by 1/sqrt(head_dim))")
    for flag in ("scale_attn_by_inverse_layer_idx", "add_cross_attention"):
        if hf.get(flag):
            problems.append(f"{flag}=true (no tfkit equivalent)")
    return dict(
        arch="gpt", d_model=hf["n_embd"], n_layers=hf["n_layer"], n_heads=hf["n_head"], d_ff=hf.get("n_inner"),
        max_seq_len=hf["n_positions"], positions="learned", norm="layernorm", norm_placement="pre",
        norm_eps=hf.get("layer_norm_epsilon", 1e-5), activation=_activation(hf, "activation_function", "gelu_new", problems),
        bias=True, tie_embeddings=hf.get("tie_word_embeddings", True), dropout=hf.get("resid_pdrop", 0.1),
        attn_dropout=hf.get("attn_pdrop", 0.1), type_vocab_size=0, pad_token_id=hf.get("pad_token_id"),
    )


def _rope_theta(hf: dict, problems: list[str]) -> float:
    """rope_theta from transformers 5 (`rope_parameters`) or 4 (`rope_theta` + `rope_scaling`) configs;
    both sections are checked, since a config may carry either or both."""
    sections = {key: hf[key] for key in ("rope_parameters", "rope_scaling") if isinstance(hf.get(key), dict)}
    for key, params in sections.items():
        rope_type = params.get("rope_type", params.get("type", "default"))
        if rope_type != "default":
            problems.append(f"{key}.rope_type={rope_type!r} (tfkit's RoPE has no scaling)")
        if params.get("partial_rotary_factor", 1.0) != 1.0:
            problems.append(f"{key}.partial_rotary_factor={params['partial_rotary_factor']} "
                            "(tfkit rotates the whole head)")
    if hf.get("partial_rotary_factor", 1.0) != 1.0:
        problems.append(f"partial_rotary_factor={hf['partial_rotary_factor']} (tfkit rotates the whole head)")
    return float(sections.get("rope_parameters", {}).get("rope_theta", hf.get("rope_theta", 10000.0)))


def _llama_config(hf: dict, problems: list[str]) -> dict:
    if hf.get("hidden_act", "silu") not in ("silu", "swish"):
        problems.append(f"hidden_act={hf['hidden_act']!r} (tfkit's SwiGLU gates with silu)")
    heads, width = hf["num_attention_heads"], hf["hidden_size"]
    if hf.get("head_dim") not in (None, width // heads):
        problems.append(f"head_dim={hf['head_dim']} (tfkit needs hidden_size / num_attention_heads = {width // heads})")
    attention_bias, mlp_bias = bool(hf.get("attention_bias", False)), bool(hf.get("mlp_bias", False))
    if attention_bias != mlp_bias:
        problems.append(f"attention_bias={attention_bias} with mlp_bias={mlp_bias} (tfkit's `bias` covers both)")
    window = hf.get("sliding_window")
    if window is not None and window >= hf.get("max_position_embeddings", 0):
        window = None  # wider than any sequence: no window
    if window is not None and hf.get("model_type") != "mistral":  # Mistral's windows every layer as tfkit's does
        problems.append(f"sliding_window={window} (tfkit windows every layer only as Mistral does)")
    kv = hf.get("num_key_value_heads") or heads
    return dict(
        arch="gpt", d_model=width, n_layers=hf["num_hidden_layers"], n_heads=heads,
        n_kv_heads=None if kv == heads else kv, d_ff=hf["intermediate_size"],
        max_seq_len=hf["max_position_embeddings"], positions="rope", rope_theta=_rope_theta(hf, problems),
        norm="rmsnorm", norm_placement="pre", norm_eps=hf.get("rms_norm_eps", 1e-6), activation="swiglu",
        bias=attention_bias, tie_embeddings=hf.get("tie_word_embeddings", False), dropout=0.0,
        attn_dropout=hf.get("attention_dropout", 0.0), type_vocab_size=0, pad_token_id=hf.get("pad_token_id"),
        window=window,
    )


def _qwen3_config(hf: dict, problems: list[str]) -> dict:
    """A Llama with per-head RMSNorm on q and k (tfkit's qk_norm) and no MLP biases; its sliding window is
    off unless `use_sliding_window` says otherwise."""
    if hf.get("attention_bias", False):
        problems.append("attention_bias=True (Qwen3's MLP has no biases; tfkit's `bias` covers both)")
    if not hf.get("use_sliding_window", False):
        hf = {**hf, "sliding_window": None}
    return {**_llama_config(hf, problems), "qk_norm": True}


def config_from_hf(hf_config: dict, source: str | Path = "config.json") -> tuple[str, str, ModelConfig]:
    """(family, HF architecture, ModelConfig) for a config.json; ConfigError lists every unsupported option.

    Wrong-typed values are refused first, naming `source` (the file) and the HF key, since the mapping
    would otherwise crash on them (`"2" < 1`) or take them silently (`bool("no")` is True)."""
    wrong = _type_problems(hf_config)
    if wrong:
        raise ConfigError(f"{source}: " + "; ".join(wrong))
    family, arch = _family(hf_config, source)
    problems: list[str] = []
    try:
        fields = {"bert": _bert_config, "gpt2": _gpt2_config, "llama": _llama_config,
                  "qwen3": _qwen3_config}[family](hf_config, problems)
    except KeyError as err:
        raise ConfigError(f"{source} of {arch}: required key {err.args[0]!r} is missing") from None
    if problems:
        raise ConfigError(f"cannot import {arch}: unsupported " + "; ".join(problems))
    fields.update(vocab_size=hf_config["vocab_size"], init_std=hf_config.get("initializer_range", 0.02))
    try:
        return family, arch, ModelConfig(**fields).validate()
    except ConfigError as err:
        raise ConfigError(f"{source} of {arch} maps to an invalid tfkit config: {err}") from None


def _normalise_keys(family: str, hf_state: dict[str, Tensor]) -> dict[str, Tensor]:
    """Keys as in the model with a head: base-model keys prefixed, legacy LayerNorm gamma/beta renamed,
    derived buffers dropped."""
    prefix, heads = BASE_PREFIX[family], ("cls.", "lm_head.")
    has_prefix = any(k.startswith(prefix) for k in hf_state)
    out = {}
    for key, tensor in hf_state.items():
        if BUFFERS.search(key):
            continue
        key = re.sub(r"\.gamma$", ".weight", re.sub(r"\.beta$", ".bias", key))
        out[key if has_prefix or key.startswith(heads) else prefix + key] = tensor
    return out


def _drop_redundant(family: str, cfg: ModelConfig, state: dict[str, Tensor]) -> None:
    """Remove keys that duplicate a tied tensor (equal) or belong to heads tfkit lacks (NSP, with a warning)."""
    tok = state.get(next(r.hf for r in RULES[family](cfg) if r.tfkit == ("embed.tok.weight",)))
    duplicates = {"cls.predictions.decoder.bias": state.get("cls.predictions.bias")}
    if cfg.tie_embeddings:
        duplicates.update({"lm_head.weight": tok, "cls.predictions.decoder.weight": tok})
    consumed = {rule.hf for rule in RULES[family](cfg)}
    for key, original in duplicates.items():
        if key in state and key not in consumed and original is not None:
            if not torch.equal(state[key], original):
                raise CheckpointError(f"{key} differs from the tensor it is tied to (tie_word_embeddings="
                                      f"{cfg.tie_embeddings}); the checkpoint is inconsistent")
            del state[key]
    dropped = [k for k in state if k.startswith(DROPPED)]
    if dropped:
        _warn(f"dropped {', '.join(sorted(dropped))}: the next-sentence-prediction head has no tfkit equivalent")
        for key in dropped:
            del state[key]


def _initialise(cfg: ModelConfig, names: list[str], shapes: dict[str, torch.Size], state: dict[str, Tensor],
                dtype: torch.dtype) -> None:
    """Fill weights HF did not have as tfkit's `normal` init does, from a fixed seed (deterministic)."""
    gen = torch.Generator().manual_seed(0)
    for name in sorted(names):
        if name == TIED_ALIASES["bert"] and cfg.tie_embeddings:
            continue  # tied to the word embeddings below
        if "norm." in name:
            state[name] = (torch.ones if name.endswith("weight") else torch.zeros)(shapes[name], dtype=dtype)
        elif name.endswith(".bias"):
            state[name] = torch.zeros(shapes[name], dtype=dtype)
        else:
            state[name] = (torch.randn(shapes[name], generator=gen) * cfg.init_std).to(dtype)


def hf_to_tfkit(hf_config: dict, hf_state: dict[str, Tensor]) -> tuple[ModelConfig, dict[str, Tensor]]:
    """The tfkit config and state dict (tied names share one tensor) of a HuggingFace model.

    ConfigError for unsupported architectures/options, CheckpointError for missing, unexpected or
    mis-shaped weights. Floating tensors keep the dtype of the word embeddings.
    """
    family, arch, cfg = config_from_hf(hf_config)
    check_declared_sizes(family, cfg, hf_config, {k: tuple(v.shape) for k, v in hf_state.items()}, "config.json")
    return _convert(family, arch, cfg, hf_state)


def _convert(family: str, arch: str, cfg: ModelConfig, hf_state: dict[str, Tensor]) -> tuple[ModelConfig, dict]:
    """hf_to_tfkit once the config is mapped (import_hf maps it before reading the weights)."""
    hf = _normalise_keys(family, hf_state)
    _drop_redundant(family, cfg, hf)
    with torch.device("meta"), SkipMetaInit():
        shapes = {k: v.shape for k, v in build_model(cfg).state_dict().items()}
    state: dict[str, Tensor] = {}
    missing: dict[str, list[str]] = {"body": [], "head": [], "pooler": []}
    misshaped: list[str] = []  # named as in the file: `transformer.h.0.attn.c_attn.weight (64, 64)`
    for rule in RULES[family](cfg):
        if rule.hf not in hf:
            missing[rule.group].append(rule.hf)
        elif tuple(hf[rule.hf].shape) != (expected := hf_shape(rule, shapes)):
            misshaped.append(f"{rule.hf} {tuple(hf.pop(rule.hf).shape)} (expected {expected})")
        else:
            state.update(split_to_tfkit(rule, hf.pop(rule.hf)))
    if family != "bert" and arch not in BARE_MODELS:  # a *ForCausalLM without lm_head is a broken file
        missing["body"], missing["head"] = missing["body"] + missing["head"], []
    if missing["body"]:
        raise CheckpointError(f"{arch} weights are missing: {', '.join(missing['body'])}")
    if hf:
        raise CheckpointError(f"{arch} has weights tfkit has no place for: {', '.join(sorted(hf))}")
    if misshaped:
        raise CheckpointError(f"{arch} weights do not match its config.json: {', '.join(misshaped)}")
    dtype = state["embed.tok.weight"].dtype
    state = {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}
    absent = [n for rule in RULES[family](cfg) if rule.hf in missing["head"] + missing["pooler"] for n in rule.tfkit]
    _initialise(cfg, absent, shapes, state, dtype)
    if missing["head"] and family == "bert":
        tied = " (decoder tied to the word embeddings)" if cfg.tie_embeddings else ""
        _warn(f"{arch} has no MLM head: cls.predictions.* initialised{tied}; train it before trusting MLM logits")
    elif missing["head"]:
        _warn(f"{arch} has no LM head: lm_head.weight initialised (tie_word_embeddings is false, so it is not the "
              "word embeddings); train it before trusting its logits")
    if missing["pooler"]:
        _warn(f"{arch} has no pooler: initialised (only used for fine-tuning on the [CLS] summary)")
    if cfg.tie_embeddings:
        state[TIED_ALIASES[family]] = state["embed.tok.weight"]
    wrong = [f"{k} {tuple(state[k].shape) if k in state else 'absent'} (expected {tuple(s)})"
             for k, s in shapes.items() if k not in state or state[k].shape != s]
    if wrong:
        raise CheckpointError(f"{arch} weights do not match its config.json: {', '.join(wrong)}")
    return cfg, state


def import_hf(src_dir: str | Path, out_dir: str | Path, *, force: bool = False) -> Path:
    """Write the tfkit checkpoint of the HF model folder `src_dir` into `out_dir`; returns `out_dir`.

    The checkpoint's config.json records `imported_from` and `hf_architecture`; the tokenizer files are
    copied (or built from a slow tokenizer's vocab files) so `load_tokenizer(out_dir)` works.
    """
    src, out = Path(src_dir), Path(out_dir)
    if not (src / "config.json").is_file():
        raise CheckpointError(f"{src}: not a HuggingFace model folder (no config.json)")
    check_new_folder(out, [src], force, replaces=(TFKIT_MODEL,))
    hf_config = read_json(src / "config.json")
    name = (hf_config.get("architectures") or [None])[0]
    hf_config, head = split_classifier(hf_config, src / "config.json")  # a *ForSequenceClassification: its head
    family, arch, cfg = config_from_hf(hf_config, src / "config.json")  # fails before the weights are read
    shapes = header_shapes(src)  # declared sizes against the files' headers, before a tensor is read
    if shapes is not None:
        check_declared_sizes(family, cfg, hf_config, shapes, src / "config.json")
    hf_state = read_hf_weights(src)
    if shapes is None:  # pickled weights: their shapes are known once loaded, still before anything is built
        check_declared_sizes(family, cfg, hf_config, {k: tuple(v.shape) for k, v in hf_state.items()},
                             src / "config.json")
    head_state = take_head_weights(family, hf_state, name) if head is not None else {}
    with warnings.catch_warnings():  # a classifier's body is a bare model, whose LM head nothing reads
        if head is not None:
            warnings.filterwarnings("ignore", ".*has no (MLM|LM) head", HFInteropWarning)
        cfg, state = _convert(family, arch, cfg, hf_state)
    with parameters_on_meta():  # no random init of a full-size model
        model = build_model(cfg) if head is None else SequenceClassifier(build_model(cfg), head)
    if head is not None:
        state = {**{f"body.{k}": v for k, v in state.items()}, **head_state}
    assign_weights(model, state, src, f"the {cfg.arch} model mapped from {name or arch}")
    with staged_folder(out) as tmp:  # check_new_folder decided whether an existing `out` may be replaced
        try:
            tokenizer = import_tokenizer(src, tmp)
        except (DataError, CheckpointError) as err:
            _warn(f"tokenizer not imported: {err}")
            tokenizer = None
        if tokenizer is not None and tokenizer.vocab_size > cfg.vocab_size:  # every later command would refuse it
            raise ConfigError(f"{src}: the tokenizer has {tokenizer.vocab_size} tokens, more than the model's "
                              f"vocab_size {cfg.vocab_size} (config.json): ids from {cfg.vocab_size} on have no "
                              "embedding, so nothing was imported; import a folder whose tokenizer fits its model")
        save_model(model, tmp, imported_from=str(src.resolve()), hf_architecture=name or arch)  # a head: the model's
    return out
