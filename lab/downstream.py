"""A lab's `downstream` block: each trained variant fine-tuned on a labelled task, judged on held-out labels.

Pretraining is judged by what it does downstream, and some claims are about the fine-tuning itself (which
pooled vector a classifier reads). A `downstream` spec fine-tunes the final checkpoint of every variant and
seed once per head (rows VARIANT+HEAD), with `tfkit finetune`'s trainer and scorer, and scores each row
on one column: the task's held-out examples (the recipe's data.valid, or the seeded share it holds out).
The column's metric is the error rate, 1 - accuracy, so that lower is better there as it is for the loss
on every text column, and the paired-t rule of verdict.py reads both alike. A fine-tuning that predicts
no better than chance did not learn: its gate is the Matthews correlation of its predictions, which is 0
for a constant or random classifier whatever the class balance.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import ConfigError, TfkitError
from .scoring import eval_label

if TYPE_CHECKING:
    from ..trainer.recipe import Recipe
    from .plan import Job

METRIC = "error"  # the task column's metric: 1 - accuracy on the held-out examples
MIN_MATTHEWS = 0.05  # a fine-tuning whose held-out predictions correlate less with the labels did not learn


def task_label(recipe: Recipe) -> str:
    """The task column's name: its held-out text's (`stdlib:topics:valid` -> topics-valid), or `task` for the
    share a recipe without data.valid holds out of data.train."""
    return eval_label(recipe.data.valid) if recipe.data.valid else "task"


def check_downstream(spec_path: Path, jobs: list[Job], recipes: dict[str, Recipe]) -> None:
    """Everything a fine-tuning would refuse after the pretrainings, refused before the first: its recipe must
    classify (the error rate needs labels) and every head score one held-out set; its labelled files are read
    as the trainer reads them (`load_labelled`: they exist, rows carry a text and a label, every validation
    label occurs in training); its head suits the variant it fine-tunes (`HeadConfig.problems`: task.pooling
    for the variant's model.arch). The task keys themselves were checked when the recipe loaded."""
    from ..models.heads import HeadConfig
    from ..tokenization.labelled import Columns, load_labelled

    tuned = [(job, recipes[job.key]) for job in jobs if job.kind == "finetune"]
    for _, recipe in tuned:
        if recipe.objective.name != "classify":
            raise ConfigError(f"{spec_path}: downstream.recipe: objective.name is {recipe.objective.name!r}; a "
                              "downstream row is scored by its error rate on held-out labels, which needs classify")
    if len({(r.data.train, r.data.valid, r.data.valid_fraction) for _, r in tuned}) > 1:
        raise ConfigError(f"{spec_path}: downstream.heads: the heads change the data (data.train, data.valid); "
                          "every row must be scored on the same held-out examples")
    read: dict[tuple, tuple[str, ...]] = {}
    for job, recipe in tuned:
        d, t = recipe.data, recipe.task
        columns = Columns(t.text, t.text_pair, t.label)
        what = (d.train, d.valid, columns, t.header, d.valid_fraction, recipe.train.seed)
        if what not in read:
            try:
                read[what] = load_labelled(d.train, d.valid, columns=columns, task=recipe.head_task, header=t.header,
                                           valid_fraction=d.valid_fraction, seed=recipe.train.seed).labels
            except TfkitError as exc:
                raise type(exc)(f"{spec_path}: downstream {job.name}: {exc}", params=exc.params) from None
        arch = recipes[f"{job.source}/seed-{job.seed}"].model.arch  # the variant whose checkpoint it starts from
        head = HeadConfig(task=recipe.head_task, labels=read[what], pooling=t.pooling, dropout=t.dropout)
        problems = [p.replace("head.", "task.", 1) for p in head.problems(arch)]
        if problems:
            raise ConfigError(f"{spec_path}: downstream {job.name}: fine-tunes {job.source} (model.arch={arch}): "
                              + "; ".join(problems))


def final_scores(run_dir: Path, steps: int) -> dict:
    """The last validation of a fine-tuning run at its final step: error, accuracy, macro-F1, Matthews
    correlation and the cross-entropy on the held-out examples (the trainer's metrics.jsonl row)."""
    from ..checkpoints.run_record import read_metrics

    rows = [r for r in read_metrics(run_dir / "metrics.jsonl") if "val_accuracy" in r and r["step"] == steps]
    if not rows:
        raise ConfigError(f"{run_dir}: no validation at step {steps} in metrics.jsonl; remove the folder and continue "
                          "the lab to fine-tune it again")
    val = rows[-1]
    return {METRIC: 1.0 - val["val_accuracy"], "accuracy": val["val_accuracy"], "macro_f1": val["val_macro_f1"],
            "matthews": val["val_matthews"], "task_loss": val["val_loss"]}


def task_gate(scores: dict) -> dict:
    """gates.py's entry for one fine-tuning: trained when its Matthews correlation reaches MIN_MATTHEWS."""
    learned = scores["matthews"] >= MIN_MATTHEWS
    return {"loss": None, "unigram": None, "step0": None, "matthews": scores["matthews"],
            "status": "trained" if learned else "did not learn"}


def column_metric(results: dict, label: str) -> str:
    """The metric a column is read by: the task column's error rate, else the lab's metric."""
    from .inloop_columns import METRIC as TASK_COLUMN_METRIC, is_task_column

    if is_task_column(label):  # a score the trainings logged (inloop_columns.py): its error rate
        return TASK_COLUMN_METRIC
    downstream = results.get("downstream") or {}
    return downstream["metric"] if label == downstream.get("label") else results["metric"]
