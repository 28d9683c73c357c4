"""A run's folder: which one, what a run may overwrite in it, its lock, the checkpoint it resumes, its
recipe.yaml and start.log.

A run folder holds `recipe.yaml` (the resolved recipe, rewritten on resume), `tokenizer/`, `data/`,
`checkpoints/step-<N>/`, `metrics.jsonl` and, when a resume changed the recipe,
`recipe-before-step-<N>.yaml`. The checks here run before anything is written: a folder tfkit did not
make is never overwritten, and checkpoints of two runs (or of two branches of one) are never mixed. A
run holds the folder's lock (`.tfkit.lock`, `files.folder_lock`) from before its first read to its end,
so a second `pretrain` on the same folder is refused instead of training beside it. What a run takes
from the checkpoint it starts from (model config, data, precision) is `source`'s concern.

A folder tfkit made is always resumable or restartable by tfkit, whatever moment its run was killed at:
everything a run writes, and every temporary it writes it under (`.NAME.tmp-*`, `.NAME.old-*`), is its own
(`is_run_entry`); what a dead process left half-written is cleared when the next run takes the folder
(`FolderClaim.take`: `files.remove_stale`), and a `best/` the restarted run cannot stand behind is set
aside (`keep_or_set_aside_best`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import shutil
import time
from pathlib import Path

import yaml

from ..checkpoints.folders import BEST_SET_ASIDE, latest_checkpoint, list_checkpoints, resolve_resume, set_aside_best
from ..checkpoints.record import CheckpointRecord
from ..checkpoints.run_record import read_metrics
from ..errors import CheckpointError, disk_full
from ..files import LOCK_FILE, folder_lock, remove_stale, write_atomic
from ..jsonfile import parse_json
from ..layout import BEST, CHECKPOINTS, RECIPE_FILE, START_LOG, STEP_FOLDER
from ..replacing import input_conflict, input_paths
from ..tokenization.sources import source_paths
from ..yamlfile import AliasBomb, safe_load
from .recipe import TASK_OBJECTIVES

RECIPE_HEADER = "# The resolved recipe of this run, written by tfkit pretrain (rewritten when the run resumes).\n"
AUTO_SUFFIX = r"-\d{8}-\d{6}(-\d+)?"  # what choose_run_dir appends to the recipe name: -YYYYmmdd-HHMMSS[-N]
RUN_ENTRIES = {RECIPE_FILE, START_LOG, "tokenizer", "data", CHECKPOINTS, "metrics.jsonl", "loss.png", "tensorboard",
               "wandb", LOCK_FILE, BEST}
# The names a run writes besides RUN_ENTRIES: what a resume replaced and what a restart set aside.
RUN_PATTERNS = re.compile(rf"recipe-before-step-\d+\.yaml|{BEST_SET_ASIDE}\w+(-\d+)?")
TEMPORARY = re.compile(r"\.(?P<name>.+)\.(tmp|old)-(?P<owner>.*)")  # files.atomic_file / staged_folder's names


def is_run_entry(name: str) -> bool:
    """Whether `name`, an entry of a run folder, is one a run writes: its files and folders, and the
    temporaries it writes them under (a kill at any moment leaves one of these, never anything else)."""
    temporary = TEMPORARY.fullmatch(name)
    if temporary:
        name = temporary.group("name")
    return name in RUN_ENTRIES or bool(RUN_PATTERNS.fullmatch(name))


def choose_run_dir(recipe, run_dir: str | Path | None, resume: str | None) -> Path:
    """`--run-dir`, else `log.run_dir`, else the run folder of `--resume PATH`, else (with `--resume auto`)
    the newest `runs/<recipe>-<YYYYmmdd-HHMMSS>` holding a checkpoint (only names tfkit gives: a user's own
    `runs/<recipe>-pre` is never taken for one), else a new `runs/<recipe>-<YYYYmmdd-HHMMSS>`."""
    if run_dir:
        return Path(run_dir).expanduser()
    if recipe.log.run_dir:
        return Path(recipe.log.run_dir).expanduser()
    if resume and resume != "auto":
        folder = resolve_resume(resume)
        return folder.parent.parent  # <run>/checkpoints/step-N
    if resume == "auto":
        named = re.compile(re.escape(recipe.name) + AUTO_SUFFIX)  # only folders tfkit named, not runs/<name>-mine
        previous = [p for p in sorted(Path("runs").glob(f"{recipe.name}-*"))
                    if named.fullmatch(p.name) and latest_checkpoint(p)]
        if previous:
            return previous[-1]
    stamp = time.strftime("%Y%m%d-%H%M%S")
    candidate, n = Path("runs") / f"{recipe.name}-{stamp}", 1
    while candidate.exists():  # two runs started in the same second
        candidate, n = Path("runs") / f"{recipe.name}-{stamp}-{n}", n + 1
    return candidate


def check_run_dir(run_dir: Path, fresh: bool) -> None:
    """Refuse a run folder whose files tfkit would overwrite without having written them, before anything
    is written: a hand-made recipe.yaml (e.g. the folder of the recipe being run, passed as --run-dir),
    or, for a fresh start (which replaces metrics.jsonl, tokenizer/, ...), any folder holding files
    that a run does not make. A run that crashed before its first checkpoint can be started again."""
    if run_dir.exists() and not run_dir.is_dir():
        raise CheckpointError(f"run folder {run_dir}: exists and is not a folder; choose another run_dir",
                              params=("run_dir",))
    if not run_dir.is_dir():
        return
    recipe = run_dir / RECIPE_FILE
    if recipe.is_file() and not recipe.read_text(encoding="utf-8", errors="replace").startswith(RECIPE_HEADER):
        raise CheckpointError(f"run folder {run_dir}: its {RECIPE_FILE} was not written by tfkit pretrain and "
                              "would be overwritten; choose another run_dir", params=("run_dir",))
    foreign = sorted(p.name for p in run_dir.iterdir() if not is_run_entry(p.name))
    if fresh and foreign:
        raise CheckpointError(f"run folder {run_dir}: holds files a tfkit run does not make ({', '.join(foreign[:3])}"
                              f"{', ...' if len(foreign) > 3 else ''}); choose another run_dir", params=("run_dir",))


def check_inputs_apart(run_dir: Path, recipe, fresh: bool) -> None:
    """Before anything is written: the run never writes what it reads. Refused, naming the recipe key: a data
    file or folder (data.train, data.valid; on a fresh start also tokenizer.path and train.init_from, which
    only a fresh start reads) that is, or lies inside, one of the run's own entries (tokenizer/, data/,
    checkpoints/, best/, metrics.jsonl, ...), and a run folder that is, or lies inside, a data folder (the
    run's files would be read as data by the next start, which then refuses the changed data). The recipe
    file itself may be the run folder's recipe.yaml: that is how a run is resumed."""
    outputs = [run_dir / name for name in sorted(RUN_ENTRIES - {RECIPE_FILE, LOCK_FILE})]
    inputs = {key + part: spec for key in ("data.train", "data.valid")  # a list: data.train[NAME] per source
              for part, spec in source_paths(getattr(recipe.data, key.split(".")[1]))}
    if fresh:
        inputs.update({"tokenizer.path": recipe.tokenizer.path, "train.init_from": recipe.train.init_from})
    folder = run_dir.resolve()
    for key, spec in inputs.items():
        for source in input_paths(spec) if spec else []:
            resolved = source.resolve()
            if resolved.is_dir() and (resolved == folder or resolved in folder.parents):
                raise CheckpointError(f"{key} {spec}: the run folder {run_dir} lies inside it, so the run's own "
                                      "files would be read as data; a run never writes over what it reads: "
                                      "choose a run_dir outside it", params=("run_dir",))
            for out in outputs:
                if problem := input_conflict(out, source, inside=False):
                    where = "is" if problem.startswith("is") else "lies inside"
                    raise CheckpointError(f"{key} {spec}: {where} {out}, which the run writes; a run never writes "
                                          "over what it reads: move it or choose another run_dir",
                                          params=("run_dir",))


class FolderClaim:
    """Rank 0's hold on its run folder for the life of a run: the folder made when missing and its lock
    taken (`files.folder_lock`: a second `pretrain` on the same folder is refused in one line), and
    after a failed start whatever this process made removed again."""

    def __init__(self) -> None:
        self.path: Path | None = None
        self.stack = contextlib.ExitStack()  # holds the lock until close()
        self.made: list[Path] = []  # the folder and the parents this process created, deepest first
        self.lock_created = False  # whether this process made the lock file

    def take(self, run_dir: Path) -> None:
        if run_dir.exists() and not run_dir.is_dir():
            check_run_dir(run_dir, fresh=True)  # names the file in the way
        self.path, self.made = run_dir, [d for d in (run_dir, *run_dir.parents) if not d.exists()]
        run_dir.mkdir(parents=True, exist_ok=True)
        self.lock_created = not (run_dir / LOCK_FILE).exists()
        try:
            self.stack.enter_context(folder_lock(run_dir))
        except CheckpointError:  # another process holds it: nothing here is this process's to remove
            self.made, self.lock_created = [], False
            raise
        except OSError:  # no lock file could be made (a full disk): what this process made goes again
            self.discard()
            raise
        clear_leftovers(run_dir)

    def discard(self) -> None:
        """Remove what this claim made: a refused or broken start leaves nothing behind (an empty
        runs/NAME-TIME/ only misleads `--resume auto` and the user); a folder it did not make stays as it was."""
        if self.lock_created and not self.made:
            (self.path / LOCK_FILE).unlink(missing_ok=True)
        if self.made:
            shutil.rmtree(self.made[0], ignore_errors=True)
        for parent in self.made[1:]:  # e.g. runs/, when this run made it: only while empty
            if parent.is_dir() and not any(parent.iterdir()):
                parent.rmdir()
        self.made, self.lock_created = [], False

    def close(self) -> None:
        self.stack.close()


def clear_leftovers(run_dir: Path) -> None:
    """What dead processes left half-written in the run folder and its checkpoints/, cleared once the
    folder is this run's (its lock held): their temporaries removed, a folder they had set aside to replace
    and never replaced put back (`files.remove_stale`; a live process's and another host's stay)."""
    for folder in (run_dir, run_dir / CHECKPOINTS):
        try:
            names = {found.group("name") for entry in folder.iterdir() if (found := TEMPORARY.fullmatch(entry.name))}
        except OSError:
            continue
        for name in sorted(names):
            remove_stale(folder / name)


def keep_or_set_aside_best(run_dir: Path, resumed_from: Path | None, console) -> None:
    """Before the run writes: the folder's best/ kept when the run continues the updates it came from, else
    set aside with a warning on `console` (`checkpoints.folders.set_aside_best` says why). A run killed
    after its first best/ but before its first checkpoint restarts from step 0, so its best/ goes aside."""
    same_run = resumed_from is None or resumed_from.parent.parent.resolve() == run_dir.resolve()
    start = (CheckpointRecord.read(resumed_from).step or 0) if resumed_from is not None else 0
    moved = set_aside_best(run_dir, start, same_run)
    if moved is not None:
        where, why = moved
        console.print(f"warning: {run_dir / BEST}: set aside as {where.name}/ ({why}); this run writes best/ "
                      "anew", style="yellow", markup=False, highlight=False)


def resume_command(run_dir: Path) -> str:
    """The command that continues a run: its own recipe.yaml (the recipe it trained with, --set overrides
    included), so nothing the run was started with has to be remembered."""
    return f"tfkit {_command_of(run_dir)} {run_dir / RECIPE_FILE} --resume auto --run-dir {run_dir}"


def _command_of(run_dir: Path) -> str:
    """finetune for a fine-tuning run (its recipe's objective classify / regress), else pretrain."""
    try:
        objective = (read_run_recipe(run_dir / RECIPE_FILE, (run_dir / RECIPE_FILE).read_bytes()).get("objective")
                     or {})
    except (OSError, CheckpointError):
        return "pretrain"
    return "finetune" if isinstance(objective, dict) and objective.get("name") in TASK_OBJECTIVES else "pretrain"


def disk_full_during_run(exc: OSError, run_dir: Path, checkpoint: Path | None) -> Exception:
    """The one line for a disk that filled during training: the path, and the checkpoint that is intact."""
    kept = (f"the last complete checkpoint {checkpoint} is intact (continue with `{resume_command(run_dir)}` once "
            "there is space)" if checkpoint else
            "no checkpoint was complete yet; what was written before is intact")
    return disk_full(exc, kept)


def find_resume(run_dir: Path, resume: str | None) -> Path | None:
    """The checkpoint to resume from, None for a fresh start.

    Refused, because checkpoints would be overwritten or mixed (pruning keeps the newest steps): a fresh
    start into a folder that holds checkpoints; resuming into a folder that holds checkpoints of another
    run, or later checkpoints of this one (resuming step-10 of a run that reached step-20 would replace
    step-20). Branching from an older step goes to a new --run-dir."""
    if resume is not None and not resume.strip():
        raise CheckpointError("resume '': empty, expected auto, a run folder or one of its checkpoints/step-<N>/",
                              params=("resume",))
    if resume == "auto":
        return latest_checkpoint(run_dir)
    if not resume:
        if latest_checkpoint(run_dir):
            raise CheckpointError(f"run folder {run_dir} already holds checkpoints; pass resume auto to continue "
                                  "it, or choose another run_dir", params=("resume", "run_dir"))
        return None
    source = resolve_resume(resume)
    same_run = source.parent.parent.resolve() == run_dir.resolve()
    named = STEP_FOLDER.match(source.name)
    source_step = int(named.group(1)) if named else -1
    clash = [path.name for step, path in list_checkpoints(run_dir) if not same_run or step > source_step]
    if clash:
        whose = "later checkpoints" if same_run else "checkpoints of another run"
        raise CheckpointError(f"resume {resume}: run folder {run_dir} holds {whose} ({', '.join(clash)}) that "
                              "this run would overwrite or mix with; choose a new folder with run_dir",
                              params=("resume", "run_dir"))
    return source


def write_recipe(run_dir: Path, recipe, resumed_from: Path | None, console) -> None:
    """Save the resolved recipe as run_dir/recipe.yaml; what a resume changed is a warning on `console`.

    A resumed run may legitimately change keys (more steps, a lower learning rate), but then recipe.yaml
    no longer describes how the earlier checkpoints were trained: the recipe they were trained with (the
    run folder's, or for a branch into a new folder the source run's) is kept as
    recipe-before-step-<N>.yaml and the changes are a warning on `console`. If that file exists already, an
    earlier resume from the same step N changed the recipe too; nothing it trained survives (resuming
    from N again means no later checkpoint exists), so the first file, the recipe that trained up to N,
    is the one to keep."""
    step, changes = None, []
    if resumed_from is not None:
        step = CheckpointRecord.read(resumed_from).step or 0
        previous = _previous_recipe(run_dir, resumed_from)
        if previous is not None:
            kept = previous.read_bytes()  # copied byte for byte below
            earlier = read_run_recipe(previous, kept)
            if isinstance(earlier.get("tokenizer"), dict):  # the run keeps its tokenizer (check_tokenizer_kept)
                recipe = dataclasses.replace(recipe, tokenizer=type(recipe.tokenizer)(**earlier["tokenizer"]))
            changes = recipe_changes(earlier, recipe.to_dict())
            before = run_dir / f"recipe-before-step-{step}.yaml"
            if changes and not before.exists():
                write_atomic(before, kept)
    write_atomic(run_dir / RECIPE_FILE, RECIPE_HEADER + recipe.to_yaml())
    if changes:
        console.print(f"warning: the recipe changed since step {step} (the one that trained up to it is kept as "
                      f"recipe-before-step-{step}.yaml): " + "; ".join(changes), style="yellow", markup=False,
                      highlight=False)


def read_run_recipe(path: Path, data: bytes) -> dict:
    """A run folder's recipe.yaml as a dict, or one CheckpointError line when it is damaged."""
    try:
        earlier = safe_load(data.decode("utf-8")) or {}
    except (UnicodeDecodeError, yaml.YAMLError, AliasBomb) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise CheckpointError(f"{path}: damaged, not the recipe tfkit pretrain wrote ({reason}); restore it, or "
                              "resume into a new folder with run_dir", params=("run_dir",)) from None
    if not isinstance(earlier, dict):
        raise CheckpointError(f"{path}: damaged, expected a mapping of recipe sections, got {type(earlier).__name__}; "
                              "restore it, or resume into a new folder with run_dir", params=("run_dir",))
    return earlier


def check_run_files(run_dir: Path) -> None:
    """Before a resume writes anything: the files of the run folder it reads and rewrites are readable.
    recipe.yaml (compared with the new recipe) and metrics.jsonl (cut back to the resumed step) are
    checked here, so that a damaged one is one line naming it, not a traceback halfway through the setup.
    A torn last line of metrics.jsonl is what a killed run leaves, and is dropped as before."""
    recipe = run_dir / RECIPE_FILE
    if recipe.is_file():
        read_run_recipe(recipe, recipe.read_bytes())
    metrics = run_dir / "metrics.jsonl"
    if not metrics.is_file():
        return
    lines = metrics.read_text(encoding="utf-8", errors="replace").splitlines()
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = parse_json(line, f"{metrics}:{number}", CheckpointError)
        except CheckpointError:
            if number == len(lines):
                continue  # the torn last row of a killed run
            raise CheckpointError(f"{metrics}:{number}: damaged, not a JSON row; remove the line or resume into "
                                  "a new folder with run_dir", params=("run_dir",)) from None
        if not isinstance(row, dict) or not isinstance(row.get("step", 0), int) or isinstance(row.get("step"), bool):
            raise CheckpointError(f"{metrics}:{number}: damaged, expected a JSON object with an integer 'step', got "
                                  f"{line[:60]!r}; remove the line or resume into a new folder with run_dir",
                                  params=("run_dir",))


def has_validation_row(run_dir: Path, step: int) -> bool:
    """Whether metrics.jsonl holds the validation row of `step`."""
    path = run_dir / "metrics.jsonl"
    return path.is_file() and any(row.get("step") == step and "val_loss" in row for row in read_metrics(path))


def _previous_recipe(run_dir: Path, resumed_from: Path) -> Path | None:
    """The recipe that trained up to `resumed_from`: the run folder's, or for a branch into a new folder
    the source run's; None for a checkpoint outside a run folder."""
    for path in (run_dir / RECIPE_FILE, resumed_from.parent.parent / RECIPE_FILE):
        if path.is_file():
            return path
    return None


def recipe_changes(before: dict, after: dict, prefix: str = "") -> list[str]:
    """`key: old -> new` for every leaf that differs between two recipe dicts (nested sections)."""
    changes = []
    for key in sorted(set(before) | set(after)):
        old, new = before.get(key), after.get(key)
        if isinstance(old, dict) and isinstance(new, dict):
            changes += recipe_changes(old, new, f"{prefix}{key}.")
        elif old != new:
            changes.append(f"{prefix}{key}: {old!r} -> {new!r}")
    return changes


def append_start_block(run_dir: Path, lines: list[str], step: int) -> None:
    """Add what this start printed (corpora and how validation was chosen, tokenizer, tokens, epochs,
    model, device, threads, precision, warnings) to the run folder's start.log, under a header with the
    time and the step it starts from: the record stays with the run whatever log.progress or the terminal
    kept. Appended, never rewritten: a resume adds its own block below the first."""
    header = f"# {time.strftime('%Y-%m-%d %H:%M:%S')}: {'resumed at step ' + str(step) if step else 'started'}"
    with open(run_dir / START_LOG, "a", encoding="utf-8") as f:
        f.write("\n".join([header, *lines]) + "\n\n")
