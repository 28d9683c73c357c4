"""`tfkit recipes list | show | validate`: find, read and check recipes before spending compute on them."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape
from rich.table import Table

from ..errors import ConfigError
from ..progress import console as output_console
from .flags import with_flags
from .options import Overrides

app = typer.Typer(help="List, show and validate pretraining recipes.", no_args_is_help=True)
console = output_console()
err_console = output_console(stderr=True)


def _summary(path: Path) -> str:
    """The first comment line of a recipe file: its one-line description."""
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            return line.lstrip("# ").strip()
    return ""


@app.command("list")
def list_recipes() -> None:
    """List the recipes bundled with tfkit."""
    from ..trainer.recipe import bundled_recipes, load_recipe  # imports deferred: `--help` stays fast

    table = Table("name", "arch", "objective", "steps", "description")
    for name, path in sorted(bundled_recipes().items()):
        recipe = load_recipe(str(path))
        table.add_row(name, recipe.model.arch, recipe.objective.name, str(recipe.train.max_steps), _summary(path))
    console.print(table)


@app.command("show")
def show(
    recipe: Annotated[str, typer.Argument(help="Bundled recipe name or path to a YAML file.")],
    overrides: Overrides = None,
    lr_points: Annotated[int, typer.Option("--lr-points", help="Rows of the learning-rate curve to print (0: none).")] = 11,
    pace: Annotated[Optional[float], typer.Option(
        "--pace", help="Training tokens per second, to size a time budget's horizon for a list of sources "
                       "(start.log reports a run's pace).")] = None,
) -> None:
    """Print the resolved recipe (sizes and overrides applied) on stdout; on stderr, its learning-rate curve and,
    for a list of sources under data.train, the tokens each source will contribute over the run."""
    from ..trainer.recipe import find_recipe, load_recipe
    from ..trainer.schedules import lr_at

    resolved = load_recipe(recipe, overrides)
    for warning in resolved.warnings():
        err_console.print(f"[yellow]warning:[/yellow] {escape(warning)}", highlight=False)
    console.print(f"# {find_recipe(recipe)}", style="dim", highlight=False)
    console.print(resolved.to_yaml(), highlight=False, markup=False)
    if (mixture := horizon_table(resolved, pace)) is not None:
        err_console.print(mixture)
    if lr_points < 1:
        return
    steps = resolved.train.max_steps
    table = Table("step", "lr", title=f"learning rate ({resolved.schedule.name})")
    marks = sorted({round(i * steps / max(lr_points - 1, 1)) for i in range(lr_points)})
    for step in marks:
        table.add_row(str(step), f"{lr_at(step, resolved.schedule, resolved.optim.lr, steps, resolved.model.d_model):.3e}")
    err_console.print(table)  # stderr: `tfkit recipes show NAME > my.yaml` writes a recipe that loads


def horizon_table(recipe, pace: float | None = None) -> Table | None:
    """`tfkit recipes show`: every source of data.train with its weight, share, and the tokens it will
    contribute over the run's train.max_steps, or per hour at `pace` tokens per second under a time budget
    (without a pace: at the cap of train.max_steps); None for a single corpus."""
    from ..tokenization.sources import is_mixture, read_sources, spec_text  # no torch: `recipes show` stays fast

    if not is_mixture(recipe.data.train):
        return None
    t = recipe.train
    per_step = t.batch_size * recipe.data.seq_len
    if t.max_time and pace:
        total, column = pace * 3600, f"tokens per hour at {pace:,.0f} tokens/s"
    else:
        total = per_step * t.max_steps
        column = (f"tokens in {t.max_steps:,} steps" if not t.max_time else
                  f"tokens at the cap of {t.max_steps:,} steps (pace: the tokens/s start.log reports)")
    table = Table("source", "corpus", "weight", "share", column, title=f"data.train: {spec_text(recipe.data.train)}")
    for source in read_sources(recipe.data.train, "data.train", recipe.data.text_field):
        small = " (under 1%)" if source.share < 0.01 else ""
        table.add_row(source.name, source.path + ("" if source.repeat else " (repeat: false)"), f"{source.weight:g}",
                      f"{100 * source.share:.3g}%{small}", f"{source.share * total:,.0f}")
    return table


@app.command("validate")
def validate(
    ctx: typer.Context,
    files: Annotated[list[str], typer.Argument(help="Recipe files or bundled names to check.")],
    overrides: Overrides = None,
) -> None:
    """Check recipes without running them: each file gets "ok" or one line with all of its problems, and
    the exit code is 2 when any file failed."""
    from ..trainer.recipe import load_recipe

    failed = False
    for item in files:
        try:
            resolved = load_recipe(item, overrides)
        except ConfigError as exc:
            if ctx.meta.get("tfkit.debug"):
                raise
            failed = True
            message = with_flags(exc, ctx.command)
            if len(files) > 1 and message.startswith("--set"):  # else nothing says which file it was
                message = f"{item}: {message}"
            err_console.print(f"[bold red]error:[/bold red] {escape(message)}", highlight=False)
        else:
            console.print(f"[green]ok[/green] {item}", highlight=False)
            for warning in resolved.warnings():
                err_console.print(f"[yellow]warning:[/yellow] {escape(warning)}", highlight=False)
    if failed:
        raise typer.Exit(2)


@app.command("keys")
def keys(
    section: Annotated[
        str | None, typer.Argument(help="One section (model, tokenizer, data, objective, optim, schedule, train, eval, log).")
    ] = None,
) -> None:
    """Every recipe key with its type, default and meaning; choices read a | b | c.

    Set any key in a recipe file or with --set SECTION.KEY=VALUE."""
    from ..trainer.recipe import SECTIONS
    from ..trainer.recipe_keys import recipe_keys

    if section is not None and section not in SECTIONS:
        raise ConfigError(f"section {section!r}: expected one of {', '.join(SECTIONS)}")
    table = Table("key", "type", "default", "meaning")
    for key in recipe_keys(section):
        table.add_row(key.name, key.type, "null" if key.default is None else str(key.default), key.meaning)
    console.print(table)
