"""`tfkit consolidate CKPT --out DIR`: a sharded checkpoint (sharded.py) written in the single-file form.

Every command reads a sharded checkpoint as it is; this writes the form other tools read: model.safetensors,
config.json (the source's record: its step, objective, data, head), the tokenizer files and a model card the
source has. The weights are read in this one process, each tensor allocated once and filled in place
(`weights.load_model`), and written from those tensors (safetensors writes from their memory): one copy of
the model in memory. The optimizer state stays in the sharded checkpoint, which resumes at any process
count; `DIR` is a model folder, not a training checkpoint. `DIR` is written whole or not at all.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from torch import nn

from ..errors import CheckpointError
from ..files import staged_folder
from ..layout import MODEL_CARD, SHARDS
from .folders import is_sharded, resolve_checkpoint
from .record import CheckpointRecord
from .training import copy_tokenizer
from .weights import load_classifier, load_model, save_model


def consolidate(source: str | Path, out: Path) -> tuple[Path, nn.Module]:
    """Write the checkpoint `source` resolves to (a run folder: its newest complete checkpoint) as the
    single-file checkpoint `out`; returns (the folder read, its model). The caller has checked `out`
    (replacing.check_new_folder)."""
    folder = resolve_checkpoint(source)
    if not is_sharded(folder):
        raise CheckpointError(f"{folder}: already in the single-file form (model.safetensors), with no {SHARDS}/ "
                              "to consolidate; every command reads it as it is")
    record = CheckpointRecord.read(folder)
    model, _ = (load_classifier if record.head is not None else load_model)(folder)
    with staged_folder(out) as tmp:
        save_model(model, tmp, record)
        copy_tokenizer(folder, tmp)
        if (folder / MODEL_CARD).is_file():
            shutil.copy2(folder / MODEL_CARD, tmp / MODEL_CARD)
    return folder, model
