"""Fine-tuning as a run: the pieces a `classify` / `regress` objective swaps into the Trainer.

A fine-tuning run is a pretraining run with a task instead of a language-model objective, so the run
folder, recipe.yaml, start.log, metrics.jsonl, exact resume, train.max_time, keep_best and precision all
work unchanged. What differs lives here:
- the data (`build_task_data`): data.train / data.valid read as labelled examples
  (tokenization/labelled.py: columns from the task section, a seeded stratified hold-out without
  data.valid), laid out as the family was pretrained, cut to data.seq_len or read as windows
  (tokenization/task_batches.py); the head's labels come from the training file;
- the model (`build_classifier`): the body of train.init_from (any family; an import-hf folder is a tfkit
  checkpoint too) or of train.seed (the random-init control), with a `SequenceClassifier` head; on resume
  the whole classifier from its checkpoint, whose labels must be the data's;
- validation (`validate_task`): every validation example, windows pooled, the loss and the task's
  scores (accuracy, macro-F1, Matthews correlation, or Pearson / Spearman). The scores are computed by
  the `scorer` the command passes in (evaluation/metrics.py sits above the trainer in the layering).
keep_best keeps the best `task.metric` (higher is better; `criterion` is its negation, which the
checkpointer minimises as it minimises a loss).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from ..checkpoints.record import CheckpointRecord
from ..checkpoints.weights import load_weights_into
from ..errors import ConfigError
from ..layout import WEIGHTS
from ..models import build_model
from ..models.config import ModelConfig
from ..models.heads import HeadConfig, SequenceClassifier, classifier_inputs, head_loss, pool_windows, predictions
from ..progress import Progress, Transcript
from ..tokenization.labelled import Columns, load_labelled
from ..tokenization.task_batches import TaskDataset, task_dataset
from ..tokenization.tokenizer import TfkitTokenizer
from .distributed import DistInfo
from .objectives import move_batch
from .optim import autocast_context
from .recipe import Recipe

Scorer = Callable[[str, torch.Tensor, torch.Tensor], dict[str, float]]  # (task, predictions, targets) -> scores


def check_scorer(recipe: Recipe, scorer: Scorer | None) -> None:
    """A fine-tuning recipe runs only with the scorer of its validation scores, which `tfkit finetune` passes."""
    if recipe.head_task is not None and scorer is None:
        raise ConfigError(f"objective.name: {recipe.objective.name!r} is fine-tuning; run the recipe with "
                          "`tfkit finetune`")


def build_task_data(recipe: Recipe, tokenizer: TfkitTokenizer, cfg: ModelConfig,
                    out: Transcript | None) -> tuple[TaskDataset, TaskDataset, HeadConfig]:
    """(train, valid, head) of a fine-tuning recipe; what was held out, skipped or cut is said on `out`."""
    d, t, task = recipe.data, recipe.task, recipe.head_task
    labelled = load_labelled(d.train, d.valid, columns=Columns(t.text, t.text_pair, t.label), task=task,
                             header=t.header, valid_fraction=d.valid_fraction, seed=recipe.train.seed)
    head = HeadConfig(task=task, labels=labelled.labels or (), pooling=t.pooling, dropout=t.dropout)
    problems = head.problems(cfg.arch)
    if problems:
        raise ConfigError("; ".join(p.replace("head.", "task.", 1) for p in problems))
    splits = [task_dataset(split, tokenizer, cfg.arch, max_len=d.seq_len, seed=recipe.train.seed,
                           regression=task == "regression", truncation=t.truncation, stride=t.stride,
                           type_vocab_size=cfg.type_vocab_size, packed=t.packing)
              for split in (labelled.train, labelled.valid)]
    if out is not None:
        for note in labelled.notes:
            out.print(f"data: {note}", highlight=False, markup=False)
        classes = f"{len(head.labels)} classes" if head.labels else "float targets"
        out.print(f"data: {task}, {classes}: {len(labelled.train):,} training examples from {d.train}, "
                  f"{len(labelled.valid):,} validation examples from {labelled.valid.source}", highlight=False,
                  markup=False)
        for what, split in zip(("training", "validation"), splits):
            cut, windowed = split.encoded.truncated, split.encoded.windowed
            if cut or windowed:
                how = f"{windowed:,} read as sliding windows" if windowed else f"{cut:,} cut ({t.truncation})"
                out.print(f"data: {how} of {split.num_examples:,} {what} rows at data.seq_len={d.seq_len}",
                          highlight=False, markup=False)
    return splits[0], splits[1], head


def build_classifier(cfg: ModelConfig, head: HeadConfig, init_from: Path | None,
                     resume_from: Path | None) -> SequenceClassifier:
    """The classifier a run trains (see the module doc); the caller has seeded torch."""
    if resume_from is not None:
        saved = CheckpointRecord.read(resume_from).head
        if saved is None or saved.labels != head.labels or saved.task != head.task:
            had = "no head" if saved is None else f"{saved.task} labels {list(saved.labels)}"
            raise ConfigError(f"{resume_from}: the checkpoint has {had}, but the data gives {head.task} labels "
                              f"{list(head.labels)}; resume with the data the run started with")
        model = SequenceClassifier(build_model(cfg), saved)
        load_weights_into(model, resume_from / WEIGHTS, what="the classifier its config.json describes")
        return model
    body = build_model(cfg)
    if init_from is not None:
        source_head = CheckpointRecord.read(init_from).head  # a fine-tuned checkpoint lends its body, not its head
        holder = body if source_head is None else SequenceClassifier(body, source_head)
        load_weights_into(holder, init_from / WEIGHTS, what=f"the {cfg.arch} model its config.json describes")
    return SequenceClassifier(body, head)


@dataclass
class TaskValidation:
    """One validation of a fine-tuning run, over every validation example (windows pooled)."""

    loss: float  # mean cross-entropy (classify) or squared error (regress) per example
    scores: dict[str, float]  # accuracy / macro_f1 / matthews, or pearson / spearman
    metric: str  # the task.metric keep_best keeps
    examples: int
    extra: dict = field(default_factory=dict)

    @property
    def accuracy(self) -> float:
        return self.scores.get("accuracy", math.nan)

    @property
    def criterion(self) -> float:
        """What keep_best minimises: minus the metric (a higher score is better)."""
        return -self.scores.get(self.metric, math.nan)

    def row(self, step: int) -> dict:
        return {"step": step, "val_loss": self.loss, **{f"val_{k}": v for k, v in self.scores.items()},
                "val_examples": self.examples}


def _classifier(module: nn.Module) -> SequenceClassifier:
    """The classifier inside the (maybe DDP-wrapped, maybe compiled) LossModule."""
    module = getattr(module, "module", module)  # DDP
    module = getattr(module, "_orig_mod", module)  # torch.compile
    return module.model


@torch.no_grad()
def validate_task(loss_module: nn.Module, dataset: TaskDataset, batch_size: int, info: DistInfo, precision: str,
                  scorer: Scorer, metric: str, show_progress: bool = False) -> TaskValidation:
    """Loss and scores of the classifier over the whole validation split (every rank scores all of it, so
    the result is the same on each); with `show_progress`, a bar on a terminal or a line now and then off one
    (an imported BERT takes minutes over a GLUE dev file on a CPU)."""
    model = _classifier(loss_module)
    was_training = model.training
    model.eval()
    logits = []
    progress = Progress("validation", -(-dataset.num_examples // batch_size), "batches",
                        enabled=show_progress and info.is_main)
    try:
        for batch in dataset.every_example(batch_size):
            batch = move_batch(batch, info.device)
            with autocast_context(precision, info.device):
                out = model(**classifier_inputs(batch))  # (B, N)
            logits.append(out.float().cpu())
            progress.update()
    finally:
        progress.close()
        model.train(was_training)
    task = model.head_config.task
    pooled = pool_windows(torch.cat(logits), dataset.owners, int(dataset.owners.max()) + 1)  # (E, N)
    targets = dataset.labels.new_zeros(pooled.shape[0]).index_copy_(0, dataset.owners, dataset.labels)  # (E,)
    loss = float(head_loss(pooled, targets, task))
    scores = scorer(task, predictions(pooled, task), targets)
    return TaskValidation(loss, scores, metric, int(pooled.shape[0]))
