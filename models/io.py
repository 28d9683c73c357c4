"""Checkpoint folders: `model.safetensors` + `config.json`, and finding the latest one in a run folder.

Weights are only ever read with safetensors, which cannot execute code (unlike pickle). `config.json` is
`{"tfkit_version", "model": ModelConfig.to_dict(), **extra}`; the trainer adds its own keys (recipe,
step) through `extra`. Each file is written under a temporary name and renamed, config.json last, so a
folder holding both files is complete.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from safetensors.torch import load_model as load_safetensors_into
from safetensors.torch import save_model as save_safetensors_from
from torch import nn
from torch.overrides import TorchFunctionMode

from .. import __version__
from ..errors import CheckpointError, TfkitError
from ..files import atomic_file, write_atomic
from ..jsonfile import read_json
from ..layout import BEST, CHECKPOINTS, CONFIG, STEP_FOLDER, WEIGHTS  # CONFIG, WEIGHTS: the trainer imports them from here
from ..runtime import machine_memory
from .config import ModelConfig

if TYPE_CHECKING:
    from ..tokenization.tokenizer import TfkitTokenizer

T = TypeVar("T")
ROTATION_RETRIES = 3  # checkpoints of a running training read in turn before saying that it is writing


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
        with safetensors_writes(folder / WEIGHTS):
            save_safetensors_from(model, str(weights_tmp))  # tied weights are stored once and re-tied on load
    config = {"tfkit_version": __version__, "model": model.config.to_dict(), **(extra or {})}
    write_atomic(folder / CONFIG, json.dumps(config, indent=2) + "\n")
    return folder


@contextmanager
def safetensors_writes(path: Path) -> Iterator[None]:
    """safetensors reports a failed write (a full disk) as a SafetensorError("... I/O error: No space left
    on device (os error 28)"), not an OSError: re-raised as the OSError it is, naming `path`, so that the CLI's boundary
    and the callers that handle a full disk see it."""
    try:
        yield
    except SafetensorError as err:
        code = re.search(r"(?:code: |os error )(\d+)", str(err))
        if code is None:
            raise
        number = int(code.group(1))
        raise OSError(number, os.strerror(number), str(path)) from err


def resolve_checkpoint(path: str | Path, best: bool = False) -> Path:
    """A checkpoint folder is itself; a run folder (or its `checkpoints/`) gives the complete
    `checkpoints/step-<N>/` with the highest N, or with `best` (eval, generate) its complete `best/` when
    train.keep_best wrote one. Anything else is a CheckpointError naming the path."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path}: no such checkpoint or run folder")
    if best and not _is_complete(path) and _is_complete(path / BEST):
        return path / BEST
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


def chosen_note(path: str | Path, folder: Path) -> str | None:
    """When `resolve_checkpoint(path, best=True)` took a run's best/ over its latest checkpoint, the line
    that says so (which step, its validation loss, and how to take the latest instead)."""
    if folder.name != BEST or Path(path) == folder:
        return None
    config = read_config(folder)
    latest = resolve_checkpoint(path)
    loss = config.get("val_loss")
    return (f"{path}: using best/ (step {config.get('step')}, validation loss "
            f"{loss:.4f}) kept by train.keep_best; for the latest weights pass {latest}"
            if isinstance(loss, float) else f"{path}: using best/ kept by train.keep_best; latest: {latest}")


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
            if folder == path or _is_complete(folder):  # not a rotation: the checkpoint itself is at fault
                raise
            removed.append(folder.name)
    raise CheckpointError(f"{path}: the run is writing checkpoints and removed {', '.join(removed)} while they were "
                          "read (train.keep_last); run the command again, or pass a checkpoint folder the run keeps")


def load_with_tokenizer(folder: Path, device: str | torch.device = "cpu") -> tuple[nn.Module, ModelConfig, "TfkitTokenizer"]:
    """(model, cfg, tokenizer) of one checkpoint folder, refused when they do not belong together."""
    from ..tokenization.tokenizer import load_tokenizer

    model, cfg = load_model(folder, device=device)
    tokenizer = load_tokenizer(folder)
    check_tokenizer_fits(folder, tokenizer.vocab_size, cfg.vocab_size)
    return model, cfg, tokenizer


def check_tokenizer_fits(folder: Path, tokenizer_size: int, vocab_size: int) -> None:
    """CheckpointError when the tokenizer beside the weights has more tokens than the model's vocabulary:
    its ids would index past the embedding table, so the tokenizer files do not belong to these weights."""
    if tokenizer_size > vocab_size:
        raise CheckpointError(f"{folder}: its tokenizer has {tokenizer_size} tokens but the model's vocabulary "
                              f"(config.json model.vocab_size) has {vocab_size}; the tokenizer files do not "
                              "belong to these weights")


def read_config(path: str | Path) -> dict:
    """The whole config.json of a checkpoint (folder, run folder, or the config.json file itself).

    Its model section is checked as a ModelConfig (types, values, unknown keys) here, so that every caller
    may index it: `eval` compares `max_seq_len` across checkpoints and would crash on a string. A bad value
    is a ConfigError naming the file and the key."""
    path = Path(path)
    file = path if path.is_file() and path.name == CONFIG else resolve_checkpoint(path) / CONFIG
    config = read_json(file, CheckpointError, expect=None)
    if not isinstance(config, dict) or not isinstance(config.get("model"), dict):
        raise CheckpointError(f"{file}: expected a JSON object with a 'model' section (the model config)")
    ModelConfig.from_dict(config["model"], source=file)
    return config


def load_model(path: str | Path, device: str | torch.device = "cpu") -> tuple[nn.Module, ModelConfig]:
    """Build the model described by config.json and fill it from model.safetensors; returns (model, cfg)
    with the model in eval mode on `device`. A classifier made by `tfkit finetune` is refused, naming the
    commands that take one: generating, converting or exporting it as a language model would read a head
    that is not there (`load_classifier` loads it).

    The weights are allocated once, by reading the file: the model is built with its parameters on the
    meta device (no memory, no random init, which for a 7B checkpoint would be 28 GB of fp32 thrown away)
    and the file's tensors become its parameters. Buffers computed at construction (position tables)
    are built for real."""
    folder = resolve_checkpoint(path)
    config = read_config(folder)
    refuse_classifier(folder, config)
    return _load(folder, config, device, None)


def refuse_classifier(folder: Path, config: dict) -> None:
    """CheckpointError for a classifier where a language model is needed (generating, converting, exporting)."""
    if config.get("head") is not None:
        raise CheckpointError(f"{folder}: a classifier made by `tfkit finetune`, not a language model; `tfkit eval "
                              "--data LABELLED` and `tfkit predict` take it")


def load_classifier(path: str | Path, device: str | torch.device = "cpu") -> tuple[nn.Module, ModelConfig]:
    """A checkpoint of `tfkit finetune` as a `SequenceClassifier` (its head from config.json's `head`),
    built and filled as `load_model` builds a language model."""
    from .heads import HeadConfig

    folder = resolve_checkpoint(path)
    config = read_config(folder)
    if config.get("head") is None:
        arch = config["model"].get("arch", "gpt")
        raise CheckpointError(f"{folder}: a {arch} language model, not a classifier made by `tfkit finetune` "
                              "(labelled rows are for classifiers; score language models on a corpus in a "
                              "`tfkit eval` of their own)")
    return _load(folder, config, device, HeadConfig.from_dict(config["head"], str(folder / CONFIG)))


def _load(folder: Path, config: dict, device: str | torch.device, head) -> tuple[nn.Module, ModelConfig]:
    from . import build_model  # late import: models/__init__ imports this module
    from .heads import SequenceClassifier

    cfg = ModelConfig.from_dict(config["model"])  # read_config names the file if it is invalid
    check_buildable(cfg, folder / CONFIG)
    with parameters_on_meta():
        model = build_model(cfg)
        if head is not None:  # a fine-tuned checkpoint: the body and its head
            model = SequenceClassifier(model, head)
    what = f"the {cfg.arch} {'classifier' if head else 'model'} its config.json describes"
    try:
        state = load_file(str(folder / WEIGHTS), device=str(device))
    except (SafetensorError, OSError) as err:
        raise CheckpointError(f"{folder / WEIGHTS}: cannot read the weights ({str(err).splitlines()[0]})") from err
    check_dtypes(model, state, folder / WEIGHTS)
    dtype = torch.get_default_dtype()  # what a built model holds; a bf16 file is computed in it as before
    state = {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}
    assign_weights(model, state, folder / WEIGHTS, what)
    return model.to(device).eval(), cfg


def check_buildable(cfg: ModelConfig, source: Path) -> None:
    """Refuse a config whose model this machine cannot even build. Parameters are built on the meta device
    (no memory), but sinusoidal position tables are computed at construction, fp32, max_seq_len x d_model
    per embedding: `max_seq_len: 1000000000` in a damaged config.json would allocate without bound."""
    if cfg.positions != "sinusoidal":
        return
    tables = 2 if cfg.arch == "transformer" else 1  # the encoder-decoder embeds source and target apart
    need, have = tables * cfg.max_seq_len * cfg.d_model * 4, machine_memory()
    if need > have:
        raise CheckpointError(
            f"{source}: model.max_seq_len={cfg.max_seq_len:,} with sinusoidal positions needs {need / 2**30:.1f} "
            f"GiB of position tables, more than this machine's {have / 2**30:.1f} GiB of memory; the file is "
            "damaged or was not written for this machine")


def check_dtypes(model: nn.Module, state: dict[str, torch.Tensor], source: Path) -> None:
    """Every weight the model computes with in floating point is stored in floating point: torch's own
    error for an int32 or bool weight names no tensor and gives no reason."""
    expected = model.state_dict(keep_vars=True)
    for name, tensor in state.items():
        if name in expected and expected[name].is_floating_point() and not tensor.is_floating_point():
            raise CheckpointError(f"{source}: tensor {name} is stored as {str(tensor.dtype).removeprefix('torch.')}, "
                                  "expected a floating-point weight (fp32, bf16 or fp16)")


def check_finite(model: nn.Module, source: Path) -> None:
    """Refuse weights holding NaN or inf, naming the first such tensor: sampling from them fails deep inside
    torch, and greedy decoding would print garbage. (eval scores them: a NaN loss says the same in its row.)"""
    for name, param in model.named_parameters():
        if not torch.isfinite(param).all():
            raise CheckpointError(f"{source}: the weights are not finite ({name} holds NaN or inf): the run "
                                  "diverged before this checkpoint was saved; use an earlier checkpoint")


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
        with SkipMetaInit():
            yield
    finally:
        nn.Module.register_parameter = register  # type: ignore[method-assign]


# What modules run to fill their parameters at construction: nn.init's functions and the in-place tensor
# ops they and modules' own `reset_parameters` use. All of them set values and keep the shape.
INITIALISERS = frozenset({
    "uniform_", "normal_", "trunc_normal_", "constant_", "ones_", "zeros_", "eye_", "dirac_", "xavier_uniform_",
    "xavier_normal_", "kaiming_uniform_", "kaiming_normal_", "orthogonal_", "sparse_",  # nn.init
    "zero_", "fill_", "copy_", "mul_", "add_", "sub_", "div_", "clamp_", "erfinv_", "exponential_", "bernoulli_",
    "random_", "log_normal_", "cauchy_", "geometric_", "fill_diagonal_",  # Tensor methods
})


class SkipMetaInit(TorchFunctionMode):
    """Initialisers (`INITIALISERS`) on meta tensors return their tensor untouched. There is nothing to
    compute, and on meta tensors torch runs random initialisers through its reference implementations,
    whose first call imports TorchDynamo: 1.2 s of every load. Any other op runs as usual."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        target = args[0] if args else kwargs.get("tensor")  # nn.init's functions pass it by keyword
        if getattr(func, "__name__", "") in INITIALISERS and isinstance(target, torch.Tensor) and target.is_meta:
            return target
        return func(*args, **kwargs)


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


def load_plain_pickle(file: Path):
    """`torch.load(file, weights_only=True)`: tensors, numbers, strings and containers, never code. Its
    warnings about the pickle protocol of a file that is then refused are not the user's news."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.load(file, map_location="cpu", weights_only=True)


def pickle_refusal(err: Exception, what: str) -> str:
    """Why `load_plain_pickle` failed, in one line and without torch's advice to retry with
    `weights_only=False` (which would run the code it just refused): a pickle naming a Python global would
    execute code on load; one the plain-data reader cannot parse is refused too; anything else is a
    damaged file."""
    text = str(err)
    reasons = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith(
        ("Weights only load failed", "Please file an issue", "Check the documentation"))]
    found = re.search(r"GLOBAL ([\w.]+)", text)
    if isinstance(err, pickle.UnpicklingError) and found:
        return (f"refused: loading this {what} would run code ({found.group(1)}), and tfkit loads pickles only "
                "when they hold plain tensors and numbers; the file is hostile, damaged or not what it claims")
    if text.startswith("Weights only load failed"):
        return (f"refused: this {what} is not a plain-data pickle ({reasons[0] if reasons else 'unreadable'}); "
                "tfkit never loads one that could run code: the file is hostile, damaged or not what it claims")
    first = reasons[0] if reasons else type(err).__name__
    return f"cannot load the {what}, the file is damaged or truncated ({first[:200]})"


def _first_problem(err: Exception) -> str:
    """The first line of a load error that names a tensor, and how many more there are."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    problems = [line for line in lines if line.startswith(("size mismatch", "Missing key", "Unexpected key"))]
    return lines[0] if not problems else problems[0] + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else "")
