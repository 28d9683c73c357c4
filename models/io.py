"""Checkpoint folders: `model.safetensors` + `config.json`, and finding the latest one in a run folder.

Weights are only ever read with safetensors, which cannot execute code (unlike pickle). `config.json` is
`{"tfkit_version", "model": ModelConfig.to_dict(), **extra}`; the trainer adds its own keys (recipe,
step) through `extra`. Each file is written under a temporary name and renamed, config.json last, so a
folder holding both files is complete.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from safetensors.torch import load_model as load_safetensors_into
from safetensors.torch import save_model as save_safetensors_from
from torch import nn

from .. import __version__
from ..errors import CheckpointError
from ..files import atomic_file, write_atomic
from ..layout import CHECKPOINTS, CONFIG, STEP_FOLDER, WEIGHTS  # CONFIG, WEIGHTS: the trainer imports them from here
from .config import ModelConfig


def _is_complete(folder: Path) -> bool:
    return (folder / WEIGHTS).is_file() and (folder / CONFIG).is_file()


def load_weights_into(model: nn.Module, weights: Path, device: str | torch.device = "cpu",
                      what: str = "this model") -> None:
    """Fill `model` from a safetensors file, strictly; a mismatch is one CheckpointError line naming the
    first differing tensor and how many more differ (torch lists every one, one line each)."""
    try:
        load_safetensors_into(model, str(weights), strict=True, device=str(device))
    except (SafetensorError, RuntimeError, OSError) as err:
        raise CheckpointError(f"{weights}: does not hold the weights of {what} ({_first_problem(err)})") from err


def save_model(model: nn.Module, folder: str | Path, extra: dict | None = None) -> Path:
    """Write model.safetensors and config.json into `folder` (created if needed); returns the folder."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    with atomic_file(folder / WEIGHTS) as weights_tmp:  # published 0644 like a plain open, not safetensors' 0600
        save_safetensors_from(model, str(weights_tmp))  # tied weights are stored once and re-tied on load
    config = {"tfkit_version": __version__, "model": model.config.to_dict(), **(extra or {})}
    write_atomic(folder / CONFIG, json.dumps(config, indent=2) + "\n")
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
    for parent in (path / CHECKPOINTS, path):
        if parent.is_dir():
            for child in parent.iterdir():
                match = STEP_FOLDER.match(child.name)
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
    with the model in eval mode on `device`.

    The weights are allocated once, by reading the file: the model is built with its parameters on the
    meta device (no memory, no random init, which for a 7B checkpoint would be 28 GB of fp32 thrown away)
    and the file's tensors become its parameters. Buffers computed at construction (position tables)
    are built for real."""
    from . import build_model  # late import: models/__init__ imports this module

    folder = resolve_checkpoint(path)
    cfg = ModelConfig.from_dict(read_config(folder)["model"])  # read_config names the file if it is invalid
    with parameters_on_meta():
        model = build_model(cfg)
    what = f"the {cfg.arch} model its config.json describes"
    try:
        state = load_file(str(folder / WEIGHTS), device=str(device))
    except (SafetensorError, OSError) as err:
        raise CheckpointError(f"{folder / WEIGHTS}: cannot read the weights ({str(err).splitlines()[0]})") from err
    dtype = torch.get_default_dtype()  # what a built model holds; a bf16 file is computed in it as before
    state = {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}
    assign_weights(model, state, folder / WEIGHTS, what)
    return model.to(device).eval(), cfg


@contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Modules built inside get each parameter moved to the meta device as they register it: the weights
    take no memory and their initialisers compute nothing, while buffers are built as usual."""
    register = nn.Module.register_parameter

    def on_meta(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        if param is not None and param.device.type != "meta":
            param = nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)
        register(module, name, param)

    nn.Module.register_parameter = on_meta  # type: ignore[method-assign]
    try:
        yield
    finally:
        nn.Module.register_parameter = register  # type: ignore[method-assign]


def assign_weights(model: nn.Module, state: dict[str, torch.Tensor], source: Path, what: str) -> None:
    """Make `state`'s tensors (in their own dtype) the parameters of a model built on the meta device, strictly (one
    CheckpointError line naming the first mismatch, as `load_weights_into`), then tie what the model
    ties. A file stores a tied matrix once (safetensors drops the other names), so every name of a tied
    group is filled from whichever one the file holds."""
    groups: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(param), []).append(name)
    full = dict(state)
    for names in groups.values():
        present = next((state[n] for n in names if n in state), None)
        if present is not None:
            full.update({n: present for n in names})
    try:
        model.load_state_dict(full, strict=True, assign=True)
    except RuntimeError as err:
        raise CheckpointError(f"{source}: does not hold the weights of {what} ({_first_problem(err)})") from err
    for names in groups.values():  # assign gave each name its own Parameter: one object per tied group
        first = model.get_parameter(names[0])
        for name in names[1:]:
            owner, _, attr = name.rpartition(".")
            setattr(model.get_submodule(owner), attr, first)


def _first_problem(err: Exception) -> str:
    """The first line of a load error that names a tensor, and how many more there are."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    problems = [line for line in lines if line.startswith(("size mismatch", "Missing key", "Unexpected key"))]
    return lines[0] if not problems else problems[0] + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else "")
