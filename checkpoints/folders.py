"""Where checkpoints are: a checkpoint folder, a run folder's `checkpoints/step-N/` and `best/`.

One scanner (`step_folders`) finds the complete `step-N` folders under a folder; everything that turns a
path a user gives into a checkpoint goes through it: `resolve_checkpoint` (eval, generate, export, convert,
`init_from`), `list_checkpoints` / `resolve_resume` (`--resume`, pruning, divergence), `read_checkpoint`
(what a command reads from one checkpoint while its run may still be rotating them away). A folder being
written is a hidden temporary (`.step-N.tmp-*`, files.staged_folder), which the scanner never matches.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from ..errors import CheckpointError, TfkitError
from ..files import set_aside
from ..layout import (BEST, CHECKPOINTS, CONFIG, RECIPE_FILE, SHARDS, SHARDS_METADATA, STEP_FOLDER, TRAINER_STATE,
                      WEIGHTS)
from .record import CheckpointRecord

T = TypeVar("T")
ROTATION_RETRIES = 3  # checkpoints of a running training read in turn before saying that it is writing


def is_complete(folder: Path) -> bool:
    """Whether `folder` holds the weights and config.json a checkpoint is (config.json is written last): the
    weights in one file, or the shards of a run of several processes (sharded.py)."""
    return ((folder / WEIGHTS).is_file() or is_sharded(folder)) and (folder / CONFIG).is_file()


def is_sharded(folder: Path) -> bool:
    """Whether `folder` holds its weights as shards, written by every process of a run (checkpoints/sharded.py):
    `shards/.metadata`, which rank 0 writes once every rank's files are on disk."""
    return (folder / SHARDS / SHARDS_METADATA).is_file()


def form_of(folder: Path) -> str:
    """How a checkpoint holds its weights, as the report says it."""
    return f"sharded: {SHARDS}/, torch.distributed.checkpoint" if is_sharded(folder) else f"single file: {WEIGHTS}"


def step_folders(parent: Path, training: bool = False) -> list[tuple[int, Path]]:
    """(step, folder) of every complete `step-N` folder directly under `parent`, oldest first; with `training`
    only those holding a trainer state too (the checkpoints a run resumes from)."""
    if not parent.is_dir():
        return []
    found = []
    for child in parent.iterdir():
        match = STEP_FOLDER.match(child.name)
        if match and child.is_dir() and is_complete(child) and (not training or (child / TRAINER_STATE).is_file()):
            found.append((int(match.group(1)), child))
    return sorted(found)


def list_checkpoints(run_dir: Path) -> list[tuple[int, Path]]:
    """(step, folder) of every complete training checkpoint of a run folder, oldest first."""
    return step_folders(run_dir / CHECKPOINTS, training=True)


def latest_checkpoint(run_dir: Path) -> Path | None:
    found = list_checkpoints(run_dir)
    return found[-1][1] if found else None


def resolve_checkpoint(path: str | Path, best: bool = False) -> Path:
    """A checkpoint folder is itself; a run folder (or its `checkpoints/`) gives the complete
    `checkpoints/step-<N>/` with the highest N, or with `best` (eval, generate) its complete `best/` when
    train.keep_best wrote one. Anything else is a CheckpointError naming the path."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path}: no such checkpoint or run folder")
    if best and not is_complete(path) and is_complete(path / BEST):
        return path / BEST
    if path.is_file() and path.name in (WEIGHTS, CONFIG):
        path = path.parent
    if is_complete(path):
        return path
    steps = step_folders(path / CHECKPOINTS) or step_folders(path)
    if steps:
        return steps[-1][1]
    if (path / CONFIG).is_file() or (path / WEIGHTS).is_file():
        missing = WEIGHTS if (path / CONFIG).is_file() else CONFIG
        raise CheckpointError(f"{path}: incomplete checkpoint, {missing} is missing")
    raise CheckpointError(
        f"{path}: not a checkpoint folder (expected {WEIGHTS} and {CONFIG}) "
        "nor a run folder with a complete checkpoints/step-<N>/"
    )


def resolve_resume(path: str | Path) -> Path:
    """A checkpoint folder, or a run folder's latest checkpoint, that holds a trainer state."""
    path = Path(path).expanduser()
    if not path.exists():
        raise CheckpointError(f"resume {path}: no such file or folder (give a run folder, one of its "
                              "checkpoints/step-<N>/, or auto)", params=("resume",))
    if (path / TRAINER_STATE).is_file():
        return path
    latest = latest_checkpoint(path) if path.is_dir() else None
    if latest is None:
        raise CheckpointError(f"resume {path}: not a training checkpoint (no {TRAINER_STATE}) "
                              "nor a run folder with checkpoints/step-<N>/", params=("resume",))
    return latest


def run_folder_of(folder: Path) -> Path | None:
    """The training run a checkpoint folder belongs to (`<run>/checkpoints/step-N`, `<run>/best`), if any."""
    run = folder.parent.parent if folder.parent.name == CHECKPOINTS else folder.parent if folder.name == BEST else None
    return run if run is not None and (run / RECIPE_FILE).is_file() else None


def read_checkpoint(path: str | Path, read: Callable[[Path], T], *, best: bool = False) -> tuple[Path, T]:
    """(folder, read(folder)) for the checkpoint `path` resolves to (`resolve_checkpoint`).

    A run that is still training removes its older checkpoints as it saves new ones (train.keep_last), so
    the folder resolved a moment ago can vanish while it is read. Then the newest complete checkpoint is
    read instead; when that keeps happening, the error says that the run is writing. Everything a command
    reads from one checkpoint goes into one `read`, so it all comes from the same folder."""
    path, removed = Path(path), []
    for _ in range(ROTATION_RETRIES):
        folder = resolve_checkpoint(path, best=best)
        try:
            return folder, read(folder)
        except (TfkitError, OSError):
            if folder == path or is_complete(folder):  # not a rotation: the checkpoint itself is at fault
                raise
            removed.append(folder.name)
    raise CheckpointError(f"{path}: the run is writing checkpoints and removed {', '.join(removed)} while they were "
                          "read (train.keep_last); run the command again, or pass a checkpoint folder the run keeps")


def chosen_note(path: str | Path, folder: Path) -> str | None:
    """When `resolve_checkpoint(path, best=True)` took a run's best/ over its latest checkpoint, the line
    that says so (which step, its validation loss, and how to take the latest instead)."""
    if folder.name != BEST or Path(path) == folder:
        return None
    record = CheckpointRecord.read(folder)
    latest = resolve_checkpoint(path)
    return (f"{path}: using best/ (step {record.step}, validation loss {record.val_loss:.4f}) kept by "
            f"train.keep_best; for the latest weights pass {latest}" if record.val_loss is not None
            else f"{path}: using best/ kept by train.keep_best; latest: {latest}")


BEST_SET_ASIDE = "best-set-aside-step-"  # run_dir/best-set-aside-step-<K>[-n]/: a best/ a restart did not keep



def set_aside_best(run_dir: Path, start_step: int, same_run: bool) -> tuple[Path, str] | None:
    """At a start of the run folder from step `start_step` (0: a fresh start, or a restart of a run killed
    before its first checkpoint), set aside a `best/` the run cannot stand behind; returns (where it went,
    why) or None when it is kept.

    best/ is kept only when the step it holds is at or before `start_step` of the same run: its weights
    then come from updates the run keeps, and its val_loss is the bar the next validations must beat. A
    best/ from a later step (a run killed after its best/ but before the checkpoint that followed) came
    from updates the restart trains again, maybe with another recipe; one of a fresh start, of another
    run's checkpoint (a branch) or unreadable cannot be vouched for either. Such a best/ is never deleted
    (its weights were validated, the user may want them) nor kept (eval and generate would take it for
    this run's): it is renamed to `best-set-aside-step-<K>/`, and the run writes best/ anew."""
    best = run_dir / BEST
    if not best.exists():
        return None
    try:
        step = CheckpointRecord.read(best).step
    except TfkitError:
        step = None
    if same_run and step is not None and step <= start_step:
        return None
    name, n = f"{BEST_SET_ASIDE}{'unknown' if step is None else step}", 1
    while (run_dir / name).exists():  # an earlier restart set one aside under this name: both are kept
        name, n = f"{BEST_SET_ASIDE}{'unknown' if step is None else step}-{n}", n + 1
    why = ("its config.json is unreadable" if step is None else
           f"it holds step {step}, from updates this run trains again" if same_run and start_step else
           f"it holds step {step}, and this run starts afresh" if same_run else
           f"it holds step {step} of this folder, and this run continues the checkpoint of another")
    return set_aside(best, name), why

