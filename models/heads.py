"""Task heads: a pretrained body of any family, one vector per sequence, dropout and one Linear.

The conventions are HuggingFace's, so a tfkit classifier means what one means elsewhere:
- bert, pooling `cls`: BERT's pooler, tanh(dense(hidden of [CLS])) (the body's own `pooler`, as
  `BertPooler`), then dropout and `classifier`: `BertForSequenceClassification`'s function exactly
  (tests/test_models_heads.py copies the weights of one and compares logits). tfkit's MLM pretraining does
  not train the pooler, nor does BERT's without NSP: fine-tuning does;
- gpt, pooling `last`: the hidden state of the last real token, the only one that has read the whole
  text (`GPT2ForSequenceClassification`; it has no dropout and no bias: give `dropout: 0` and the
  classifier starts with a zero bias, so a copied GPT-2 head computes the same);
- transformer: its encoder, mean-pooled (the decoder is not used);
- pooling `mean`, for bert and gpt: the average over real tokens (Sentence-BERT's pooling).
Padding is whatever `attention_mask` says (right padding: a causal model's real tokens then never see
it), and no pooling reads a padded position, so a text's logits do not depend on what it is batched with.
A packed batch (bert and gpt; tokenization/task_packing.py) holds several examples per row: attention
stays inside each (`example_ids` as the body's doc_ids), positions restart at each, and the pooling reads
each example's positions (`starts`, `lengths`), so its logits are the padded layout's.

`HeadConfig` (head_config.py) is what a checkpoint's config.json keeps beside the model's.
"""

from __future__ import annotations

from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..errors import ConfigError
from ..tokenization.task_packing import PACKED_KEYS
from .head_config import HeadConfig

# The body's modules a classifier never computes with, by family (`SequenceClassifier.unused_parameters`).
IDLE_MODULES = {"bert": ("mlm",), "gpt": ("lm_head",), "transformer": ("tgt_embed", "decoder", "dec_norm", "lm_head")}


def mean_pool(hidden: Tensor, attention_mask: Tensor | None) -> Tensor:
    """The average of the real tokens' states: hidden (B, T, C), mask (B, T) bool -> (B, C)."""
    if attention_mask is None:
        return hidden.mean(dim=1)
    real = attention_mask.unsqueeze(-1).to(hidden.dtype)  # (B, T, 1)
    return (hidden * real).sum(dim=1) / real.sum(dim=1).clamp(min=1.0)  # (B, C)


def last_pool(hidden: Tensor, attention_mask: Tensor | None) -> Tensor:
    """The state of each row's last real token (the rightmost True of the mask): (B, T, C) -> (B, C).
    Found on the device, as HF finds it, so nothing is read back to the host."""
    if attention_mask is None:
        return hidden[:, -1]
    positions = torch.arange(hidden.shape[1], device=hidden.device)  # (T,)
    last = (positions * attention_mask.long()).argmax(dim=-1)  # (B,)
    return hidden[torch.arange(hidden.shape[0], device=hidden.device), last]  # (B, C)


class SequenceClassifier(nn.Module):
    """`body` (a tfkit BERT, GPT or Transformer) + pooling + dropout + `classifier` -> logits (B, num_labels)."""

    def __init__(self, body: nn.Module, head: HeadConfig) -> None:
        super().__init__()
        cfg = body.config
        problems = head.problems(cfg.arch)
        if problems:
            raise ConfigError("; ".join(problems))
        head = replace(head, bias=cfg.bias if head.bias is None else head.bias)  # config.json records the choice
        self.body, self.head_config, self.pooling = body, head, head.pooling_for(cfg.arch)
        self.drop = nn.Dropout(head.dropout)
        self.classifier = nn.Linear(cfg.d_model, head.num_labels, bias=head.bias)
        nn.init.normal_(self.classifier.weight, 0.0, cfg.init_std)  # as HF initialises its heads
        if head.bias:
            nn.init.zeros_(self.classifier.bias)

    @property
    def config(self):
        return self.body.config

    def num_params(self, non_embedding: bool = False) -> int:
        return self.body.num_params(non_embedding) + sum(p.numel() for p in self.classifier.parameters())

    def flops_per_token(self, seq_len: int) -> int:
        """The body's count (its output head included, which a classifier skips: an upper bound)."""
        return self.body.flops_per_token(seq_len)

    def pooled(self, input_ids: Tensor, attention_mask: Tensor | None = None, token_type_ids: Tensor | None = None,
               *, position_ids: Tensor | None = None, example_ids: Tensor | None = None,
               starts: Tensor | None = None, lengths: Tensor | None = None) -> Tensor:
        """input_ids (B, T), attention_mask (B, T) bool True = real, token_type_ids (B, T) (bert) -> (B, C).
        Packed rows (R, T) of E examples: position_ids and example_ids (R, T), starts and lengths (E,) -> (E, C)."""
        arch = self.body.config.arch
        if token_type_ids is not None and arch != "bert":
            raise ValueError(f"token_type_ids are BERT's segments; a {arch} model has none")
        packing = (position_ids, example_ids, starts, lengths)
        if any(t is not None for t in packing) and (arch == "transformer" or any(t is None for t in packing)):
            raise ValueError("packed rows need position_ids, example_ids, starts and lengths together, on a bert or "
                             f"gpt body (this one is {arch})")
        if example_ids is not None and attention_mask is None and self.body.config.norm == "batchnorm":
            attention_mask = example_ids < starts.shape[0]  # (R, T): BatchNorm's statistics skip row-end padding
        if arch == "bert":
            hidden = self.body.encode(input_ids, attention_mask, token_type_ids, doc_ids=example_ids,
                                      position_ids=position_ids)  # (B, T, C)
        elif arch == "gpt":
            hidden = self.body(input_ids, attention_mask=attention_mask, head=False, doc_ids=example_ids,
                               position_ids=position_ids)  # (B, T, C)
        else:
            hidden = self.body.encode(input_ids, attention_mask)  # (B, T, C)
        if example_ids is not None:
            return self._pooled_packed(hidden, example_ids, starts, lengths)
        if self.pooling == "cls":
            return self.body.pooled(hidden)  # (B, C)
        if self.pooling == "last":
            return last_pool(hidden, attention_mask)
        return mean_pool(hidden, attention_mask)

    def _pooled_packed(self, hidden: Tensor, example_ids: Tensor, starts: Tensor, lengths: Tensor) -> Tensor:
        """The pooled vector (E, C) of each example of packed rows, from hidden (R, T, C): its first position
        (BERT's pooler over [CLS]), its last (a GPT's last real token), or the mean of its positions."""
        flat = hidden.flatten(0, 1)  # (R*T, C)
        if self.pooling == "cls":
            return self.body.pooled(flat[starts].unsqueeze(1))  # (E, 1, C) -> (E, C)
        if self.pooling == "last":
            return flat[starts + lengths - 1]  # (E, C)
        count = starts.shape[0]
        sums = flat.new_zeros(count + 1, flat.shape[1], dtype=torch.float32)  # (E + 1, C): row E gathers padding
        sums.index_add_(0, example_ids.flatten(), flat.float())
        return (sums[:count] / lengths.unsqueeze(1)).to(hidden.dtype)  # (E, C)

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, token_type_ids: Tensor | None = None,
                **packing: Tensor) -> Tensor:
        """Logits (B, N), or (E, N) of packed rows (`packing`: pooled's keyword arguments)."""
        return self.classifier(self.drop(self.pooled(input_ids, attention_mask, token_type_ids, **packing)))

    def unused_parameters(self) -> list[nn.Parameter]:
        """The body's parameters no pooled vector is computed with: its pretraining head (BERT's MLM head, a
        decoder's LM head), the encoder-decoder's decoder side, and BERT's pooler under another pooling. A
        tensor shared with what is used (a tied embedding) is not one of them. The trainer freezes them:
        DDP waits for a gradient of every trainable parameter, and would wait for these forever."""
        arch = self.body.config.arch
        idle = [f"body.{name}." for name in IDLE_MODULES[arch] if getattr(self.body, name, None) is not None]
        if arch == "bert" and self.pooling != "cls":
            idle.append("body.pooler.")
        used, unused = set(), {}
        for name, param in self.named_parameters(remove_duplicate=False):  # a tied tensor under each name
            if name.startswith(tuple(idle)):
                unused[id(param)] = param
            else:
                used.add(id(param))
        return [param for key, param in unused.items() if key not in used]


INPUT_KEYS = ("input_ids", "attention_mask", "token_type_ids", *PACKED_KEYS)


def classifier_inputs(batch: dict[str, Tensor]) -> dict[str, Tensor]:
    """The arguments of `SequenceClassifier.forward` a task batch carries, padded or packed (its labels
    and anything else left out)."""
    return {key: batch[key] for key in INPUT_KEYS if key in batch}


def pool_windows(logits: Tensor, owners: Tensor, num_examples: int) -> Tensor:
    """The logits of each example, the mean over its windows' rows: logits (R, N), owners (R,) -> (E, N)
    (tokenization/task_batches.py reads a long text as several windows)."""
    sums = logits.new_zeros(num_examples, logits.shape[1]).index_add_(0, owners, logits)  # (E, N)
    counts = torch.bincount(owners, minlength=num_examples).clamp(min=1).unsqueeze(1)  # (E, 1)
    return sums / counts.to(logits.dtype)


def head_loss(logits: Tensor, targets: Tensor, task: str) -> Tensor:
    """Cross-entropy over class ids (B,), or the mean squared error against float targets (B,) of a
    regression head's (B, 1) outputs (as HF's `problem_type`s compute them)."""
    if task == "regression":
        return F.mse_loss(logits.squeeze(-1).float(), targets.float())  # (B,) against (B,), never (B, B)
    return F.cross_entropy(logits.float(), targets.long())


def predictions(logits: Tensor, task: str) -> Tensor:
    """Class ids (B,) or float predictions (B,) from a head's logits (B, N)."""
    return logits.squeeze(-1) if task == "regression" else logits.argmax(dim=-1)
