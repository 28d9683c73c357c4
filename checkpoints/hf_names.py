"""Weight-name maps between tfkit and HuggingFace BERT, GPT-2, Llama and Qwen3, written once for both directions.

Import and export read the same table, so a name fixed in one direction is fixed in the other, and the
round trip HF -> tfkit -> HF is exact by construction. Each `Rule` pairs one HuggingFace tensor with one
or more tfkit tensors:
- `transpose`: GPT-2 stores its linears as `Conv1D` with weights (in, out), tfkit as `nn.Linear` (out, in).
- several tfkit names: HF fuses them along the output dimension (GPT-2's `c_attn` = q | k | v).
- `group`: "body" (always required), "head" (BERT's MLM head, absent from a bare `BertModel`; the untied
  `lm_head`, absent from a bare `GPT2Model` / `LlamaModel`) or "pooler" (BERT's [CLS] pooler, absent from
  `BertForMaskedLM` and never exported, see hf_export.py).

Names carry the prefix of the model *with* a head (`bert.`, `transformer.`, `model.`); import adds it to
the keys of a base model (`BertModel`, `GPT2Model`) first. Llama's RoPE needs no q/k permutation: HF
stores q/k in the rotate-half layout, which is the layout tfkit's `apply_rope` uses.

The folder helper both directions share (JSON reading) lives here too; what `--out` may replace is
decided in files.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from ..errors import CheckpointError
from ..jsonfile import read_json as read_guarded
from ..layout import EXPORT_ARCHITECTURES
from ..models.config import ModelConfig

# The HF model class each family is exported as (layout.py: files.py recognises an export by it).
EXPORT_ARCHITECTURE = EXPORT_ARCHITECTURES
# What a base model's keys are prefixed with inside the model with a head.
BASE_PREFIX = {"bert": "bert.", "gpt2": "transformer.", "llama": "model.", "qwen3": "model.", "mistral": "model."}


class HFInteropWarning(UserWarning):
    """The conversion worked but is not a pure copy (e.g. a head was initialised, an activation approximated)."""


@dataclass(frozen=True)
class Rule:
    hf: str  # full HuggingFace name, e.g. "transformer.h.0.attn.c_attn.weight"
    tfkit: tuple[str, ...]  # tfkit names; several = fused along dim 0 of the (out, in) Linear layout
    transpose: bool = False  # HF stores (in, out) (GPT-2 Conv1D)
    group: str = "body"  # body | head | pooler


def _pair(hf: str, tfkit: str, bias: bool, group: str = "body", transpose: bool = False) -> list[Rule]:
    """`weight` (and `bias` when the layer has one) of one module."""
    rules = [Rule(f"{hf}.weight", (f"{tfkit}.weight",), transpose, group)]
    if bias:
        rules.append(Rule(f"{hf}.bias", (f"{tfkit}.bias",), False, group))
    return rules


def bert_rules(cfg: ModelConfig) -> list[Rule]:
    """BertForMaskedLM (+ the pooler of BertModel / BertForPreTraining) <-> tfkit BERT (post-LN)."""
    p = BASE_PREFIX["bert"]
    rules = _pair(f"{p}embeddings.word_embeddings", "embed.tok", False)
    rules += _pair(f"{p}embeddings.position_embeddings", "embed.pos", False)
    if cfg.type_vocab_size:
        rules += _pair(f"{p}embeddings.token_type_embeddings", "embed.seg", False)
    rules += _pair(f"{p}embeddings.LayerNorm", "embed.norm", True)
    for i in range(cfg.n_layers):
        hf, tf = f"{p}encoder.layer.{i}.", f"blocks.{i}."
        for hf_name, tf_name in (("attention.self.query", "attn.q_proj"), ("attention.self.key", "attn.k_proj"),
                                 ("attention.self.value", "attn.v_proj"), ("attention.output.dense", "attn.o_proj"),
                                 ("attention.output.LayerNorm", "norm_attn"), ("intermediate.dense", "ffn.up"),
                                 ("output.dense", "ffn.down"), ("output.LayerNorm", "norm_ffn")):
            rules += _pair(hf + hf_name, tf + tf_name, True)
    rules += _pair(f"{p}pooler.dense", "pooler", True, group="pooler")
    rules += _pair("cls.predictions.transform.dense", "mlm.dense", True, group="head")
    rules += _pair("cls.predictions.transform.LayerNorm", "mlm.norm", True, group="head")
    rules.append(Rule("cls.predictions.bias", ("mlm.decoder.bias",), group="head"))
    if not cfg.tie_embeddings:  # transformers ties decoder.bias to predictions.bias only with the weights
        rules.append(Rule("cls.predictions.decoder.weight", ("mlm.decoder.weight",), group="head"))
        rules.append(Rule("cls.predictions.decoder.bias", ("mlm.decoder.bias",), group="head"))
    return rules


def gpt2_rules(cfg: ModelConfig) -> list[Rule]:
    """GPT2LMHeadModel <-> tfkit GPT with learned positions, pre-LN LayerNorm, biases."""
    p = BASE_PREFIX["gpt2"]
    rules = _pair(f"{p}wte", "embed.tok", False) + _pair(f"{p}wpe", "embed.pos", False)
    for i in range(cfg.n_layers):
        hf, tf = f"{p}h.{i}.", f"blocks.{i}."
        qkv = tuple(f"{tf}attn.{name}_proj" for name in "qkv")
        rules.append(Rule(f"{hf}attn.c_attn.weight", tuple(f"{n}.weight" for n in qkv), transpose=True))
        rules.append(Rule(f"{hf}attn.c_attn.bias", tuple(f"{n}.bias" for n in qkv)))
        rules += _pair(f"{hf}attn.c_proj", f"{tf}attn.o_proj", True, transpose=True)
        rules += _pair(f"{hf}ln_1", f"{tf}norm_attn", True) + _pair(f"{hf}ln_2", f"{tf}norm_ffn", True)
        rules += _pair(f"{hf}mlp.c_fc", f"{tf}ffn.up", True, transpose=True)
        rules += _pair(f"{hf}mlp.c_proj", f"{tf}ffn.down", True, transpose=True)
    rules += _pair(f"{p}ln_f", "ln_f", True)
    if not cfg.tie_embeddings:
        rules += _pair("lm_head", "lm_head", False, group="head")
    return rules


def llama_rules(cfg: ModelConfig) -> list[Rule]:
    """LlamaForCausalLM <-> tfkit GPT with RoPE, pre-LN RMSNorm, SwiGLU (biases when cfg.bias); with
    cfg.qk_norm, Qwen3ForCausalLM (the same names plus each layer's per-head q_norm / k_norm); with a
    window, MistralForCausalLM (the same names)."""
    p = BASE_PREFIX["llama"]
    rules = _pair(f"{p}embed_tokens", "embed.tok", False)
    for i in range(cfg.n_layers):
        hf, tf = f"{p}layers.{i}.", f"blocks.{i}."
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            rules += _pair(f"{hf}self_attn.{name}", f"{tf}attn.{name}", cfg.bias)
        if cfg.qk_norm:
            rules += _pair(f"{hf}self_attn.q_norm", f"{tf}attn.q_norm", False)
            rules += _pair(f"{hf}self_attn.k_norm", f"{tf}attn.k_norm", False)
        for hf_name, tf_name in (("gate_proj", "gate"), ("up_proj", "up"), ("down_proj", "down")):
            rules += _pair(f"{hf}mlp.{hf_name}", f"{tf}ffn.{tf_name}", cfg.bias)
        rules += _pair(f"{hf}input_layernorm", f"{tf}norm_attn", False)
        rules += _pair(f"{hf}post_attention_layernorm", f"{tf}norm_ffn", False)
    rules += _pair(f"{p}norm", "ln_f", False)
    if not cfg.tie_embeddings:
        rules += _pair("lm_head", "lm_head", False, group="head")
    return rules


RULES = {"bert": bert_rules, "gpt2": gpt2_rules, "llama": llama_rules, "qwen3": llama_rules, "mistral": llama_rules}

# tfkit names that are the same tensor as another one when embeddings are tied (not stored by HF).
TIED_ALIASES = {"bert": "mlm.decoder.weight", "gpt2": "lm_head.weight", "llama": "lm_head.weight",
                "qwen3": "lm_head.weight", "mistral": "lm_head.weight"}


def split_to_tfkit(rule: Rule, tensor: Tensor) -> dict[str, Tensor]:
    """One HF tensor -> its tfkit tensor(s), each owning contiguous memory (safetensors refuses to save
    tensors that are slices of a larger storage)."""
    t = tensor.T if rule.transpose else tensor  # (out, in) Linear layout
    if len(rule.tfkit) == 1:
        return {rule.tfkit[0]: t.contiguous()}
    return {name: part.clone(memory_format=torch.contiguous_format) for name, part in zip(rule.tfkit, t.chunk(len(rule.tfkit), dim=0))}


def hf_shape(rule: Rule, tfkit_shapes: dict[str, torch.Size]) -> tuple[int, ...]:
    """The shape of a rule's tensor as HF stores it (what join_to_hf makes of tfkit tensors of these shapes),
    so that a mis-shaped tensor is reported under the name and in the shape the file has."""
    parts = [tuple(tfkit_shapes[name]) for name in rule.tfkit]
    shape = (sum(part[0] for part in parts), *parts[0][1:])  # fused along dim 0 of the (out, in) layout
    return shape[::-1] if rule.transpose else shape


def join_to_hf(rule: Rule, tensors: dict[str, Tensor]) -> Tensor:
    """The tfkit tensor(s) of a rule -> the one HF tensor (fused and/or transposed as HF stores it)."""
    t = torch.cat([tensors[name] for name in rule.tfkit], dim=0) if len(rule.tfkit) > 1 else tensors[rule.tfkit[0]]
    return (t.T if rule.transpose else t).contiguous()


def read_json(file: Path) -> dict:
    """A JSON object from a file of an HF folder; CheckpointError naming the file when it is unreadable,
    too deeply nested or not an object (the guarded reader, jsonfile.py)."""
    return read_guarded(file, CheckpointError)
