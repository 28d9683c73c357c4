"""A training run's checkpoints on disk: `checkpoints/step-<N>/` every `save_every` updates (and at the end),
`best/` for train.keep_best, pruning to `keep_last`, and after a divergence the checkpoints of the weights that
diverged set aside (a restart's `best/` it cannot stand behind is set aside by `folders.set_aside_best`).

`checkpoints/step-<N>/` holds what `weights.load_model` reads (`model.safetensors`, `config.json`), the
tokenizer files (so the folder alone can generate, evaluate or be exported), and `trainer_state.pt`
(trainer_state.py). The folder is filled as a temporary sibling `.step-<N>.tmp-XXXX/`, flushed to the disk and
renamed to `step-<N>/` whole (`files.staged_folder`). A crash mid-write leaves only a temp folder, which the
scanner (folders.py) never matches and the next save removes; the previous checkpoint stays valid.
"""

from __future__ import annotations

import contextlib
import math
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from ..errors import CheckpointError, TfkitError
from ..files import set_aside, staged_folder
from ..layout import BEST, CHECKPOINTS, TOKENIZER_FILES, TRAINER_STATE
from ..models import build_model
from ..models.resize import grow_vocab
from . import sharded
from .folders import latest_checkpoint, list_checkpoints
from .record import CheckpointRecord
from .weights import load_weights_from, save_model, write_record


class NonFiniteWeights(CheckpointError):
    """A checkpoint was asked of weights that hold NaN or inf: it is never written."""


def save_checkpoint(run_dir: Path, step: int, model: nn.Module, trainer_state: dict, tokenizer_dir: Path,
                    record: CheckpointRecord, keep_last: int) -> Path:
    """Write `run_dir/checkpoints/step-<step>/` atomically, then keep only the newest `keep_last`.

    Saving a step that exists already (e.g. interrupted right after a save) replaces it."""
    root = run_dir / CHECKPOINTS
    final = root / f"step-{step}"
    if not weights_finite(model):
        raise NonFiniteWeights(f"step {step}: the weights are not finite (NaN or inf); no checkpoint was written")
    with staged_folder(final, durable=True) as tmp:
        save_model(model, tmp, record, step=step)
        copy_tokenizer(tokenizer_dir, tmp)
        torch.save(trainer_state, tmp / TRAINER_STATE)
    prune(root, keep_last)
    return final


def save_best(run_dir: Path, step: int, model: nn.Module, tokenizer_dir: Path, record: CheckpointRecord,
              val_loss: float) -> Path:
    """Write `run_dir/best/` (train.keep_best): the weights, config.json with their step and validation loss,
    and the tokenizer, replacing the previous best whole. No trainer state: a run resumes from its latest
    checkpoint, never from an earlier best."""
    final = run_dir / BEST
    if not weights_finite(model):
        raise NonFiniteWeights(f"step {step}: the weights are not finite (NaN or inf); the best checkpoint was kept")
    with staged_folder(final, durable=True) as tmp:
        save_model(model, tmp, record, step=step, val_loss=val_loss)
        copy_tokenizer(tokenizer_dir, tmp)
    return final


class ShardedSave:
    """A sharded checkpoint being written (sharded.py): every rank writes its shards into rank 0's staging
    folder, and rank 0 publishes it (the tokenizer, trainer_state.pt, then config.json, then the rename into
    place, `files.staged_folder`) once every rank's part is on disk. Until then nothing reads it as a
    checkpoint: a kill leaves a temporary folder and the previous checkpoint is the one resume takes.

    `start` is called by every rank; with `async_group` the shards are written by a thread while training goes
    on, and `finish` (every rank, at the next save or at the end) waits for them before rank 0 publishes."""

    def __init__(self, final: Path, folder: Path, stack: contextlib.ExitStack, future, write_rest) -> None:
        self.final, self.folder, self.stack, self.future = final, folder, stack, future
        self.write_rest: Callable[[Path], None] | None = write_rest  # rank 0's part; None on the other ranks

    @classmethod
    def start(cls, final: Path, state: dict, write_rest: Callable[[Path], None] | None,
              share: Callable[[Path | None], Path], async_group=None) -> "ShardedSave":
        """`write_rest` (rank 0 only, None elsewhere) fills the rest of the folder; `share` gives every rank rank
        0's staging folder (a broadcast)."""
        stack = contextlib.ExitStack()
        try:
            folder = share(stack.enter_context(staged_folder(final, durable=True)) if write_rest else None)
            future = sharded.save(folder, state, async_group)
        except BaseException:
            stack.__exit__(*sys.exc_info())
            raise
        return cls(final, folder, stack, future, write_rest)

    @property
    def written(self) -> bool:
        """Whether this rank's shards (on rank 0: every rank's) are on disk, without waiting."""
        return self.future is None or self.future.done()

    def finish(self) -> Path | None:
        """Wait for this rank's shards; rank 0 then writes the rest and publishes. Returns the published
        folder on rank 0 (None on the others)."""
        try:
            if self.future is not None:
                self.future.result()
            if self.write_rest is not None:
                self.write_rest(self.folder)
        except BaseException:
            self.stack.__exit__(*sys.exc_info())
            raise
        self.stack.close()
        return self.final if self.write_rest is not None else None


def sharded_rest(model: nn.Module, tokenizer_dir: Path, record: CheckpointRecord, trainer_state: dict | None,
                 **facts) -> Callable[[Path], None]:
    """What rank 0 writes beside the shards: the tokenizer files, trainer_state.pt (counters, RNG, scaler, the
    optimizer's groups: numbers and names), then config.json last."""
    def write(folder: Path) -> None:
        copy_tokenizer(tokenizer_dir, folder)
        if trainer_state is not None:
            torch.save(trainer_state, folder / TRAINER_STATE)
        write_record(model, folder, record, **facts)
    return write


def copy_tokenizer(source: Path, folder: Path) -> None:
    """The tokenizer files of `source` into the checkpoint `folder` being written (those it has)."""
    for name in TOKENIZER_FILES:
        if (source / name).is_file():
            shutil.copy2(source / name, folder / name)


def best_loss(run_dir: Path) -> float:
    """The validation loss of the run folder's best/ (inf when there is none yet)."""
    try:
        loss = CheckpointRecord.read(run_dir / BEST).val_loss
    except TfkitError:  # none yet, or one a kill left damaged: the next better validation replaces it
        return math.inf
    return math.inf if loss is None else loss


def prune(root: Path, keep_last: int) -> None:
    """Delete all but the newest `keep_last` checkpoints, and what killed saves left behind: the temp
    folders `.step-<N>.tmp-XXXX` (and older tfkit's `.step-<N>.tmp`) and set-aside `.step-<N>.old-...`."""
    for step, folder in list_checkpoints(root.parent)[:-keep_last]:
        shutil.rmtree(folder, ignore_errors=True)
    for child in root.iterdir():
        if child.name.startswith(".step-") and child.is_dir():
            shutil.rmtree(child, ignore_errors=True)


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
    saved = CheckpointRecord.read(folder).model
    if saved.vocab_size == model.config.vocab_size:
        load_weights_from(model, folder)
        return
    old = build_model(saved)
    load_weights_from(old, folder)
    model.load_state_dict(grow_vocab(old.state_dict(), model.config.vocab_size))

