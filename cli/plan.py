"""`tfkit plan RECIPE --time 1h`: the model, batch and learning rate that fit a time budget on this machine."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from .options import Overrides


def plan(
    recipe: Annotated[str, typer.Argument(help="Bundled recipe name (see `tfkit recipes list`) or a YAML file.")],
    time: Annotated[Optional[str], typer.Option("--time", help="Time budget of training, e.g. 5m or 1h (default: "
                                                "the recipe's train.max_time).")] = None,
    overrides: Overrides = None,
    memory: Annotated[Optional[str], typer.Option("--memory", help="Memory a run may use per device, e.g. 8GiB "
                                                  "(default: this machine's less a fifth, or the GPU's).")] = None,
    out: Annotated[Optional[Path], typer.Option("--out", help="Write the planned recipe here, for `tfkit pretrain "
                                                "FILE`.")] = None,
) -> None:
    """Measure a few updates of candidate shapes on this machine (seconds), then print the model, batch,
    micro-batch, updates, predicted peak memory and tokens/s, and learning rate that fit the budget, and why.
    A fine-tuning recipe keeps its checkpoint's model: its micro-batch and accumulation are planned, with the
    updates and epochs the budget trains.

    Keys given in the recipe file or by --set (model.d_model, n_layers, n_heads; train.grad_accum,
    train.max_steps by --set) win over the plan. `model.size: auto` in a recipe with train.max_time makes
    `tfkit pretrain` plan the same way before it trains.
    """
    from ..trainer.fits import parse_memory  # imports deferred: `--help` stays fast
    from ..trainer.plan import plan_recipe
    from ..trainer.recipe import load_recipe

    sets = list(overrides or []) + ([f"train.max_time={time}"] if time is not None else [])
    limit = parse_memory(memory) if memory is not None else None
    from ..runtime import pick_device
    from ..threads import set_threads

    given = load_recipe(recipe, sets)
    if given.head_task is not None:  # fine-tuning: the checkpoint's model, its micro-batch planned
        from ..trainer.finetune_plan import plan_finetune

        set_threads(given.train.threads)
        planned = plan_finetune(given, memory_limit=limit, device=str(pick_device(given.train.device, "train.device")))
    else:
        resolved = load_recipe(recipe, sets + ["model.size=auto"])  # the plan's size; keys given stay fixed
        set_threads(resolved.train.threads)  # measured as the run will train
        device = pick_device(resolved.train.device, "train.device")
        planned = plan_recipe(resolved, memory_limit=limit, device=str(device))
    typer.echo(planned.text())
    if out is not None:
        from ..files import write_atomic

        write_atomic(out, planned.recipe.to_yaml())
        typer.echo(f"planned recipe: {out} (tfkit {_command(given)} {out})")
    else:
        planned_keys = {s.split("=", 1)[0] for s in planned.sets()}  # the plan's value of a key given twice
        kept = [s for s in sets if s.split("=", 1)[0] not in planned_keys]
        typer.echo(f"run it: tfkit {_command(given)} {recipe} " + " ".join(f"--set {s}" for s in kept + planned.sets()))


def _command(recipe) -> str:
    return "finetune" if recipe.head_task is not None else "pretrain"
