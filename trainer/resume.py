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

from ..checkpoints.folders import latest_checkpoint
from ..errors import ConfigError, TfkitError
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


def restart_resume(resume: str | None, recipe: Recipe, run_dir: str | Path | None) -> tuple[str | None, str | None]:
    """(`--resume` as a run started again by torchrun means it, the line that says so): `auto`, its newest
    complete checkpoint, when no resume was given and either torchrun restarted this node's workers
    (`--max-restarts`, TORCHELASTIC_RESTART_COUNT > 0) or the newest checkpoint of the run folder was written
    under the same torchrun run (TORCHELASTIC_RUN_ID: another node's workers restarted, or a requeued job
    started again with the same `--rdzv-id`). A restarted command then continues its run instead of
    refusing the folder it wrote. Asked on rank 0 alone, whose answer every rank takes."""
    run_id = os.environ.get("TORCHELASTIC_RUN_ID")
    if resume is not None or run_id is None:
        return resume, None
    if restarts() > 0:
        return "auto", f"torchrun restart {restarts()} (TORCHELASTIC_RESTART_COUNT)"
    latest = latest_checkpoint(choose_run_dir(recipe, run_dir, "auto"))
    if latest is not None and elastic_run_of(latest) == run_id:
        return "auto", f"torchrun run {run_id} (TORCHELASTIC_RUN_ID) started again"
    return None, None


def restarts() -> int:
    """How many times torchrun has restarted this node's workers (0 outside torchrun)."""
    try:
        return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    except ValueError:
        return 0


def elastic_run() -> str | None:
    """The torchrun run this process belongs to (TORCHELASTIC_RUN_ID), which each checkpoint records."""
    return os.environ.get("TORCHELASTIC_RUN_ID")


def elastic_run_of(checkpoint: Path) -> str | None:
    """The torchrun run that wrote a training checkpoint (None: outside torchrun, or unreadable)."""
    from ..checkpoints.trainer_state import load_trainer_state  # torch: only under torchrun, past the CLI's checks

    try:
        return load_trainer_state(checkpoint).get("elastic_run")
    except TfkitError:
        return None
