"""`tfkit pretrain RECIPE`: train a tokenizer, prepare the data, pretrain, evaluate — one command."""

from __future__ import annotations

from typing import Annotated

import typer

from .options import Overrides, Resume, ResumeForce, RunDir


def pretrain(
    recipe: Annotated[str, typer.Argument(help="Bundled recipe name (see `tfkit recipes list`) or a YAML file.")],
    overrides: Overrides = None,
    run_dir: RunDir = None,
    resume: Resume = None,
    force: ResumeForce = False,
) -> None:
    """Pretrain a model from a recipe: tokenizer, token shards, training, validation, a final report.

    The run folder collects the resolved recipe, the tokenizer, metrics.jsonl, loss.png (with the plots
    extra installed) and checkpoints/step-N/ (each loadable on its own). Ctrl-C, SIGTERM or SIGUSR1 finishes
    the current step, saves a checkpoint and exits with 130 / 143 / 138, printing the command that continues
    exactly where it stopped (`tfkit pretrain RUN/recipe.yaml --resume auto --run-dir RUN`).
    Multi-GPU, multi-process or multi-node: `torchrun --nproc_per_node N -m tfkit pretrain RECIPE` (a run that
    torchrun restarts resumes from its newest complete checkpoint by itself).
    """
    from ..trainer.resume import recipe_for_run  # imports deferred: `--help` stays fast

    chosen = recipe_for_run(recipe, overrides, run_dir, resume, force)  # checked before torch is imported (seconds)
    from ..evaluation.inloop import build_downstream
    from ..trainer.run import pretrain as run_pretrain

    downstream = build_downstream(chosen)  # eval.tasks / eval.probe read and checked before any training
    result = run_pretrain(chosen, run_dir=run_dir, resume=resume, downstream=downstream)
    if result.interrupted:
        raise typer.Exit(128 + result.interrupted)
