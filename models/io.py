"""Checkpoint folders: `model.safetensors` + `config.json`, and finding the latest one in a run folder.

Weights are only ever read with safetensors, which cannot execute code (unlike pickle). `config.json` is
`{"tfkit_version", "model": ModelConfig.to_dict(), **extra}`; the trainer adds its own keys (recipe,
step) through `extra`. Each file is written under a temporary name and renamed, config.json last, so a
folder holding both files is complete.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from collections.abc import Iterable
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_model as load_safetensors_into
from safetensors.torch import save_model as save_safetensors_from
from torch import nn

from .. import __version__
from ..errors import CheckpointError, ConfigError
from .config import ModelConfig

WEIGHTS = "model.safetensors"
CONFIG = "config.json"
_STEP = re.compile(r"^step-(\d+)$")  # excludes temp folders such as ".step-5" or "step-5.tmp"


def _is_complete(folder: Path) -> bool:
    return (folder / WEIGHTS).is_file() and (folder / CONFIG).is_file()


def save_model(model: nn.Module, folder: str | Path, extra: dict | None = None) -> Path:
    """Write model.safetensors and config.json into `folder` (created if needed); returns the folder."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    weights_tmp = folder / f".{WEIGHTS}.tmp"
    save_safetensors_from(model, str(weights_tmp))  # tied weights are stored once and re-tied on load
    os.replace(weights_tmp, folder / WEIGHTS)
    config = {"tfkit_version": __version__, "model": model.config.to_dict(), **(extra or {})}
    config_tmp = folder / f".{CONFIG}.tmp"
    config_tmp.write_text(json.dumps(config, indent=2) + "\n")
    os.replace(config_tmp, folder / CONFIG)
    return folder


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint folder is itself; a run folder (or its `checkpoints/`) gives the complete
    `checkpoints/step-<N>/` with the highest N. Anything else is a CheckpointError naming the path."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path}: no such checkpoint or run folder")
    if path.is_file() and path.name in (WEIGHTS, CONFIG):
        path = path.parent
    if _is_complete(path):
        return path
    steps = []
    for parent in (path / "checkpoints", path):
        if parent.is_dir():
            for child in parent.iterdir():
                match = _STEP.match(child.name)
                if match and child.is_dir() and _is_complete(child):
                    steps.append((int(match.group(1)), child))
    if steps:
        return max(steps)[1]
    if (path / CONFIG).is_file() or (path / WEIGHTS).is_file():
        missing = WEIGHTS if (path / CONFIG).is_file() else CONFIG
        raise CheckpointError(f"{path}: incomplete checkpoint, {missing} is missing")
    raise CheckpointError(
        f"{path}: not a checkpoint folder (expected {WEIGHTS} and {CONFIG}) "
        "nor a run folder with a complete checkpoints/step-<N>/"
    )


def read_config(path: str | Path) -> dict:
    """The whole config.json of a checkpoint (folder, run folder, or the config.json file itself)."""
    path = Path(path)
    file = path if path.is_file() and path.name == CONFIG else resolve_checkpoint(path) / CONFIG
    try:
        config = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CheckpointError(f"{file}: cannot read it as JSON ({err})") from err
    if not isinstance(config, dict) or not isinstance(config.get("model"), dict):
        raise CheckpointError(f"{file}: expected a JSON object with a 'model' section (the model config)")
    return config


def load_model(path: str | Path, device: str | torch.device = "cpu") -> tuple[nn.Module, ModelConfig]:
    """Build the model described by config.json and fill it from model.safetensors; returns (model, cfg)
    with the model in eval mode on `device`."""
    from . import build_model  # late import: models/__init__ imports this module

    folder = resolve_checkpoint(path)
    try:
        cfg = ModelConfig.from_dict(read_config(folder)["model"])
    except ConfigError as err:
        raise CheckpointError(f"{folder / CONFIG}: invalid model config ({err})") from err
    model = build_model(cfg).to(device)
    weights = folder / WEIGHTS
    try:
        load_safetensors_into(model, str(weights), strict=True, device=str(device))
    except (SafetensorError, RuntimeError, OSError) as err:
        raise CheckpointError(
            f"{weights}: not a valid safetensors file with the weights of this {cfg.arch} config ({err})"
        ) from err
    return model.eval(), cfg


def check_new_folder(out: Path, sources: Iterable[Path], force: bool) -> None:
    """Before any work: `out` may never be, contain or lie inside an input checkpoint (even --force would
    then destroy the model being read), and an existing non-empty `out` needs `force`."""
    target = out.resolve()
    for source in (Path(s).resolve() for s in sources):
        inside = source.is_dir() and source in target.parents and (source / WEIGHTS).is_file()
        if target == source or target in source.parents or inside:
            raise CheckpointError(f"--out {out}: is or contains the input {source}, or lies inside it; "
                                  "the input is never modified, choose another folder")
    if target.exists() and (not target.is_dir() or any(target.iterdir())) and not force:
        raise CheckpointError(f"--out {out}: already exists; use --force to replace it")


def publish_folder(tmp: Path, out: Path) -> None:
    """Move a finished temporary folder into place; an existing `out` is set aside first and removed only
    once the new folder stands, so `out` is always either the old folder or a complete new one."""
    if not out.exists():
        tmp.rename(out)
        return
    trash = out.with_name(f".{out.name}.old-{time.time_ns()}")
    out.rename(trash)
    tmp.rename(out)
    if trash.is_dir():
        shutil.rmtree(trash)
    else:
        trash.unlink()
