"""What `--out` may replace, decided before any work (`check_new_folder`): never an input, never a folder
inside a training run's checkpoints/, and with --force only the earlier output of the same command.

Never an input holds for every command that writes (`check_not_an_input`: predict --out, eval --json,
export-hf / export-gguf / convert-mqa-to-gqa / import-hf / train-tokenizer --out, a run folder and the
data it reads): an output is compared with each input resolved (symlinks followed), as the same file
(device and inode: a hard link, a bind mount), and as a folder that holds or lies inside it.

Kept apart from files.py, which does the writing: this module only looks at folders and refuses with a
CheckpointError naming `--out`; it renames nothing. The folders are recognised by the names in layout.py,
so it imports no subpackage.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterable
from pathlib import Path

from .errors import CheckpointError, ConfigError, DataError, TfkitError
from .files import write_problem
from .jsonfile import read_json
from .layout import (BEST, CHECKPOINTS, CLASSIFIER_EXPORT_ARCHITECTURES, CONFIG, EXPORT_ARCHITECTURES, MODEL_CARD,
                     RECIPE_FILE, SHARDS, STEP_FOLDER, TOKENIZER_FILES, TRAINER_STATE, WEIGHTS)

# What `--force` may replace, by the command that writes it (see `_existing_kind`): each command replaces
# only its own earlier output, never a training checkpoint, a user's HuggingFace model or other files.
TFKIT_MODEL = "a tfkit model folder (what convert-mqa-to-gqa and import-hf write)"
TFKIT_EXPORT = "a HuggingFace folder written by tfkit export-hf"
EXPORT_FILES = {CONFIG, WEIGHTS, MODEL_CARD, *TOKENIZER_FILES}
ALL_EXPORT_ARCHITECTURES = (*EXPORT_ARCHITECTURES.values(), *CLASSIFIER_EXPORT_ARCHITECTURES.values())


def input_paths(spec: str | Path) -> list[Path]:
    """The files or folders an input names: the path itself, or the matches of a glob (`data/*.txt`); none
    for what no path names (`stdlib:docs`, a file that does not exist: its own reader refuses it)."""
    path = Path(spec).expanduser()
    if os.path.lexists(path):
        return [path]
    return sorted(Path(p) for p in glob.glob(str(path))) if glob.has_magic(str(path)) else []


def input_conflict(out: Path, source: Path, inside: bool = True) -> str | None:
    """How writing `out` would touch the input `source`, in words; None when it would not. Both are resolved
    (symlinks followed) and an existing `out` is also compared by device and inode (a hard link or a bind
    mount names the same file under another path). `inside`: whether writing inside the input folder
    counts (it does for data and checkpoint folders; a run folder's own files are guarded by the trainer)."""
    target, resolved = out.resolve(), source.resolve()
    if target == resolved or (out.exists() and source.exists() and os.path.samefile(out, source)):
        return f"is the input {source}" + (f" (through a link: {resolved})" if resolved != source.absolute() else "")
    if target in resolved.parents:
        return f"holds the input {source}"
    if inside and resolved.is_dir() and resolved in target.parents and _guards(resolved, target):
        return f"lies inside the input {source}"
    return None


def _guards(folder: Path, target: Path) -> bool:
    """Whether writing `target` inside the input `folder` would change what is read: anywhere in a data or
    checkpoint folder, but in a training run's folder only its checkpoints (checkpoints/, best/): beside them
    a run folder holds other commands' outputs (`predict RUN --out RUN/preds.jsonl`)."""
    if not ((folder / RECIPE_FILE).is_file() or (folder / CHECKPOINTS).is_dir()):
        return True
    return any(guarded in target.parents for guarded in (folder / CHECKPOINTS, folder / BEST))


def check_not_an_input(out: Path, inputs: Iterable[str | Path], flag: str, error: type[TfkitError] = ConfigError,
                       inside: bool = True) -> None:
    """Refuse, as one line naming `flag` (an option, or a library parameter the CLI spells as its flag), an
    output that is, holds or lies inside one of `inputs` (paths, globs or specs such as `stdlib:docs`):
    `--force` replaces earlier outputs, never what the command reads."""
    for spec in inputs:
        for source in input_paths(spec):
            problem = input_conflict(out, source, inside)
            if problem:
                raise error(f"{flag} {out}: {problem}; an input is never written over, --force or not: choose "
                            "another path", params=() if flag.startswith("-") else (flag, "force"))


def check_new_folder(out: Path, sources: Iterable[Path], force: bool, replaces: tuple[str, ...]) -> None:
    """Before any work, every reason `--out` could fail or destroy something, as one line:
    - it may never be, contain or lie inside an input checkpoint (even --force would then destroy the
      model being read);
    - nor lie in a training run's `checkpoints/`, where `eval RUN` would take it for the run's own latest;
    - a regular file in its path, or a folder there that cannot be written, fails now, not after the work;
    - an existing non-empty `out` needs --force, and even --force replaces only the earlier output of the
      calling command (`replaces`: TFKIT_MODEL and/or TFKIT_EXPORT), never a file or a folder of other things."""
    target = out.resolve()
    for source in (Path(s) for s in sources):  # writing inside a checkpoint counts, beside a run's own files not
        if input_conflict(out, source, inside=(source / WEIGHTS).is_file() or (source / SHARDS).is_dir()):
            raise CheckpointError(f"--out {out}: is or contains the input {source.resolve()}, or lies inside it; "
                                  "the input is never modified, choose another folder")
    run = _run_of(target)
    if run is not None:
        raise CheckpointError(f"--out {out}: lies in the checkpoints folder of the training run {run}, where "
                              f"`tfkit eval {run}` would take it for the run's latest checkpoint; choose a "
                              "folder outside it")
    problem = write_problem(out)
    if problem:
        raise CheckpointError(f"--out {out}: {problem}")
    if _is_taken(target) and not force:
        raise CheckpointError(f"--out {out}: already exists; use --force to replace it")
    check_replaceable(out, replaces)


def check_replaceable(out: Path, replaces: tuple[str, ...]) -> None:
    """What --force may replace: an existing non-empty `out` must be one of `replaces` (TFKIT_MODEL,
    TFKIT_EXPORT), the earlier output of the command; anything else is kept, with a CheckpointError."""
    target = out.resolve()
    if not _is_taken(target):
        return
    kind = _existing_kind(target)
    if kind not in replaces:
        raise CheckpointError(f"--out {out}: exists and is {kind}; --force replaces only {' or '.join(replaces)}, "
                              "so it is kept: remove it yourself if it should go, or choose another folder")


def _is_taken(target: Path) -> bool:
    """Whether writing `target` would replace something: a file, or a folder that is not empty."""
    return target.exists() and (not target.is_dir() or any(target.iterdir()))


def _run_of(target: Path) -> Path | None:
    """The training run whose `checkpoints/` folder `target` would be written into, else None. A run folder
    is recognised as the trainer leaves it: its recipe.yaml, or a `step-<N>` folder in checkpoints/."""
    holder = target.parent
    if holder.name != CHECKPOINTS or not holder.is_dir():
        return None
    steps = any(STEP_FOLDER.match(child.name) and child.is_dir() for child in holder.iterdir())
    return holder.parent if steps or (holder.parent / RECIPE_FILE).is_file() else None


def _existing_kind(folder: Path) -> str:
    """What an existing non-empty `--out` is, in the words of the error that refuses to replace it;
    TFKIT_MODEL / TFKIT_EXPORT for the outputs of tfkit's own commands."""
    if not folder.is_dir():
        return "not a model folder (it is a file)"
    if not (folder / CONFIG).is_file():
        return f"not a model folder (no {CONFIG})"
    if (folder / TRAINER_STATE).is_file():
        return f"a training checkpoint (it has {TRAINER_STATE})"
    try:
        config = read_json(folder / CONFIG, CheckpointError)
    except CheckpointError:
        config = None
    if not isinstance(config, dict):
        return f"a folder whose {CONFIG} is not a JSON object"
    if "tfkit_version" in config:
        return TFKIT_MODEL
    if _is_tfkit_export(folder, config):
        return TFKIT_EXPORT
    if "model_type" in config or "architectures" in config:
        return "a HuggingFace model folder that tfkit export-hf did not write"
    return f"a folder whose {CONFIG} tfkit did not write"


def _is_tfkit_export(folder: Path, config: dict) -> bool:
    """Whether `folder` is what export-hf writes: its files only, and a config.json naming an export
    architecture without the `transformers_version` that every transformers `save_pretrained` adds (so
    a model saved or downloaded with transformers is never taken for an export)."""
    files = {p.name for p in folder.iterdir()}
    return (WEIGHTS in files and files <= EXPORT_FILES and "transformers_version" not in config
            and config.get("architectures") in [[name] for name in ALL_EXPORT_ARCHITECTURES])


# `tfkit eval --json`: a results file replaced only when it holds earlier results.
def check_json_out(path: Path, inputs: Iterable[str | Path] = ()) -> None:
    """--json must name a file we can write, checked before evaluating (which can take minutes), so the
    results are never computed only to be lost. Its folder may not exist yet: it is made at the end.
    An existing file is replaced only when it holds earlier results, so rerunning a comparison works but
    a slip (`--json` naming the corpus, or a checkpoint's config.json) never destroys the user's file; and
    never when it is one of the command's `inputs` (an earlier results file scored as the corpus)."""
    if path.is_dir():
        raise ConfigError(f"--json {path}: is a folder, expected a file path such as {path / 'results.json'}")
    problem = write_problem(path)
    if problem:
        raise ConfigError(f"--json {path}: {problem}")
    if path.exists() and not holds_results(path):
        raise ConfigError(f"--json {path}: the file exists and does not hold earlier `tfkit eval` results; "
                          "name a new file (it would be overwritten)")
    check_not_an_input(path, inputs, "--json")


def holds_results(path: Path) -> bool:
    """Whether `path` is what `--json` writes: a JSON list of rows, each with a checkpoint and a loss (or an
    accuracy: `--task`)."""
    try:
        rows = read_json(path, expect=list)
    except DataError:
        return False
    return isinstance(rows, list) and all(isinstance(r, dict) and "checkpoint" in r and ("loss" in r or "acc" in r)
                                          for r in rows)
