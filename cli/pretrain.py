"""`tfkit pretrain RECIPE`: train a tokenizer, prepare the data, pretrain, evaluate — one command."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from .options import Overrides


def pretrain(
    recipe: Annotated[str, typer.Argument(help="Bundled recipe name (see `tfkit recipes list`) or a YAML file.")],
    overrides: Overrides = None,
    run_dir: Annotated[
        Optional[Path],
        typer.Option("--run-dir", help="Run folder (default: log.run_dir, else runs/<recipe>-<timestamp>)."),
    ] = None,
    resume: Annotated[
        Optional[str],
        typer.Option("--resume", metavar="auto|PATH",
                     help="auto: continue the latest checkpoint of the run folder (the newest "
                          "runs/<recipe>-* without --run-dir), or start fresh if there is none; "
                          "PATH: a checkpoint or run folder to continue. A resume trains with the run "
                          "folder's own recipe.yaml plus the --set overrides given now."),
    ] = None,
    force: Annotated[
        bool,
        typer.Option("--force", help="With --resume: train on the data RECIPE and --set name even where it differs "
                                     "from the run's (refused otherwise)."),
    ] = False,
) -> None:
    """Pretrain a model from a recipe: tokenizer, token shards, training, validation, a final report.

    The run folder collects the resolved recipe, the tokenizer, metrics.jsonl, loss.png (with the plots
    extra installed) and checkpoints/step-N/ (each loadable on its own). Ctrl-C or SIGTERM finishes the
    current step, saves a checkpoint and exits with 130 / 143, printing the command that continues exactly
    where it stopped (`tfkit pretrain RUN/recipe.yaml --resume auto --run-dir RUN`).
    Multi-GPU or multi-process: `torchrun --nproc_per_node N -m tfkit pretrain RECIPE`.
    """
    from ..trainer.resume import recipe_for_run  # imports deferred: `--help` stays fast
    from ..trainer.run import pretrain as run_pretrain

    result = run_pretrain(recipe_for_run(recipe, overrides, run_dir, resume, force), run_dir=run_dir, resume=resume)
    if result.interrupted:
        raise typer.Exit(128 + result.interrupted)
