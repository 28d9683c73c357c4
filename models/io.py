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
from ..errors import CheckpointError
from ..files import share_like_mkdir, write_problem
from .config import ModelConfig
from .hf_names import EXPORT_ARCHITECTURE

WEIGHTS = "model.safetensors"
CONFIG = "config.json"
_STEP = re.compile(r"^step-(\d+)$")  # excludes temp folders such as ".step-5" or "step-5.tmp"


def _is_complete(folder: Path) -> bool:
    return (folder / WEIGHTS).is_file() and (folder / CONFIG).is_file()


def load_weights_into(model: nn.Module, weights: Path, device: str | torch.device = "cpu",
                      what: str = "this model") -> None:
    """Fill `model` from a safetensors file, strictly; a mismatch is one CheckpointError line naming the
    first differing tensor and how many more differ (torch lists every one, one line each)."""
    try:
        load_safetensors_into(model, str(weights), strict=True, device=str(device))
    except (SafetensorError, RuntimeError, OSError) as err:
        lines = [line.strip() for line in str(err).splitlines() if line.strip()]
        problems = [line for line in lines if line.startswith(("size mismatch", "Missing key", "Unexpected key"))]
        detail = lines[0] if not problems else problems[0] + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else "")
        raise CheckpointError(f"{weights}: does not hold the weights of {what} ({detail})") from err


def save_model(model: nn.Module, folder: str | Path, extra: dict | None = None) -> Path:
    """Write model.safetensors and config.json into `folder` (created if needed); returns the folder."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    weights_tmp = folder / f".{WEIGHTS}.tmp"
    save_safetensors_from(model, str(weights_tmp))  # tied weights are stored once and re-tied on load
    share_like_mkdir(weights_tmp)  # safetensors writes 0600
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
    """The whole config.json of a checkpoint (folder, run folder, or the config.json file itself).

    Its model section is checked as a ModelConfig (types, values, unknown keys) here, so that every caller
    may index it: `eval` compares `max_seq_len` across checkpoints and would crash on a string. A bad value
    is a ConfigError naming the file and the key."""
    path = Path(path)
    file = path if path.is_file() and path.name == CONFIG else resolve_checkpoint(path) / CONFIG
    try:
        config = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CheckpointError(f"{file}: cannot read it as JSON ({err})") from err
    if not isinstance(config, dict) or not isinstance(config.get("model"), dict):
        raise CheckpointError(f"{file}: expected a JSON object with a 'model' section (the model config)")
    ModelConfig.from_dict(config["model"], source=file)
    return config


def load_model(path: str | Path, device: str | torch.device = "cpu") -> tuple[nn.Module, ModelConfig]:
    """Build the model described by config.json and fill it from model.safetensors; returns (model, cfg)
    with the model in eval mode on `device`."""
    from . import build_model  # late import: models/__init__ imports this module

    folder = resolve_checkpoint(path)
    cfg = ModelConfig.from_dict(read_config(folder)["model"])  # read_config names the file if it is invalid
    model = build_model(cfg).to(device)
    load_weights_into(model, folder / WEIGHTS, device, what=f"the {cfg.arch} model its config.json describes")
    return model.eval(), cfg


# What `--force` may replace, by the command that writes it (see `_existing_kind`): each command replaces
# only its own earlier output, never a training checkpoint, a user's HuggingFace model or other files.
TFKIT_MODEL = "a tfkit model folder (what convert-mqa-to-gqa and import-hf write)"
TFKIT_EXPORT = "a HuggingFace folder written by tfkit export-hf"
EXPORT_FILES = {CONFIG, WEIGHTS, "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"}


def check_new_folder(out: Path, sources: Iterable[Path], force: bool, replaces: tuple[str, ...]) -> None:
    """Before any work, every reason `--out` could fail or destroy something, as one line:
    - it may never be, contain or lie inside an input checkpoint (even --force would then destroy the
      model being read);
    - nor lie in a training run's `checkpoints/`, where `eval RUN` would take it for the run's own latest;
    - a regular file in its path, or a folder there that cannot be written, fails now, not after the work;
    - an existing non-empty `out` needs --force, and even --force replaces only the earlier output of the
      calling command (`replaces`: TFKIT_MODEL and/or TFKIT_EXPORT), never a file or a folder of other things."""
    target = out.resolve()
    for source in (Path(s).resolve() for s in sources):
        inside = source.is_dir() and source in target.parents and (source / WEIGHTS).is_file()
        if target == source or target in source.parents or inside:
            raise CheckpointError(f"--out {out}: is or contains the input {source}, or lies inside it; "
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
    from ..trainer.checkpoint import RECIPE_FILE  # late import: trainer.checkpoint imports this module

    holder = target.parent
    if holder.name != "checkpoints" or not holder.is_dir():
        return None
    steps = any(_STEP.match(child.name) and child.is_dir() for child in holder.iterdir())
    return holder.parent if steps or (holder.parent / RECIPE_FILE).is_file() else None


def _existing_kind(folder: Path) -> str:
    """What an existing non-empty `--out` is, in the words of the error that refuses to replace it;
    TFKIT_MODEL / TFKIT_EXPORT for the outputs of tfkit's own commands."""
    from ..trainer.checkpoint import TRAINER_STATE  # late import: trainer.checkpoint imports this module

    if not folder.is_dir():
        return "not a model folder (it is a file)"
    if not (folder / CONFIG).is_file():
        return f"not a model folder (no {CONFIG})"
    if (folder / TRAINER_STATE).is_file():
        return f"a training checkpoint (it has {TRAINER_STATE})"
    try:
        config = json.loads((folder / CONFIG).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
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
            and config.get("architectures") in [[name] for name in EXPORT_ARCHITECTURE.values()])


def publish_folder(tmp: Path, out: Path) -> None:
    """Move a finished temporary folder into place; an existing `out` is set aside first and removed only
    once the new folder stands, so `out` is always either the old folder or a complete new one."""
    share_like_mkdir(tmp)
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
