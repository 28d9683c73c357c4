"""`tfkit convert-mqa-to-gqa` on a checkpoint folder: the pure regrouping of models/convert.py applied to its
weights, written as a new checkpoint folder whose config.json says where the weights came from and how."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
from torch import nn

from ..files import staged_folder
from ..layout import TOKENIZER_FILES
from ..models import build_model
from ..models.convert import check_regrouping, regroup_kv_heads
from ..tokenization.tokenizer import load_tokenizer
from .meta import assign_weights, parameters_on_meta
from .record import CheckpointRecord
from .training import copy_tokenizer
from .weights import check_tokenizer_fits, load_model, save_model


def convert_checkpoint(folder: Path, out: Path, kv_heads: int, method: str,
                       seed: int = 0) -> tuple[nn.Module, nn.Module]:
    """Regroup the checkpoint `folder` into the new checkpoint folder `out`; returns (model, new_model).

    The caller has checked `out` (replacing.check_new_folder). `out` is written whole or not at all: weights,
    config.json and the source's tokenizer files. config.json keeps the source's own facts (objective,
    recipe) except its training step, which joins its prior steps, and records where the weights came from
    and how."""
    source = CheckpointRecord.read(folder)
    check_regrouping(source.model, kv_heads, method)  # fail before loading
    model, cfg = load_model(folder)
    if (folder / TOKENIZER_FILES[0]).is_file():  # copied below: it must fit the weights it goes with
        check_tokenizer_fits(folder, load_tokenizer(folder).vocab_size, cfg.vocab_size)
    generator = torch.Generator().manual_seed(seed)
    state_dict, new_cfg = regroup_kv_heads(model.state_dict(), cfg, kv_heads, method, generator=generator)
    with parameters_on_meta():
        new_model = build_model(new_cfg)
    assign_weights(new_model, state_dict, folder, f"the regrouped {new_cfg.arch} model")
    record = dataclasses.replace(source, step=None, val_loss=None, prior_steps=source.total_steps,
                                 converted_from=str(folder.resolve()), method=method, kv_heads_before=cfg.kv_heads,
                                 seed=seed if method == "random" else None)
    with staged_folder(out) as tmp:  # the caller ran check_new_folder: replacing `out` needed --force
        save_model(new_model, tmp, record)
        copy_tokenizer(folder, tmp)
    return model, new_model.eval()
