"""Experiment trackers beside metrics.jsonl: Weights & Biases (`log.wandb: true`).

metrics.jsonl stays the record of truth; a tracker receives the same rows as `MetricsWriter.log` writes
(every training and validation row, as written), the resolved recipe as its config, and at the end the
run's final validation as a table and as the run's summary. wandb is the optional `trackers` extra,
imported only when a recipe turns it on (`recipe_problems` refuses the recipe before anything runs when it
is missing); `WANDB_MODE=offline` works with no account and writes the run under `<run>/wandb/`. A
resumed run continues the W&B run of its run folder (W&B's `latest-run` there names it).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

EXTRA = 'pip install "tfkit[trackers]"'
FOLDER = "wandb"  # in a run folder: what wandb writes (its `dir` is the run folder)
DEFAULT_PROJECT = "tfkit"


def wandb_problem() -> str | None:
    """Why `log.wandb: true` cannot work here (the package is missing), checked when the recipe loads."""
    if importlib.util.find_spec("wandb") is None:
        return f"log.wandb: true needs the wandb package, which is not installed: {EXTRA}"
    return None


class WandbTracker:
    """One W&B run per run folder: rows as `run.log`, the recipe as config, the final validation at close."""

    def __init__(self, run_dir: Path, project: str | None, config: dict[str, Any], resumed: bool) -> None:
        import wandb

        previous = _previous_run_id(run_dir) if resumed else None
        self._wandb = wandb
        self._run = wandb.init(project=project or DEFAULT_PROJECT, name=run_dir.name, dir=str(run_dir),
                               config=config, id=previous, resume="allow" if previous else None,
                               settings=wandb.Settings(console="off"))
        self._run.define_metric("*", step_metric="step")  # charts against tfkit's step, not W&B's own counter
        self._last_validation: dict[str, Any] | None = None

    def log(self, row: dict[str, Any]) -> None:
        """A metrics.jsonl row as written (a skipped update's null loss is left out: W&B plots numbers)."""
        self._run.log({k: v for k, v in row.items() if v is not None})
        if "val_loss" in row:
            self._last_validation = row

    def close(self) -> None:
        """The final validation as a table and the run's summary, then the run's end."""
        final = self._last_validation
        if final is not None:
            table = self._wandb.Table(columns=["metric", "value"], data=[[k, v] for k, v in final.items()])
            self._run.log({"final_eval": table})
            self._run.summary.update({f"final/{k}": v for k, v in final.items()})
        self._run.finish()


def _previous_run_id(run_dir: Path) -> str | None:
    """The id of the W&B run this run folder logged to: the suffix of the folder `wandb/latest-run` points
    to (`offline-run-<date>_<time>-<id>` or `run-<date>_<time>-<id>`)."""
    latest = run_dir / FOLDER / "latest-run"
    if not latest.exists():
        return None
    return latest.resolve().name.rsplit("-", 1)[-1]


def open_tracker(recipe, run_dir: Path, resumed: bool) -> WandbTracker | None:
    """The tracker a recipe asks for (`log.wandb`), else None."""
    if not recipe.log.wandb:
        return None
    return WandbTracker(run_dir, recipe.log.wandb_project, recipe.to_dict(), resumed)
