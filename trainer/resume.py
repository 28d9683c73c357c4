"""What a resumed run trains with: its run folder's own recipe.yaml, not whichever recipe is named beside
`--resume`.

A run is continued with `tfkit pretrain RECIPE --resume auto|PATH`. The recipe that trained it is kept in
its run folder (recipe.yaml: every `--set` of its start resolved into it), and that is what a resume
continues; the RECIPE argument only finds the run folder (the newest runs/<name>-* without --run-dir),
and the `--set` overrides of the resume apply on top of the run's recipe (more steps, a lower lr). A
bundled recipe named beside `--resume` would otherwise put its own corpus under a run trained on a user's
one, with one warning among many lines. So a resume that would change the training data (because RECIPE
names other data, or a `--set` does) is refused in one line saying what would change, unless `--force`,
which takes RECIPE and its overrides as given (the recipe before is kept as recipe-before-step-N.yaml).
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import ConfigError
from ..layout import RECIPE_FILE
from .recipe import Recipe, load_recipe
from .run_folder import choose_run_dir, recipe_changes, resume_command

DATA_KEYS = ("train", "valid", "valid_fraction", "text_field", "source_field", "target_field")  # what is read


def recipe_for_run(name_or_path: str, overrides: list[str] | None, run_dir: str | Path | None,
                   resume: str | None, force: bool = False) -> Recipe:
    """The recipe `tfkit pretrain` runs: RECIPE with `overrides` for a new run (or with `force`); for a
    resume, the run folder's recipe.yaml with `overrides`, refused when the training data would change."""
    given = load_recipe(name_or_path, overrides)
    if resume is None or force:
        return given
    folder = choose_run_dir(given, run_dir, resume)
    saved = folder / RECIPE_FILE
    if not saved.is_file():  # nothing to continue (--resume auto of a run not started yet): a fresh start
        return given
    before, kept = load_recipe(str(saved)), load_recipe(str(saved), overrides)
    changes = data_changes(before, given) or data_changes(before, kept)
    if changes:
        raise ConfigError(f"resume: would change the training data of {folder} ({'; '.join(changes)}); continue it "
                          f"on its own data with `{resume_command(folder)}` (add overrides KEY=VALUE for what should "
                          "change), or pass force to train on the new data", params=("resume", "overrides", "force"))
    unused = [change.split(":")[0] for change in recipe_changes(kept.to_dict(), given.to_dict())]
    if unused:  # said in the start block, once the run has its folder
        kept.notes = (f"resuming with {saved}; {name_or_path} differs from it in {len(unused)} key(s) that are not "
                      f"used ({', '.join(unused[:4])}{', ...' if len(unused) > 4 else ''}): an override "
                      "(SECTION.KEY=VALUE) changes a key of the run",)
    return kept


def data_changes(before: Recipe, after: Recipe) -> list[str]:
    """`data.KEY: old -> new` for every key of DATA_KEYS that differs."""
    return [f"data.{key}: {getattr(before.data, key)!r} -> {getattr(after.data, key)!r}" for key in DATA_KEYS
            if getattr(before.data, key) != getattr(after.data, key)]


def restart_resume(resume: str | None) -> str | None:
    """`--resume` as a run started again by torchrun means it: `auto` (its newest complete checkpoint) when
    torchrun restarted the workers (`--max-restarts`, TORCHELASTIC_RESTART_COUNT > 0) and no resume was given,
    so a restarted command continues its run instead of refusing the folder it wrote (`restarts` says so)."""
    return "auto" if resume is None and restarts() > 0 else resume


def restarts() -> int:
    """How many times torchrun has restarted this run's workers (0 outside torchrun)."""
    try:
        return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    except ValueError:
        return 0
