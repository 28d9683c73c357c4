"""A checkpoint's weights: `model.safetensors` beside its config.json, written and read.

Weights are only ever read with safetensors, which cannot execute code (unlike pickle). Each file is written
under a temporary name and renamed, config.json last, so a folder holding both files is complete. A model is
built from its config.json with its parameters on the meta device and the file's tensors become its parameters
(meta.py): no random init, weights allocated once.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from safetensors.torch import load_model as load_safetensors_into
from safetensors.torch import save_model as save_safetensors_from
from torch import nn

from ..errors import CheckpointError
from ..files import atomic_file, write_atomic
from ..layout import CONFIG, SHARDS, WEIGHTS
from ..models import build_model
from ..models.config import ModelConfig
from ..models.heads import SequenceClassifier
from ..runtime import machine_memory
from . import sharded
from .folders import is_sharded, resolve_checkpoint
from .meta import assign_weights, first_problem, parameters_on_meta
from .record import CheckpointRecord

if TYPE_CHECKING:
    from ..tokenization.tokenizer import TfkitTokenizer


def load_weights_into(model: nn.Module, weights: Path, device: str | torch.device = "cpu",
                      what: str = "this model") -> None:
    """Fill `model` from a safetensors file, strictly; a mismatch is one CheckpointError line naming the
    first differing tensor and how many more differ (torch lists every one, one line each)."""
    try:
        load_safetensors_into(model, str(weights), strict=True, device=str(device))
    except (SafetensorError, RuntimeError, OSError) as err:
        raise CheckpointError(f"{weights}: does not hold the weights of {what} ({first_problem(err)})") from err


def load_weights_from(model: nn.Module, folder: Path, device: str | torch.device = "cpu",
                      what: str = "this model") -> None:
    """Fill `model` from the checkpoint `folder`'s weights, in whichever form they are: model.safetensors, or
    the shards of a run of several processes (read in this one process, tensor by tensor)."""
    if is_sharded(folder):
        sharded.load_weights(model, folder, device, what)
    else:
        load_weights_into(model, folder / WEIGHTS, device, what)


def save_model(model: nn.Module, folder: str | Path, record: CheckpointRecord | None = None, **facts: Any) -> Path:
    """Write model.safetensors and config.json into `folder` (created if needed); returns the folder.

    config.json is `record` (or a new one) with `facts` (fields of CheckpointRecord: `step=5`), its model
    section the model's own config and, for a classifier, its head."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    with atomic_file(folder / WEIGHTS) as weights_tmp:  # published 0644 like a plain open, not safetensors' 0600
        with safetensors_writes(folder / WEIGHTS):
            save_safetensors_from(model, str(weights_tmp))  # tied weights are stored once and re-tied on load
    write_record(model, folder, record, **facts)
    return folder


def write_record(model: nn.Module, folder: Path, record: CheckpointRecord | None = None, **facts: Any) -> None:
    """config.json of the weights of `model` written into `folder` (the last file of a checkpoint): `record` with
    `facts`, its model section the model's own config and, for a classifier, its head."""
    record = dataclasses.replace(record or CheckpointRecord(model=model.config), model=model.config, **facts)
    head = getattr(model, "head_config", None)
    if head is not None:
        record = dataclasses.replace(record, head=head)
    write_atomic(folder / CONFIG, record.to_json())


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
    record = CheckpointRecord.read(folder)
    refuse_classifier(folder, record)
    return _load(folder, record, device)


def load_classifier(path: str | Path, device: str | torch.device = "cpu") -> tuple[nn.Module, ModelConfig]:
    """A checkpoint of `tfkit finetune` as a `SequenceClassifier` (its head from config.json's `head`),
    built and filled as `load_model` builds a language model."""
    folder = resolve_checkpoint(path)
    record = CheckpointRecord.read(folder)
    if record.head is None:
        raise CheckpointError(f"{folder}: a {record.model.arch} language model, not a classifier made by `tfkit "
                              "finetune` (labelled rows are for classifiers; score language models on a corpus in a "
                              "`tfkit eval` of their own)")
    return _load(folder, record, device)


def refuse_classifier(folder: Path, record: CheckpointRecord) -> None:
    """CheckpointError for a classifier where a language model is needed (generating, converting, exporting)."""
    if record.head is not None:
        raise CheckpointError(f"{folder}: a classifier made by `tfkit finetune`, not a language model; `tfkit eval "
                              "--data LABELLED` and `tfkit predict` take it")


def _load(folder: Path, record: CheckpointRecord, device: str | torch.device) -> tuple[nn.Module, ModelConfig]:
    """The model (with its head, for a classifier) `record` describes, filled from the folder's weights."""
    cfg, head = record.model, record.head
    check_buildable(cfg, folder / CONFIG)
    check_depth(cfg, folder)
    with parameters_on_meta():
        model = build_model(cfg)
        if head is not None:  # a fine-tuned checkpoint: the body and its head
            model = SequenceClassifier(model, head)
    what = f"the {cfg.arch} {'classifier' if head else 'model'} its config.json describes"
    if is_sharded(folder):  # several processes' shards, consolidated here: each tensor allocated once, filled in place
        check_dtypes(model, {name: dtype for name, (_, dtype) in sharded.tensor_shapes(folder).items()},
                     folder / SHARDS)
        sharded.load_weights(model, folder, device, what)
        return model.to(device).eval(), cfg
    try:
        state = load_file(str(folder / WEIGHTS), device=str(device))
    except (SafetensorError, OSError) as err:
        raise CheckpointError(f"{folder / WEIGHTS}: cannot read the weights ({str(err).splitlines()[0]})") from err
    check_dtypes(model, {k: v.dtype for k, v in state.items()}, folder / WEIGHTS)
    dtype = torch.get_default_dtype()  # what a built model holds; a bf16 file is computed in it as before
    state = {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}
    assign_weights(model, state, folder / WEIGHTS, what)
    return model.to(device).eval(), cfg


def load_with_tokenizer(folder: Path,
                        device: str | torch.device = "cpu") -> tuple[nn.Module, ModelConfig, TfkitTokenizer]:
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


# a block's tensor: `blocks.3.attn.q_proj.weight` (`body.blocks.3.` in a classifier; `encoder.3.`, `decoder.3.`)
LAYER_TENSOR = re.compile(r"(?:^|\.)(blocks|encoder|decoder)\.(\d+)\.")


def check_depth(cfg: ModelConfig, folder: Path) -> None:
    """Refuse a config.json that declares more or fewer blocks than model.safetensors holds, read from the
    file's header before the model is built: building costs time and memory per declared block, even on the
    meta device (`n_layers: 20000` beside the weights of 2 took a minute to reach the missing-weights error)."""
    from safetensors import safe_open

    if is_sharded(folder):
        names = list(sharded.tensor_shapes(folder))
    else:
        try:
            with safe_open(str(folder / WEIGHTS), framework="pt") as f:
                names = list(f.keys())
        except (SafetensorError, OSError):
            return  # _load names the unreadable file
    stacks: dict[str, set[int]] = {}
    for name in names:
        if found := LAYER_TENSOR.search(name):
            stacks.setdefault(found.group(1), set()).add(int(found.group(2)))
    # a stack shared across layers (model.share_layers) is stored once, as `blocks.0.*`
    held = {stack: len(indices) for stack, indices in stacks.items() if len(indices) != cfg.stored_layers}
    if stacks and held:
        stack, count = next(iter(held.items()))
        held_in = sharded.weights_file(folder).name
        declared = f"model.n_layers={cfg.n_layers}" + (" with model.share_layers (one block stored)"
                                                       if cfg.share_layers else "")
        raise CheckpointError(f"{folder / CONFIG}: {declared}, but {held_in} holds {count} "
                              f"block{'s' * (count != 1)} ({stack}.0 ...); the config.json does not belong to these "
                              "weights (or one of them is damaged)")


def check_dtypes(model: nn.Module, stored: dict[str, torch.dtype], source: Path) -> None:
    """Every weight the model computes with in floating point is stored in floating point (`stored`: the
    file's dtype of each tensor): torch's own error for an int32 or bool weight names no tensor and gives no
    reason."""
    expected = model.state_dict(keep_vars=True)
    for name, dtype in stored.items():
        if name in expected and expected[name].is_floating_point() and not dtype.is_floating_point:
            raise CheckpointError(f"{source}: tensor {name} is stored as {str(dtype).removeprefix('torch.')}, "
                                  "expected a floating-point weight (fp32, bf16 or fp16)")


def check_finite(model: nn.Module, source: Path) -> None:
    """Refuse weights holding NaN or inf, naming the first such tensor: sampling from them fails deep inside
    torch, and greedy decoding would print garbage. (eval scores them: a NaN loss says the same in its row.)"""
    for name, param in model.named_parameters():
        if not torch.isfinite(param).all():
            raise CheckpointError(f"{source}: the weights are not finite ({name} holds NaN or inf): the run "
                                  "diverged before this checkpoint was saved; use an earlier checkpoint")

