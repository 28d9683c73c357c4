"""tfkit's side of the finetune section's in-process measurements: one fine-tuning update as `tfkit finetune`
takes it, and the check that tfkit reads the items into the tokens HF's tokenizer gives.

`tfkit_update` builds what trainer/run.py builds for a fine-tuning run (the imported checkpoint as a
`SequenceClassifier` with BERT's [CLS] pooler, `LossModule` with the classify objective, the fused AdamW,
`Loop`) over a `TaskDataset` of the items, packed or padded, and returns one call = one `train_step` in a
window of one update whose record is read at once (as at a log row), with the next batch prepared by the
loop's prefetch thread meanwhile (its CPU time counts). Its batches are the dataset's 0, 1, 2, ... as a
run draws them; `finetune_hf.batch_order(0, ...)` gives HF's loop the same items in the same order.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from tfkit.checkpoints.weights import load_model
from tfkit.models.heads import HeadConfig, SequenceClassifier
from tfkit.tokenization.labelled import Examples
from tfkit.tokenization.task_batches import TaskDataset, task_dataset
from tfkit.tokenization.tokenizer import load_tokenizer
from tfkit.trainer.distributed import DistInfo
from tfkit.trainer.loop import Loop, StopFlag, replay, run_window
from tfkit.trainer.objectives import LossModule
from tfkit.trainer.optim import build_optimizer, grad_scaler
from tfkit.trainer.recipe import ObjectiveSection, OptimSection, Recipe, TrainSection
from tfkit.trainer.step import Update

from .finetune_hf import Hyper, labels_of
from .finetune_setup import Item

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

LABELS = ("1", "2", "3", "4")  # AG News' classes as tfkit numbers them (label_names: numerically)


def dataset(folder: Path, items: list[Item], max_len: int, packed: bool) -> TaskDataset:
    """The items as `tfkit finetune` reads them with the checkpoint's tokenizer: title and description a
    pair, BERT's layout, cut to `max_len`, batches drawn with seed 0."""
    examples = Examples("bench", [t for _, t, _ in items], [d for _, _, d in items], labels_of(items).tolist())
    return task_dataset(examples, load_tokenizer(folder), "bert", max_len=max_len, seed=0, regression=False,
                        packed=packed)


def tfkit_update(folder: Path, items: list[Item], hyper: Hyper, packed: bool) -> Callable[[], None]:
    """One call = one fine-tuning update of the checkpoint at `folder` (see the module doc)."""
    body, cfg = load_model(folder)  # an import-hf folder keeps HF's dropout: 0.1 in the body and on attention
    torch.manual_seed(0)
    model = SequenceClassifier(body, HeadConfig(labels=LABELS, pooling="cls", dropout=0.1)).train()
    recipe = Recipe(objective=ObjectiveSection(name="classify"),
                    optim=OptimSection(lr=hyper.lr, weight_decay=hyper.weight_decay, beta2=hyper.beta2,
                                       grad_clip=hyper.grad_clip),
                    train=TrainSection(batch_size=hyper.batch_size, precision="fp32"))
    device = torch.device("cpu")
    update = Update.of(recipe, model, LossModule(model, recipe.objective), build_optimizer(model, recipe.optim, device),
                       grad_scaler("fp32", device), DistInfo(device=device))
    loop = Loop(recipe, update, dataset(folder, items, hyper.max_len, packed), log=lambda row: None,
                save=lambda state: None, validate=lambda step: {})
    stop = StopFlag()  # never entered: no signal handlers, signum stays 0
    return lambda: list(replay(loop, run_window(loop, stop, 1)))


def same_tokens(folder: Path, hf_tokenizer: PreTrainedTokenizerBase, items: list[Item], max_len: int) -> float:
    """The share of items whose ids and segment ids tfkit (the checkpoint's tokenizer, its BERT pair layout and
    longest-first cut) and HF's tokenizer (`tokenizer(title, description, truncation=True)`) agree on."""
    encoded = dataset(folder, items, max_len, packed=False).encoded
    theirs = hf_tokenizer([t for _, t, _ in items], [d for _, _, d in items], truncation=True, max_length=max_len,
                          return_token_type_ids=True)
    same = sum(ids == hf_ids and seg == hf_seg for ids, seg, hf_ids, hf_seg in
               zip(encoded.rows, encoded.segments, theirs["input_ids"], theirs["token_type_ids"]))
    return same / len(items)
