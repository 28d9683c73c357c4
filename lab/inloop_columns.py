"""A lab reads the downstream scores its trainings logged (`eval.tasks`, `eval.probe` in the base recipe or a
spec's `set`) as columns of its table, so a claim can be judged on a downstream number without a fine-tuning
job per variant (`mlm-mask`, `pooling`): `expect: [{better: p15, than: p05, eval: "task:probe-topics"}]`.

Each task becomes column `task:NAME` of every trained variant (`train` and `uptrain` jobs), read from the final
validation row of its metrics.jsonl, which the trainer scored on the final weights. Its metric is the error
rate, 1 - acc, so that lower is better there as for a loss and the paired-t rule of verdict.py reads it as it
reads `downstream`'s column. The tasks are read and checked with the spec, before the first training.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import ConfigError, TfkitError
from ..trainer.task_names import PREFIX, score_names

if TYPE_CHECKING:
    from ..trainer.recipe import Recipe

COLUMN = "task:"  # the prefix of an in-loop task's column
METRIC = "error"


def task_columns(recipe: Recipe) -> list[str]:
    """`task:NAME` for every task and probe the recipe scores in its loop."""
    return [f"{COLUMN}{name}" for name in score_names(recipe.eval.tasks, recipe.eval.probe)]


def is_task_column(label: str) -> bool:
    return label.startswith(COLUMN)


def check_task_columns(spec_path: Path, recipes: dict[str, Recipe]) -> None:
    """Every recipe's tasks and probe read as its training would read them, before the first training."""
    from ..evaluation.inloop import build_downstream

    seen = set()
    for key, recipe in recipes.items():
        what = (tuple(recipe.eval.tasks), repr(recipe.eval.probe), recipe.eval.task_limit)
        if what in seen or not task_columns(recipe):
            continue
        seen.add(what)
        try:
            build_downstream(recipe)
        except TfkitError as exc:
            raise type(exc)(f"{spec_path}: {key}: {exc}", params=exc.params) from None


def final_task_scores(run_dir: Path, steps: int, recipe: Recipe) -> dict[str, dict]:
    """{task:NAME: {error, acc}} from the run's last validation row (at `steps`)."""
    from ..checkpoints.run_record import read_metrics

    names = [c.removeprefix(COLUMN) for c in task_columns(recipe)]
    if not names:
        return {}
    rows = [r for r in read_metrics(run_dir / "metrics.jsonl") if r.get("step") == steps and "val_loss" in r]
    if not rows or f"{PREFIX}{names[0]}/acc" not in rows[-1]:
        raise ConfigError(f"{run_dir}: no task scores at step {steps} in metrics.jsonl; remove the folder and continue "
                          "the lab to train it again")
    return {f"{COLUMN}{name}": {METRIC: 1.0 - rows[-1][f"{PREFIX}{name}/acc"], "acc": rows[-1][f"{PREFIX}{name}/acc"]}
            for name in names}
