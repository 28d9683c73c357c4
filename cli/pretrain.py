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
                          "PATH: a checkpoint or run folder to continue."),
    ] = None,
) -> None:
    """Pretrain a model from a recipe: tokenizer, token shards, training, validation, a final report.

    The run folder collects the resolved recipe, the tokenizer, metrics.jsonl, loss.png (with the plots
    extra installed) and checkpoints/step-N/ (each loadable on its own). Ctrl-C or SIGTERM finishes the
    current step, saves a checkpoint and exits with 130 / 143; `--resume auto` continues exactly where it stopped.
    Multi-GPU or multi-process: `torchrun --nproc_per_node N -m tfkit pretrain RECIPE`.
    """
    from ..trainer.recipe import load_recipe  # imports deferred: `--help` stays fast
    from ..trainer.run import pretrain as run_pretrain

    result = run_pretrain(load_recipe(recipe, overrides), run_dir=run_dir, resume=resume)
    if result.interrupted:
        raise typer.Exit(128 + result.interrupted)
