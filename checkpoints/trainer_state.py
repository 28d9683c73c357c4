"""The trainer-state half of a training checkpoint: `trainer_state.pt`, what an exact resume needs beside the
weights: the counters of the run, the optimizer's state keyed by parameter name, the grad scaler's, and the RNG
states dropout draws from.

Batches are pure functions of (seed, batch index), so "batches consumed" *is* the data loader's position, and
restoring the RNGs makes dropout replay identically: a resumed run is bit-identical to an uninterrupted one on
CPU. The file holds only tensors, numbers, strings and containers, so it loads with
`torch.load(weights_only=True)` (no arbitrary unpickling). The optimizer state is keyed by parameter *name*
rather than position, the layout FSDP's state-dict helpers use too (trainer/parallel.py).
"""

from __future__ import annotations

import hashlib
import random
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import CheckpointError
from ..layout import TRAINER_STATE
from .plain_pickle import load_plain_pickle, pickle_refusal


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
            isinstance(v, (int, float)) and not isinstance(v, bool)
            for k, v in state["state"].items()):
        return "'state' must map its counters to numbers"
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

