"""Training checkpoints: atomic, self-contained, pruned, and exact to resume from.

`checkpoints/step-<N>/` holds what `tfkit.models.io.load_model` reads (`model.safetensors`,
`config.json`), the tokenizer files (so the folder alone can generate, evaluate or be exported), and
`trainer_state.pt`: optimizer and grad-scaler state, the step, the number of batches consumed and the RNG
states. Batches are pure functions of (seed, batch index), so "batches consumed" *is* the data-loader
position, and restoring the RNGs makes dropout replay identically: a resumed run is bit-identical to an
uninterrupted one on CPU.

Atomicity: everything is written into `.step-<N>.tmp/`, fsynced, then renamed to `step-<N>/` (a rename
is atomic on POSIX). A crash mid-write leaves only a temp folder, which `resolve_checkpoint` and
`latest_checkpoint` never match and the next save removes; the previous checkpoint stays valid.

`trainer_state.pt` holds only tensors, numbers, strings and containers, so it loads with
`torch.load(weights_only=True)` (no arbitrary unpickling). The optimizer state is keyed by parameter
*name* rather than position, the layout FSDP's state-dict helpers use too.
"""

from __future__ import annotations

import dataclasses
import os
import random
import re
import shutil
import time
from pathlib import Path
from typing import Any

import torch
import yaml
from torch import nn

from ..errors import CheckpointError, ConfigError
from ..files import share_like_mkdir
from ..models.config import ModelConfig
from ..models.io import CONFIG, WEIGHTS, load_weights_into, read_config, save_model

TRAINER_STATE = "trainer_state.pt"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
_STEP = re.compile(r"^step-(\d+)$")


def rng_state() -> dict[str, Any]:
    """Every RNG the training step can draw from (dropout on CPU or GPU, python `random`).

    On CUDA only this process's own GPU (the current device): every rank seeds it alike and draws from it
    alike, so rank 0's state is every rank's, and it restores onto any GPU count. (`get_rng_state_all`
    would also hold rank 0's never-used generators of the other GPUs, and give them to those ranks.)"""
    state = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def optimizer_state_by_name(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """`optimizer.state_dict()` with parameter positions replaced by parameter names."""
    names = _param_names(model)
    ordered = [names[id(p)] for group in optimizer.param_groups for p in group["params"]]
    sd = optimizer.state_dict()
    return {
        "state": {ordered[i]: s for i, s in sd["state"].items()},
        "param_groups": [{**g, "params": [ordered[i] for i in g["params"]]} for g in sd["param_groups"]],
    }


def load_optimizer_state_by_name(model: nn.Module, optimizer: torch.optim.Optimizer, sd: dict) -> None:
    """Inverse of `optimizer_state_by_name`; a parameter-name mismatch is a CheckpointError."""
    names = _param_names(model)
    index = {names[id(p)]: i for i, p in enumerate(p for g in optimizer.param_groups for p in g["params"])}
    missing = sorted(set(index) - {n for g in sd["param_groups"] for n in g["params"]})
    if missing or len(sd["param_groups"]) != len(optimizer.param_groups):
        raise CheckpointError(f"optimizer state does not match this model (parameters missing: {missing[:5]})")
    optimizer.load_state_dict({
        "state": {index[n]: s for n, s in sd["state"].items()},
        "param_groups": [{**g, "params": [index[n] for n in g["params"]]} for g in sd["param_groups"]],
    })


def _param_names(model: nn.Module) -> dict[int, str]:
    return {id(p): name for name, p in model.named_parameters()}  # a tied tensor keeps its first name


def save_checkpoint(run_dir: Path, step: int, model: nn.Module, trainer_state: dict, tokenizer_dir: Path,
                    extra: dict, keep_last: int) -> Path:
    """Write `run_dir/checkpoints/step-<step>/` atomically, then keep only the newest `keep_last`."""
    root = run_dir / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final, tmp = root / f"step-{step}", root / f".step-{step}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        save_model(model, tmp, extra={**extra, "step": step})
        for name in TOKENIZER_FILES:
            if (tokenizer_dir / name).is_file():
                shutil.copy2(tokenizer_dir / name, tmp / name)
        torch.save(trainer_state, tmp / TRAINER_STATE)
        share_like_mkdir(tmp)
        _fsync_tree(tmp)
        if final.exists():  # saving the same step again (e.g. interrupted right after a save)
            old = root / f".step-{step}.old"
            shutil.rmtree(old, ignore_errors=True)
            final.rename(old)
            tmp.rename(final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(final)
        _fsync_dir(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    prune(root, keep_last)
    return final


def list_checkpoints(run_dir: Path) -> list[tuple[int, Path]]:
    """(step, folder) of every complete training checkpoint of a run folder, oldest first."""
    root = run_dir / "checkpoints"
    found = []
    if root.is_dir():
        for child in root.iterdir():
            match = _STEP.match(child.name)
            if match and all((child / f).is_file() for f in (WEIGHTS, CONFIG, TRAINER_STATE)):
                found.append((int(match.group(1)), child))
    return sorted(found)


def latest_checkpoint(run_dir: Path) -> Path | None:
    found = list_checkpoints(run_dir)
    return found[-1][1] if found else None


def prune(root: Path, keep_last: int) -> None:
    """Delete all but the newest `keep_last` checkpoints, and stale temp folders of killed saves."""
    for step, folder in list_checkpoints(root.parent)[:-keep_last]:
        shutil.rmtree(folder, ignore_errors=True)
    for child in root.iterdir():
        if child.name.startswith(".step-") and child.is_dir():
            shutil.rmtree(child, ignore_errors=True)


def resolve_resume(path: str | Path) -> Path:
    """A checkpoint folder, or a run folder's latest checkpoint, that holds a trainer state."""
    path = Path(path).expanduser()
    if not path.exists():
        raise CheckpointError(f"--resume {path}: no such file or folder (give a run folder, one of its "
                              "checkpoints/step-<N>/, or auto)")
    if (path / TRAINER_STATE).is_file():
        return path
    latest = latest_checkpoint(path) if path.is_dir() else None
    if latest is None:
        raise CheckpointError(f"--resume {path}: not a training checkpoint (no {TRAINER_STATE}) "
                              "nor a run folder with checkpoints/step-<N>/")
    return latest


def load_trainer_state(folder: Path) -> dict:
    try:
        return torch.load(folder / TRAINER_STATE, weights_only=True, map_location="cpu")
    except Exception as err:  # noqa: BLE001 - torch raises many types for a corrupt file
        raise CheckpointError(f"{folder / TRAINER_STATE}: cannot load the trainer state ({err})") from err


def load_weights(model: nn.Module, folder: Path) -> None:
    """Fill `model` (already built with the checkpoint's config) from its model.safetensors."""
    load_weights_into(model, folder / WEIGHTS)


def _fsync_tree(folder: Path) -> None:
    for path in folder.iterdir():
        if path.is_file():
            with path.open("rb") as f:
                os.fsync(f.fileno())
    _fsync_dir(folder)


def _fsync_dir(folder: Path) -> None:
    """Make a rename or new file durable: fsync the directory entry itself (a no-op where unsupported)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# --- where a run starts from: run folder, resume checkpoint, model config --------------------------------

MAY_DIFFER = ("dropout", "attn_dropout", "attention")  # regularisation / kernel choice, not the weights' shape


def choose_run_dir(recipe, run_dir: str | Path | None, resume: str | None) -> Path:
    """`--run-dir`, else `log.run_dir`, else the run folder of `--resume PATH`, else (with `--resume auto`)
    the newest `runs/<recipe>-*` holding a checkpoint, else a new `runs/<recipe>-<YYYYmmdd-HHMMSS>`."""
    if run_dir:
        return Path(run_dir).expanduser()
    if recipe.log.run_dir:
        return Path(recipe.log.run_dir).expanduser()
    if resume and resume != "auto":
        folder = resolve_resume(resume)
        return folder.parent.parent  # <run>/checkpoints/step-N
    if resume == "auto":
        previous = [p for p in sorted(Path("runs").glob(f"{recipe.name}-*")) if latest_checkpoint(p)]
        if previous:
            return previous[-1]
    stamp = time.strftime("%Y%m%d-%H%M%S")
    candidate, n = Path("runs") / f"{recipe.name}-{stamp}", 1
    while candidate.exists():  # two runs started in the same second
        candidate, n = Path("runs") / f"{recipe.name}-{stamp}-{n}", n + 1
    return candidate


RECIPE_FILE = "recipe.yaml"
RECIPE_HEADER = "# The resolved recipe of this run, written by tfkit pretrain (rewritten when the run resumes).\n"
RUN_ENTRIES = {RECIPE_FILE, "tokenizer", "data", "checkpoints", "metrics.jsonl", "loss.png", "tensorboard"}


def check_run_dir(run_dir: Path, fresh: bool) -> None:
    """Refuse a run folder whose files tfkit would overwrite without having written them, before anything
    is written: a hand-made recipe.yaml (e.g. the folder of the recipe being run, passed as --run-dir),
    or, for a fresh start (which replaces metrics.jsonl, tokenizer/, ...), any folder holding files
    that a run does not make. A run that crashed before its first checkpoint can be started again."""
    if run_dir.exists() and not run_dir.is_dir():
        raise CheckpointError(f"run folder {run_dir}: exists and is not a folder; choose another --run-dir")
    if not run_dir.is_dir():
        return
    recipe = run_dir / RECIPE_FILE
    if recipe.is_file() and not recipe.read_text(encoding="utf-8", errors="replace").startswith(RECIPE_HEADER):
        raise CheckpointError(f"run folder {run_dir}: its {RECIPE_FILE} was not written by tfkit pretrain and "
                              "would be overwritten; choose another --run-dir")
    foreign = sorted(p.name for p in run_dir.iterdir()
                     if p.name not in RUN_ENTRIES and not p.name.startswith("recipe-before-step-"))
    if fresh and foreign:
        raise CheckpointError(f"run folder {run_dir}: holds files a tfkit run does not make ({', '.join(foreign[:3])}"
                              f"{', ...' if len(foreign) > 3 else ''}); choose another --run-dir")


def write_recipe(run_dir: Path, recipe, resumed_from: Path | None) -> tuple[int | None, list[str]]:
    """Save the resolved recipe as run_dir/recipe.yaml; return the step resumed from and what changed.

    A resumed run may legitimately change keys (more steps, a lower learning rate), but then recipe.yaml
    no longer describes how the earlier checkpoints were trained: the recipe they were trained with (the
    run folder's, or for a branch into a new folder the source run's) is kept as
    recipe-before-step-<N>.yaml and the caller reports the changes. If that file exists already, an
    earlier resume from the same step N changed the recipe too; nothing it trained survives (resuming
    from N again means no later checkpoint exists), so the first file, the recipe that trained up to N,
    is the one to keep."""
    path = run_dir / RECIPE_FILE
    step, changes = None, []
    if resumed_from is not None:
        step = int(read_config(resumed_from).get("step", 0))
        previous = _previous_recipe(run_dir, resumed_from)
        if previous is not None:
            earlier = yaml.safe_load(previous.read_text(encoding="utf-8")) or {}
            if isinstance(earlier.get("tokenizer"), dict):  # the run keeps its tokenizer (check_tokenizer_kept)
                recipe = dataclasses.replace(recipe, tokenizer=type(recipe.tokenizer)(**earlier["tokenizer"]))
            changes = recipe_changes(earlier, recipe.to_dict())
            before = run_dir / f"recipe-before-step-{step}.yaml"
            if changes and not before.exists():
                shutil.copyfile(previous, before)
    tmp = run_dir / f".{RECIPE_FILE}.tmp"
    tmp.write_text(RECIPE_HEADER + recipe.to_yaml(), encoding="utf-8")
    os.replace(tmp, path)
    return step, changes


def _previous_recipe(run_dir: Path, resumed_from: Path) -> Path | None:
    """The recipe that trained up to `resumed_from`: the run folder's, or for a branch into a new folder
    the source run's; None for a checkpoint outside a run folder."""
    for path in (run_dir / RECIPE_FILE, resumed_from.parent.parent / RECIPE_FILE):
        if path.is_file():
            return path
    return None


def check_tokenizer_kept(recipe, resumed_from: Path) -> None:
    """A resumed run keeps its checkpoint's tokenizer: the weights were trained on its token ids. The
    tokenizer section is moot then (recipe.yaml keeps the one that trained the run, see `write_recipe`),
    but a `tokenizer.path` naming a different tokenizer would be silently ignored: that is an error."""
    from ..tokenization.train import load_tokenizer

    path = recipe.tokenizer.path
    if not path or not (resumed_from / "tokenizer.json").is_file():
        return
    if load_tokenizer(path).fingerprint() != load_tokenizer(resumed_from).fingerprint():
        raise ConfigError(f"tokenizer.path {path}: differs from the tokenizer of {resumed_from}, which a resumed "
                          "run keeps (its weights were trained on those token ids); leave tokenizer.path out, "
                          "or start a new run")


def find_resume(run_dir: Path, resume: str | None) -> Path | None:
    """The checkpoint to resume from, None for a fresh start.

    Refused, because checkpoints would be overwritten or mixed (pruning keeps the newest steps): a fresh
    start into a folder that holds checkpoints; resuming into a folder that holds checkpoints of another
    run, or later checkpoints of this one (resuming step-10 of a run that reached step-20 would replace
    step-20). Branching from an older step goes to a new --run-dir."""
    if resume == "auto":
        return latest_checkpoint(run_dir)
    if not resume:
        if latest_checkpoint(run_dir):
            raise CheckpointError(f"run folder {run_dir} already holds checkpoints; pass --resume auto to continue "
                                  "it, or choose another --run-dir")
        return None
    source = resolve_resume(resume)
    same_run = source.parent.parent.resolve() == run_dir.resolve()
    named = _STEP.match(source.name)
    source_step = int(named.group(1)) if named else -1
    clash = [path.name for step, path in list_checkpoints(run_dir) if not same_run or step > source_step]
    if clash:
        whose = "later checkpoints" if same_run else "checkpoints of another run"
        raise CheckpointError(f"--resume {resume}: run folder {run_dir} holds {whose} ({', '.join(clash)}) that "
                              "this run would overwrite or mix with; resume into a new folder with --run-dir")
    return source


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


def model_config(recipe, tokenizer, source: Path | None) -> ModelConfig:
    """The model config of this run: the recipe's (vocabulary from the tokenizer) for a fresh start, the
    checkpoint's when resuming or initialising from one. A recipe key that contradicts the checkpoint is an
    error naming every such key; only MAY_DIFFER keys (dropout, attention kernel) follow the recipe."""
    if source is None:
        cfg = recipe.model.config(tokenizer.vocab_size)
        if cfg.pad_token_id is None and tokenizer.pad_id is not None:
            cfg = dataclasses.replace(cfg, pad_token_id=tokenizer.pad_id)
        return cfg.validate()
    saved = ModelConfig.from_dict(read_config(source)["model"])  # read_config names the file of a bad value
    wanted = recipe.model.config(saved.vocab_size)
    skip = set(MAY_DIFFER) | {"pad_token_id"}
    conflicts = [f"model.{f.name} is {getattr(wanted, f.name)!r} but the checkpoint has {getattr(saved, f.name)!r}"
                 for f in dataclasses.fields(ModelConfig)
                 if f.name not in skip and getattr(wanted, f.name) != getattr(saved, f.name)]
    if conflicts:
        raise ConfigError(f"{source}: the recipe's model does not match the checkpoint's: " + "; ".join(conflicts)
                          + " (set these keys to the checkpoint's values)")
    return dataclasses.replace(saved, **{k: getattr(wanted, k) for k in MAY_DIFFER}).validate()


# --- distributed-aware state: FSDP2 shards parameters and optimizer state, DDP/single do not -------------

def optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer, mode: str, distributed: bool) -> dict:
    """The full optimizer state keyed by parameter name (a collective under FSDP: call on every rank)."""
    if distributed and mode == "fsdp":
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        return get_optimizer_state_dict(model, optimizer,
                                        options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return optimizer_state_by_name(model, optimizer)


def load_optimizer(model: nn.Module, optimizer: torch.optim.Optimizer, sd: dict, mode: str, distributed: bool) -> None:
    if distributed and mode == "fsdp":
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        set_optimizer_state_dict(model, optimizer, sd, options=StateDictOptions(full_state_dict=True))
        return
    load_optimizer_state_by_name(model, optimizer, sd)


def full_weights_model(model: nn.Module, cfg: ModelConfig, mode: str, distributed: bool, is_main: bool):
    """A module holding the full weights to save: the model itself, or under FSDP a CPU copy assembled from
    the shards on rank 0 (None on other ranks; a collective, so every rank calls it)."""
    if not (distributed and mode == "fsdp"):
        return model
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    from ..models import build_model

    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if not is_main:
        return None
    copy = build_model(cfg)
    copy.load_state_dict(full)
    return copy
