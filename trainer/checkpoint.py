"""Training checkpoints: atomic, self-contained, pruned, and exact to resume from.

`checkpoints/step-<N>/` holds what `tfkit.models.io.load_model` reads (`model.safetensors`,
`config.json`), the tokenizer files (so the folder alone can generate, evaluate or be exported), and
`trainer_state.pt`: optimizer and grad-scaler state, the step, the number of batches consumed and the RNG
states. Batches are pure functions of (seed, batch index), so "batches consumed" *is* the data-loader
position, and restoring the RNGs makes dropout replay identically: a resumed run is bit-identical to an
uninterrupted one on CPU.

Atomicity: the folder is filled as a temporary sibling `.step-<N>.tmp-XXXX/`, flushed to the disk and
renamed to `step-<N>/` whole (`files.staged_folder`). A crash mid-write leaves only a temp folder, which
`resolve_checkpoint` and `latest_checkpoint` never match and the next save removes; the previous
checkpoint stays valid.

`trainer_state.pt` holds only tensors, numbers, strings and containers, so it loads with
`torch.load(weights_only=True)` (no arbitrary unpickling). The optimizer state is keyed by parameter
*name* rather than position, the layout FSDP's state-dict helpers use too (see `parallel.Parallel`).

Where a run's folder and starting point come from (recipe.yaml, `--resume`, the model config of a
source checkpoint) is `run_folder`'s concern.
"""

from __future__ import annotations

import hashlib
import math
import random
import shutil
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import CheckpointError
from ..files import set_aside, staged_folder
from ..jsonfile import read_json
from ..layout import BEST, CHECKPOINTS, CONFIG, STEP_FOLDER, TOKENIZER_FILES, TRAINER_STATE, WEIGHTS
from ..models import build_model
from ..models.config import ModelConfig
from ..models.io import load_plain_pickle, load_weights_into, pickle_refusal, read_config, save_model
from ..models.resize import grow_vocab


class NonFiniteWeights(CheckpointError):
    """A checkpoint was asked of weights that hold NaN or inf: it is never written."""


def rng_state() -> dict[str, Any]:
    """Every RNG the training step can draw from (dropout on CPU or GPU, python `random`), of this process.

    On CUDA only this process's own GPU (the current device): `get_rng_state_all` would also hold the
    never-used generators of the other GPUs. The checkpoint holds rank 0's state; ranks > 0 derive
    theirs from it (`seed_rank`), so a checkpoint restores onto any number of processes."""
    state = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def seed_rank(seed: int, rank: int, step: int) -> None:
    """Give each rank its own dropout masks, once every rank has built the same weights from `seed`.

    Rank 0 keeps the stream it is on (after the model's initialisation on a fresh start, the checkpoint's
    RNG state on resume), so one process trains and resumes exactly as if ranks did not exist. Rank r > 0
    reseeds torch (CPU and every GPU) from (seed, r, step), the step its stream starts at: masks independent
    of rank 0's (without this every rank would drop the same units of its slice of the batch), and after a
    resume no replay of the masks it drew from step 0. The checkpoint holds rank 0's RNG state only, so a
    resumed rank r > 0 draws fresh masks, not the ones an uninterrupted run would have drawn."""
    if rank == 0:
        return
    digest = hashlib.sha256(f"tfkit dropout: seed {seed}, rank {rank}, step {step}".encode()).digest()
    torch.manual_seed(int.from_bytes(digest[:8], "little") >> 1)  # a 63-bit seed, a pure function of the three


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
    """Inverse of `optimizer_state_by_name`; a parameter-name mismatch is a CheckpointError. A saved
    parameter this optimizer does not hold is dropped if it never had a state (a parameter the checkpoint's
    run held but never stepped, as a classifier body's pretraining head before the trainer froze it)."""
    names = _param_names(model)
    index = {names[id(p)]: i for i, p in enumerate(p for g in optimizer.param_groups for p in g["params"])}
    missing = sorted(set(index) - {n for g in sd["param_groups"] for n in g["params"]})
    stepped = sorted(set(sd["state"]) - set(index))
    if missing or stepped or len(sd["param_groups"]) != len(optimizer.param_groups):
        raise CheckpointError(f"optimizer state does not match this model (parameters missing: {missing[:5]}, "
                              f"not trained here: {stepped[:5]})")
    optimizer.load_state_dict({
        "state": {index[n]: s for n, s in sd["state"].items()},
        "param_groups": [{**g, "params": [index[n] for n in g["params"] if n in index]} for g in sd["param_groups"]],
    })


def _param_names(model: nn.Module) -> dict[int, str]:
    return {id(p): name for name, p in model.named_parameters()}  # a tied tensor keeps its first name


def save_checkpoint(run_dir: Path, step: int, model: nn.Module, trainer_state: dict, tokenizer_dir: Path,
                    extra: dict, keep_last: int) -> Path:
    """Write `run_dir/checkpoints/step-<step>/` atomically, then keep only the newest `keep_last`.

    Saving a step that exists already (e.g. interrupted right after a save) replaces it."""
    root = run_dir / CHECKPOINTS
    final = root / f"step-{step}"
    if not weights_finite(model):
        raise NonFiniteWeights(f"step {step}: the weights are not finite (NaN or inf); no checkpoint was written")
    with staged_folder(final, durable=True) as tmp:
        save_model(model, tmp, extra={**extra, "step": step})
        for name in TOKENIZER_FILES:
            if (tokenizer_dir / name).is_file():
                shutil.copy2(tokenizer_dir / name, tmp / name)
        torch.save(trainer_state, tmp / TRAINER_STATE)
    prune(root, keep_last)
    return final


def save_best(run_dir: Path, step: int, model: nn.Module, tokenizer_dir: Path, extra: dict, val_loss: float) -> Path:
    """Write `run_dir/best/` (train.keep_best): the weights, config.json with their step and validation loss,
    and the tokenizer, replacing the previous best whole. No trainer state: a run resumes from its latest
    checkpoint, never from an earlier best."""
    final = run_dir / BEST
    if not weights_finite(model):
        raise NonFiniteWeights(f"step {step}: the weights are not finite (NaN or inf); the best checkpoint was kept")
    with staged_folder(final, durable=True) as tmp:
        save_model(model, tmp, extra={**extra, "step": step, "val_loss": val_loss})
        for name in TOKENIZER_FILES:
            if (tokenizer_dir / name).is_file():
                shutil.copy2(tokenizer_dir / name, tmp / name)
    return final


def best_loss(run_dir: Path) -> float:
    """The validation loss of the run folder's best/ (inf when there is none yet)."""
    try:
        loss = read_json(run_dir / BEST / CONFIG, CheckpointError).get("val_loss")
    except CheckpointError:
        return math.inf
    return float(loss) if isinstance(loss, (int, float)) and not isinstance(loss, bool) else math.inf


def list_checkpoints(run_dir: Path) -> list[tuple[int, Path]]:
    """(step, folder) of every complete training checkpoint of a run folder, oldest first."""
    root = run_dir / CHECKPOINTS
    found = []
    if root.is_dir():
        for child in root.iterdir():
            match = STEP_FOLDER.match(child.name)
            if match and all((child / f).is_file() for f in (WEIGHTS, CONFIG, TRAINER_STATE)):
                found.append((int(match.group(1)), child))
    return sorted(found)


def latest_checkpoint(run_dir: Path) -> Path | None:
    found = list_checkpoints(run_dir)
    return found[-1][1] if found else None


def prune(root: Path, keep_last: int) -> None:
    """Delete all but the newest `keep_last` checkpoints, and what killed saves left behind: the temp
    folders `.step-<N>.tmp-XXXX` (and older tfkit's `.step-<N>.tmp`) and set-aside `.step-<N>.old-...`."""
    for step, folder in list_checkpoints(root.parent)[:-keep_last]:
        shutil.rmtree(folder, ignore_errors=True)
    for child in root.iterdir():
        if child.name.startswith(".step-") and child.is_dir():
            shutil.rmtree(child, ignore_errors=True)


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


def load_trainer_state(folder: Path) -> dict:
    """The trainer state of a checkpoint, read without executing code and checked for the structure
    `Trainer.save` writes; a damaged, foreign or hostile file is one CheckpointError line."""
    file = folder / TRAINER_STATE
    try:
        state = load_plain_pickle(file)
    except Exception as err:  # noqa: BLE001 - torch raises many types for a corrupt file
        raise CheckpointError(f"{file}: {pickle_refusal(err, 'trainer state')}") from None
    problem = _state_problem(state)
    if problem:
        raise CheckpointError(f"{file}: not a tfkit trainer state ({problem}); the checkpoint is damaged or "
                              "not one of tfkit's")
    return state


def _state_problem(state: object) -> str | None:
    """What is wrong with a loaded trainer state's structure (`Trainer.save`'s payload), None if nothing."""
    if not isinstance(state, dict):
        return f"expected a dict, got {type(state).__name__}"
    missing = [key for key in ("state", "rng", "scaler", "optimizer") if key not in state]
    if missing:
        return f"missing {', '.join(missing)}"
    if not isinstance(state["state"], dict) or not all(
            isinstance(v, float if k == "seconds" else int) and not isinstance(v, bool)
            for k, v in state["state"].items()):
        return "'state' must map counters to integers (and seconds to a number)"
    rng = state["rng"]
    if not isinstance(rng, dict) or not isinstance(rng.get("torch"), torch.Tensor) or "python" not in rng:
        return "'rng' must hold the python and torch generator states"
    optimizer = state["optimizer"]
    if (not isinstance(optimizer, dict) or not isinstance(optimizer.get("state"), dict)
            or not isinstance(optimizer.get("param_groups"), list)
            or not all(isinstance(g, dict) and isinstance(g.get("params"), list) for g in optimizer["param_groups"])):
        return "'optimizer' must hold 'state' and 'param_groups'"
    if not isinstance(state["scaler"], dict):
        return "'scaler' must be a dict"
    return None


def checkpoint_step(folder: Path, config: dict) -> int:
    """The step a checkpoint's config.json records, as an integer; anything else is a CheckpointError."""
    step = config.get("step", 0)
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise CheckpointError(f"{folder / CONFIG}: 'step' is {step!r}, expected a non-negative integer (the "
                              "checkpoint is damaged)")
    return step


def weights_finite(model: nn.Module) -> bool:
    """Whether every parameter and buffer of `model` is finite (one read of the device for all of them)."""
    flags = [torch.isfinite(t).all() for t in (*model.parameters(), *model.buffers()) if t.is_floating_point()]
    return bool(torch.stack(flags).all()) if flags else True


DIVERGED_PREFIX = "diverged-"  # checkpoints/diverged-step-<N>/: weights a divergence started from, set aside


def set_aside_diverged(run_dir: Path, step: int) -> Path | None:
    """After a divergence that began at `step` (the updates from the weights of step `step` on were all
    non-finite), rename the checkpoints of steps >= `step` to `diverged-step-<N>`: their weights are the
    ones that diverged (a loss of 1e12, or NaN from the next update), so neither the report nor
    `--resume auto` may take them for good ones; they stay for inspection. Returns the newest checkpoint
    left, the last good one, or None."""
    for found_step, folder in list_checkpoints(run_dir):
        if found_step >= step:
            set_aside(folder, DIVERGED_PREFIX + folder.name)
    return latest_checkpoint(run_dir)


def load_source_weights(model: nn.Module, folder: Path) -> None:
    """Fill `model` from the checkpoint a run starts from; a model whose vocabulary grew past the checkpoint's
    (chat tokens, `data.format: chat`) gets the checkpoint's rows and new rows as models/resize.py makes them."""
    saved = ModelConfig.from_dict(read_config(folder)["model"])
    if saved.vocab_size == model.config.vocab_size:
        load_weights(model, folder)
        return
    old = build_model(saved)
    load_weights(old, folder)
    model.load_state_dict(grow_vocab(old.state_dict(), model.config.vocab_size))


def load_weights(model: nn.Module, folder: Path) -> None:
    """Fill `model` (already built with the checkpoint's config) from its model.safetensors."""
    load_weights_into(model, folder / WEIGHTS)
