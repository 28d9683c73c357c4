"""Pickles tfkit reads (a training checkpoint's trainer_state.pt, a HuggingFace `pytorch_model.bin`): plain
data only (`torch.load(weights_only=True)`), never code, and a refusal that says why in one line."""

from __future__ import annotations

import pickle
import re
import warnings
from pathlib import Path

import torch


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

