"""`tfkit finetune RECIPE`: a pretrained model (or random weights) trained on labelled data with a task head."""

from __future__ import annotations

from typing import Annotated

import typer

from ..errors import ConfigError
from .options import Overrides, Resume, ResumeForce, RunDir


def finetune(
    recipe: Annotated[str, typer.Argument(help="Bundled recipe name (finetune-classify) or a YAML file whose "
                                               "objective.name is classify or regress.")],
    overrides: Overrides = None,
    run_dir: RunDir = None,
    resume: Resume = None,
    force: ResumeForce = False,
) -> None:
    """Fine-tune a classifier or regressor: train.init_from's body (a tfkit run or checkpoint of any family, or
    an import-hf folder; null = random weights, the control) with a head on its pooled vector.

    The labelled data is data.train (CSV / TSV / JSONL / Parquet, or stdlib:topics) with the columns of the
    task section; without data.valid a seeded, stratified share is held out. Validation reports the task's
    scores (accuracy, macro-F1, Matthews correlation, or Pearson / Spearman) in metrics.jsonl and the report;
    checkpoints keep the labels as id2label / label2id in config.json, and `tfkit eval` / `tfkit predict`
    read them. The run folder is a pretraining run's: recipe.yaml, start.log, metrics.jsonl, exact resume.
    """
    from ..trainer.resume import recipe_for_run  # imports deferred: `--help` stays fast

    chosen = recipe_for_run(recipe, overrides, run_dir, resume, force)  # checked before torch is imported (seconds)
    if chosen.head_task is None:
        raise ConfigError(f"recipe {recipe}: objective.name is {chosen.objective.name!r}, which pretrains; "
                          "fine-tuning needs classify or regress (see `tfkit recipes show finetune-classify`)")
    from ..evaluation.metrics import task_scores
    from ..trainer.run import pretrain as run_pretrain

    result = run_pretrain(chosen, run_dir=run_dir, resume=resume, scorer=task_scores)
    if result.interrupted:
        raise typer.Exit(128 + result.interrupted)
