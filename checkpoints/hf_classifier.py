"""Fine-tuned classifiers to and from HuggingFace `*ForSequenceClassification` folders (export-hf, import-hf).

The body's weights go through the language models' name tables (hf_names.py) and its LM / MLM head is
left out; the task head is mapped here, and only when HF's class computes the same function:
- bert -> `BertForSequenceClassification`: BERT's [CLS] pooler (`bert.pooler.dense`) then `classifier`
  (with a bias). tfkit's `pooling: mean` has no HF equivalent (HF pools [CLS] only) and is refused.
- gpt -> `GPT2ForSequenceClassification`, or `LlamaForSequenceClassification` (Qwen3's, Mistral's) for the
  RoPE layouts: the last real token, then `score`, which has no bias. HF finds that token as the rightmost
  one that is not `pad_token_id`, so config.json gets the tokenizer's pad id (the id tfkit fine-tuning pads
  with). A classifier on a bias-free body (a Llama's) has no bias either, as `score`; a GPT-2's has one,
  folded into its final LayerNorm bias (`fold_bias`). An older Llama classifier with a non-zero bias is
  refused: its RMSNorm has none to carry it, and dropping it would change every logit.
config.json carries `id2label` / `label2id` / `num_labels` / `problem_type` (`single_label_classification`
or `regression`), which is also what import reads back; a multi-label head has no tfkit equivalent.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
from torch import Tensor

from ..errors import CheckpointError, ConfigError
from ..layout import CLASSIFIER_EXPORT_ARCHITECTURES
from ..models.config import ModelConfig
from ..models.heads import HeadConfig
from .hf_names import RULES, HFInteropWarning
from .hf_state import export_family, tfkit_to_hf

# The HF class each family's classifier is exported as (layout.py: files.py recognises an export by it).
CLASSIFIER_ARCHITECTURES = CLASSIFIER_EXPORT_ARCHITECTURES
# The bare model each classifier's body is read as by import (its keys carry the same prefix).
BODY_ARCHITECTURES = {"bert": "BertModel", "gpt2": "GPT2Model", "llama": "LlamaModel", "qwen3": "Qwen3Model",
                      "mistral": "MistralModel"}
HF_POOLING = {"bert": ("cls", "the [CLS] token through BERT's pooler")}  # every other family: the last real token
LAST_TOKEN = ("last", "the last token that is not pad_token_id")
PROBLEM_TYPES = {"classification": "single_label_classification", "regression": "regression"}


def _head_names(family: str) -> dict[str, str]:
    """HF name -> tfkit name of the head's weights (the BERT pooler is the body's, under `body.`)."""
    if family == "bert":
        return {"bert.pooler.dense.weight": "body.pooler.weight", "bert.pooler.dense.bias": "body.pooler.bias",
                "classifier.weight": "classifier.weight", "classifier.bias": "classifier.bias"}
    return {"score.weight": "classifier.weight"}


def check_pooling(family: str, cfg: ModelConfig, head: HeadConfig) -> None:
    """ConfigError when HF's classifier of `family` pools another vector than this head."""
    pooling, (hf_pooling, what) = head.pooling_for(cfg.arch), HF_POOLING.get(family, LAST_TOKEN)
    if pooling != hf_pooling:
        raise ConfigError(f"head.pooling={pooling} has no HuggingFace equivalent: {CLASSIFIER_ARCHITECTURES[family]} "
                          f"pools {what}; fine-tune with task.pooling: {hf_pooling} to export")


def export_problem(cfg: ModelConfig, head: HeadConfig) -> str | None:
    """Why a classifier of this body and head could not be exported as a `*ForSequenceClassification` (the
    body's family has no HF class, or the head pools another vector), naming the key that changes it; None
    when it can be. Said at the start of a fine-tune, not found after it."""
    try:
        check_pooling(export_family(cfg), cfg, head)
    except ConfigError as err:
        return str(err)
    return None


def fold_bias(family: str, state: dict[str, Tensor]) -> dict[str, Tensor]:
    """`state` with a decoder's classifier bias moved where HF's bias-free `score` computes it.

    GPT-2's final LayerNorm has a bias which nothing but the score reads, so the classifier's bias b
    becomes ln_f's bias + delta with W delta = b (W (N, C), rank N <= C): the same logits, the exported
    last hidden states shifted by delta (an HFInteropWarning says so). Llama's RMSNorm has no bias: a
    non-zero classifier bias there is a ConfigError."""
    bias = state.get("classifier.bias")  # (N,), or None: a head without one
    if family == "bert" or bias is None or not bool(bias.ne(0).any()):
        return state
    name = CLASSIFIER_ARCHITECTURES[family]
    if family == "gpt2":
        weight = state["classifier.weight"].double()  # (N, C)
        delta = torch.linalg.pinv(weight) @ bias.double()  # (C,), the least-norm solution
        if torch.allclose(weight @ delta, bias.double(), rtol=1e-6, atol=1e-7):
            warnings.warn(f"classifier.bias folded into transformer.ln_f.bias ({name}'s score has no bias): the "
                          "same logits; the exported last hidden states are shifted by a constant vector",
                          HFInteropWarning, stacklevel=3)
            ln_f = state["body.ln_f.bias"]
            return {**state, "body.ln_f.bias": (ln_f.double() + delta).to(ln_f.dtype),
                    "classifier.bias": torch.zeros_like(bias)}
    raise ConfigError(f"classifier.bias is not zero (largest |value| {bias.abs().max().item():.3g}) and {name}'s "
                      "score has no bias, nor its final norm one to carry it: the export would compute other logits")


def classifier_to_hf(family: str, cfg: ModelConfig, head: HeadConfig, state: dict[str, Tensor],
                     pad_id: int | None, row_end: int | None = None) -> tuple[dict, dict[str, Tensor]]:
    """(config.json dict, state dict) of the HF classifier computing what the tfkit classifier computes;
    `pad_id` is the id the classifier's rows are padded with and `row_end` the one they end with (the
    tokenizer's pad and EOS / [SEP], tokenization/task_batches.py)."""
    check_pooling(family, cfg, head)
    state = fold_bias(family, state)
    name = CLASSIFIER_ARCHITECTURES[family]
    if family != "bert" and pad_id is None:
        raise ConfigError(f"{name} finds each row's last token by its pad_token_id, and the checkpoint has "
                          "neither a tokenizer with a padding token nor model.pad_token_id")
    if family != "bert" and pad_id == row_end:
        raise ConfigError(f"the tokenizer pads with id {pad_id}, the id that ends every row: {name} finds the "
                          "last token as the last one that is not pad_token_id, so it would pool another token")
    body = {name.removeprefix("body."): tensor for name, tensor in state.items() if name.startswith("body.")}
    hf_config, hf_state = tfkit_to_hf(cfg, body)
    for rule in RULES[family](cfg):  # the LM / MLM head: HF's classifier has none
        if rule.group == "head":
            hf_state.pop(rule.hf, None)
    if "classifier.bias" not in state:  # BERT's classifier has a bias: a head without one computes with zeros
        state = {**state, "classifier.bias": torch.zeros_like(state["classifier.weight"][:, 0])}
    hf_state.update({hf: state[name].contiguous() for hf, name in _head_names(family).items()})
    labels = head.labels or ("LABEL_0",)  # a regressor's one output, named as transformers names it
    hf_config.update(architectures=[CLASSIFIER_ARCHITECTURES[family]], num_labels=head.num_labels,
                     id2label={str(i): name for i, name in enumerate(labels)},
                     label2id={name: i for i, name in enumerate(labels)},
                     problem_type=PROBLEM_TYPES[head.task], pad_token_id=pad_id)
    if family == "bert":
        hf_config["classifier_dropout"] = head.dropout
    return hf_config, hf_state


def split_classifier(hf_config: dict, source: str | Path) -> tuple[dict, HeadConfig | None]:
    """(config.json of the body, as its bare model; the head) of a `*ForSequenceClassification` config;
    any other config comes back as it is, with no head."""
    arch = (hf_config.get("architectures") or [None])[0]
    if not isinstance(arch, str) or not arch.endswith("ForSequenceClassification"):
        return hf_config, None
    family = next((f for f, name in CLASSIFIER_ARCHITECTURES.items() if name == arch), None)
    if family is None:
        raise ConfigError(f"{source}: {arch} is not supported by import-hf (supported classifiers: "
                          f"{', '.join(CLASSIFIER_ARCHITECTURES.values())})")
    problem, id2label = hf_config.get("problem_type"), hf_config.get("id2label") or {}
    if problem not in (None, *PROBLEM_TYPES.values()):
        raise ConfigError(f"{source}: problem_type={problem!r} has no tfkit equivalent (tfkit heads are "
                          "single_label_classification or regression)")
    regression = problem == "regression" or (problem is None and len(id2label) == 1)
    dropout = hf_config.get("classifier_dropout") if family == "bert" else 0.0
    if dropout is None:  # BERT's classifier then uses hidden_dropout_prob
        dropout = hf_config.get("hidden_dropout_prob", 0.1)
    head = HeadConfig.from_dict({"task": "regression" if regression else "classification", "dropout": dropout,
                                 "id2label": {} if regression else id2label, "bias": family == "bert"}, str(source))
    return {**hf_config, "architectures": [BODY_ARCHITECTURES[family]]}, head


def take_head_weights(family: str, hf_state: dict[str, Tensor], arch: str) -> dict[str, Tensor]:
    """The classifier's weights (tfkit names), removed from `hf_state`; CheckpointError naming those missing.
    GPT-2's and Llama's `score` has no bias, nor has the head `split_classifier` reads for them."""
    names = _head_names(family)
    missing = [hf for hf in names if hf not in hf_state]
    if missing:
        raise CheckpointError(f"{arch} weights are missing: {', '.join(missing)}")
    # BERT's pooler stays: the body's conversion reads it (hf_names.py's "pooler" rules)
    return {name: hf_state.pop(hf) for hf, name in names.items() if not name.startswith("body.")}
