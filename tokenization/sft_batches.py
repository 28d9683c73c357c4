"""Batches for chat fine-tuning (`data.format: chat`): conversations packed into full rows, trained on the
assistant's tokens only, attention kept inside each conversation.

Each conversation's template ids (tokenization/chat.py) become one example of `len - 1` positions, inputs
`ids[:-1]` and labels `ids[1:]` where the next token is the assistant's, -100 elsewhere. Examples are packed
back to back into rows of `seq_len` positions in a seeded order, once, when the dataset is built; the rows
are then the dataset's examples, visited as every dataset visits them (`PureDataset`: batch `i` a pure
function of `(seed, i)`, so resume is exact). `doc_ids (B, T)` numbers each example of a row, and the padding
after the last one is a document of its own, so no example attends across another (models/attention.py);
positions restart at each example (`position_ids`), as generation frames a single chat at position 0.
An example longer than a row is cut to the row (its tail is never trained on, and counted).
"""

from __future__ import annotations

import numpy as np
import torch

from ..errors import DataError
from .batches import PureDataset
from .masking import IGNORE_INDEX
from .packing import restarted_positions

Example = tuple[list[int], list[bool]]  # a conversation's ids and, per id, whether the loss is on it


def example_arrays(ids: list[int], trained: list[bool]) -> tuple[np.ndarray, np.ndarray]:
    """(inputs, labels) of one conversation, each (len - 1,): labels are the next ids where the next id is
    trained, -100 elsewhere."""
    ids_a = np.asarray(ids, dtype=np.int64)
    labels = np.where(np.asarray(trained[1:], dtype=bool), ids_a[1:], IGNORE_INDEX)
    return ids_a[:-1], labels


def pack(examples: list[Example], seq_len: int, seed: int, pad_id: int) -> tuple[np.ndarray, int]:
    """(rows (N, 3, T), cut): input ids, labels and document ids of each packed row, and how many examples
    were longer than a row. Examples fill rows greedily in an order seeded by `seed`."""
    rows: list[np.ndarray] = []
    row = _empty_row(seq_len, pad_id)
    used = docs = cut = 0
    for k in np.random.default_rng([seed, 7]).permutation(len(examples)):
        inputs, labels = example_arrays(*examples[k])
        if len(inputs) > seq_len:
            inputs, labels, cut = inputs[:seq_len], labels[:seq_len], cut + 1
        if used + len(inputs) > seq_len:
            rows.append(_close(row, used, docs))
            row, used, docs = _empty_row(seq_len, pad_id), 0, 0
        end = used + len(inputs)
        row[0, used:end], row[1, used:end], row[2, used:end] = inputs, labels, docs
        used, docs = end, docs + 1
    if used:
        rows.append(_close(row, used, docs))
    return np.stack(rows) if rows else np.zeros((0, 3, seq_len), np.int64), cut


def _empty_row(seq_len: int, pad_id: int) -> np.ndarray:
    row = np.empty((3, seq_len), dtype=np.int64)  # input_ids, labels, doc_ids
    row[0], row[1], row[2] = pad_id, IGNORE_INDEX, 0
    return row


def _close(row: np.ndarray, used: int, docs: int) -> np.ndarray:
    row[2, used:] = docs  # the padding: a document of its own, never attended by an example
    return row


class SftDataset(PureDataset):
    """Packed chat rows: input_ids, labels (-100 off the assistant's tokens and on padding), doc_ids and
    position_ids, each (B, T) int64."""

    name = "packed chat rows"

    def __init__(self, examples: list[Example], seq_len: int, seed: int, pad_id: int) -> None:
        if not examples:
            raise DataError("data.train: holds no conversation")
        self.seq_len, self.seed = seq_len, seed
        self.rows, self.cut = pack(examples, seq_len, seed, pad_id)
        self.num_examples = len(self.rows)
        self.num_conversations = len(examples)
        self.num_tokens = int((self.rows[:, 1] != IGNORE_INDEX).sum())  # trained tokens
        self.positions = restarted_positions(torch.from_numpy(self.rows[:, 2]))  # (N, T): fixed once packed

    def _rows(self, idx: np.ndarray, keys: list) -> dict[str, torch.Tensor]:
        idx = np.asarray(idx, dtype=np.int64)
        rows = torch.from_numpy(self.rows[idx])  # (B, 3, T)
        return {"input_ids": rows[:, 0].contiguous(), "labels": rows[:, 1].contiguous(),
                "doc_ids": rows[:, 2].contiguous(), "position_ids": self.positions[torch.from_numpy(idx)]}
