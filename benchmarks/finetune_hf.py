"""The HuggingFace side of the finetune section, as a transformers user writes it (run_glue / run_mlm's steps
as plain loops, so nothing but the model differs from a script):

- fine-tuning (run_glue): the pair (title, description) through the model's own fast tokenizer with
  `truncation=True, max_length`, padded per batch to its longest example (DataCollatorWithPadding's
  default), `BertForSequenceClassification` (the [CLS] pooler, dropout, one Linear initialised N(0, 0.02)
  with a zero bias), forward with labels, backward, clip, AdamW, `get_linear_schedule_with_warmup`;
- pretraining (run_mlm, for experiments/finetune_pretraining.py): a WordPiece tokenizer trained by
  `tokenizers` (the HF course's recipe), every text tokenized with its [CLS] / [SEP] and concatenated into
  blocks (`group_texts`), masked by `DataCollatorForLanguageModeling` (15%: 80% [MASK], 10% random, 10% kept),
  `BertForMaskedLM`, the same update, for as many steps as a CPU-time budget pays for.
Both sides of every comparison take the same hyperparameters, the same AdamW parameter groups (tfkit's
`param_groups`: no decay on norms, biases and embeddings) and the same examples in the same order
(`batch_order`, tfkit's seeded permutation per epoch). HF's warmup starts at lr 0 (step / warmup) where
tfkit's starts one step in ((step + 1) / warmup): one step of difference, left as each library has it.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor, nn

from tfkit.trainer.optim import build_optimizer
from tfkit.trainer.recipe import OptimSection

from .finetune_setup import SPECIALS, Item

if TYPE_CHECKING:  # transformers is imported where used: `benchmarks.run` starts without it
    from transformers import BertConfig, PreTrainedTokenizerBase, PreTrainedTokenizerFast


@dataclass(frozen=True)
class Hyper:
    """One fine-tuning or pretraining configuration, given to tfkit's recipe and to the HF loop alike."""

    lr: float
    steps: int
    warmup: int
    batch_size: int = 32
    max_len: int = 128  # tokens per example (fine-tuning) or per block (pretraining), specials included
    weight_decay: float = 0.01
    beta2: float = 0.999
    grad_clip: float = 1.0
    eval_batch: int = 64

    def optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        """tfkit's AdamW with these settings (the groups decided by module, so HF's model gets tfkit's groups)."""
        optim = OptimSection(lr=self.lr, weight_decay=self.weight_decay, beta1=0.9, beta2=self.beta2,
                             grad_clip=self.grad_clip)
        return build_optimizer(model, optim, torch.device("cpu"))


def quiet() -> None:
    """transformers' progress bars and warnings off: the table on stdout and the log on stderr stay readable."""
    import transformers as tr

    tr.logging.set_verbosity_error()
    tr.utils.logging.disable_progress_bar()


def batch_order(seed: int, n: int, batch_size: int, steps: int | None = None) -> Iterator[np.ndarray]:
    """The examples of each update as tfkit's TaskDataset draws them (tokenization/batches.py): epoch e is a
    permutation seeded by (seed, e), cut into full batches; `steps` of them (None: without end)."""
    per_epoch = n // batch_size
    perm = None
    for i in range(steps) if steps is not None else itertools.count():
        if i % per_epoch == 0:
            perm = np.random.default_rng([seed, i // per_epoch]).permutation(n)
        offset = (i % per_epoch) * batch_size
        yield perm[offset:offset + batch_size]


def encode(tokenizer: PreTrainedTokenizerBase, items: list[Item], max_len: int) -> list[dict[str, list[int]]]:
    """Each (title, description) as the tokenizer lays out a pair, cut `longest_first` to `max_len`."""
    enc = tokenizer([t for _, t, _ in items], [d for _, _, d in items], truncation=True, max_length=max_len,
                    return_token_type_ids=True)
    return [{key: enc[key][k] for key in ("input_ids", "token_type_ids", "attention_mask")} for k in range(len(items))]


def collate(tokenizer: PreTrainedTokenizerBase, features: list[dict], idx: Iterable[int]) -> dict[str, Tensor]:
    """The examples `idx` padded to the longest of them (DataCollatorWithPadding)."""
    return tokenizer.pad([features[k] for k in idx], return_tensors="pt")


def labels_of(items: list[Item]) -> Tensor:
    """Class ids in tfkit's order: the integer labels sorted numerically (1..4 -> 0..3)."""
    names = sorted({label for label, _, _ in items}, key=int)
    return torch.tensor([names.index(label) for label, _, _ in items])


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: object | None,
               batch: dict[str, Tensor], labels: Tensor, clip: float) -> None:
    """One HF update: forward with labels (its own cross-entropy), backward, clip, AdamW, schedule."""
    model(**batch, labels=labels).loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    optimizer.step()
    if scheduler is not None:
        scheduler.step()
    optimizer.zero_grad(set_to_none=True)


def finetune(model: nn.Module, tokenizer: PreTrainedTokenizerBase, features: list[dict], labels: Tensor, hyper: Hyper,
             seed: int) -> None:
    """run_glue's training as a loop: `hyper.steps` updates over `batch_order(seed)` (dropout seeded too)."""
    from transformers import get_linear_schedule_with_warmup

    optimizer = hyper.optimizer(model)
    scheduler = get_linear_schedule_with_warmup(optimizer, hyper.warmup, hyper.steps)
    torch.manual_seed(seed)
    model.train()
    for idx in batch_order(seed, len(features), hyper.batch_size, hyper.steps):
        train_step(model, optimizer, scheduler, collate(tokenizer, features, idx), labels[idx], hyper.grad_clip)


@torch.no_grad()
def accuracy(model: nn.Module, tokenizer: PreTrainedTokenizerBase, features: list[dict], labels: Tensor,
             batch_size: int) -> float:
    """The share of `features` whose argmax logit is the label, in eval mode."""
    model.eval()
    right = 0
    for lo in range(0, len(features), batch_size):
        idx = range(lo, min(lo + batch_size, len(features)))
        right += int((model(**collate(tokenizer, features, idx)).logits.argmax(-1) == labels[list(idx)]).sum())
    return right / len(features)


def classifier(source: str | nn.Module, num_labels: int, seed: int, dropout: float | None = None) -> nn.Module:
    """`BertForSequenceClassification` from an HF folder (from_pretrained, as run_glue loads it) or from a
    `BertForMaskedLM` in memory (its encoder; the pooler, which MLM never trains, initialised as HF does);
    the head's initialisation seeded."""
    import transformers as tr

    torch.manual_seed(seed)
    if isinstance(source, str):
        return tr.BertForSequenceClassification.from_pretrained(source, num_labels=num_labels,
                                                                attn_implementation="sdpa")
    config = tr.BertConfig(**{**source.config.to_dict(), "num_labels": num_labels})
    if dropout is not None:
        config.hidden_dropout_prob = config.attention_probs_dropout_prob = dropout
    model = tr.BertForSequenceClassification._from_config(config, attn_implementation="sdpa")
    missing, unexpected = model.bert.load_state_dict(source.bert.state_dict(), strict=False)
    if unexpected or any(not key.startswith("pooler.") for key in missing):
        raise RuntimeError(f"MLM encoder into the classifier: missing {missing}, unexpected {unexpected}")
    return model


def train_wordpiece(texts: list[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """A lowercased WordPiece tokenizer trained by `tokenizers` on `texts`, wrapped for transformers."""
    import transformers as tr
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.train_from_iterator(texts, trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=SPECIALS,
                                                             show_progress=False))
    cls_id, sep_id = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
                                                       special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)])
    tok.decoder = decoders.WordPiece()
    return tr.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                                      sep_token="[SEP]", mask_token="[MASK]")


def group_texts(tokenizer: PreTrainedTokenizerBase, texts: list[str], block: int) -> tuple[Tensor, Tensor]:
    """run_mlm's `group_texts`: every text with its specials, concatenated, cut into blocks of `block`
    (the remainder dropped): input ids and special-token masks, (N, block) each."""
    enc = tokenizer(texts, return_special_tokens_mask=True)
    ids = [i for row in enc["input_ids"] for i in row]
    special = [s for row in enc["special_tokens_mask"] for s in row]
    n = len(ids) // block
    return torch.tensor(ids[:n * block]).view(n, block), torch.tensor(special[:n * block]).view(n, block)


def pretrain_mlm(config: BertConfig, tokenizer: PreTrainedTokenizerBase, blocks: tuple[Tensor, Tensor], hyper: Hyper,
                 budget_s: float, seed: int, mask_prob: float = 0.15,
                 timer: Callable[[], float] = time.process_time) -> tuple[nn.Module, int, float]:
    """`BertForMaskedLM` trained for as many updates as `budget_s` seconds of `timer` pay for, warmup the
    first 10% (as the tfkit run's), then linear decay. The pace comes from a probe of 6 updates on a
    throwaway copy (the last 5 timed; not counted in the budget: a script is simply given its step count).
    Returns the model, its number of updates and the seconds they took."""
    import transformers as tr

    collator = tr.DataCollatorForLanguageModeling(tokenizer, mlm_probability=mask_prob)
    ids, special = blocks

    def run(steps: int, schedule: bool) -> tuple[nn.Module, list[float]]:
        torch.manual_seed(seed)
        model = tr.BertForMaskedLM._from_config(config, attn_implementation="sdpa").train()
        optimizer = hyper.optimizer(model)
        scheduler = tr.get_linear_schedule_with_warmup(optimizer, steps // 10, steps) if schedule else None
        marks = []
        for idx in batch_order(seed, ids.shape[0], hyper.batch_size, steps):
            inputs, labels = collator.torch_mask_tokens(ids[idx].clone(), special[idx].bool())  # (B, T) each
            train_step(model, optimizer, scheduler, {"input_ids": inputs}, labels, hyper.grad_clip)
            marks.append(timer())
        return model, marks

    _, marks = run(6, schedule=False)
    pace = (marks[-1] - marks[0]) / 5
    steps = max(1, int(budget_s / pace))
    start = timer()
    model, _ = run(steps, schedule=True)
    return model, steps, timer() - start
