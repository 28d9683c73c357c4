"""Which document each token of a packed row belongs to (`data.document_mask`), from the shards' doc_starts.

Packed rows put documents back to back; with a document mask the model attends only inside each one
(models/attention.py). The boundaries come from the token shards' `doc_starts`, not from scanning the ids
for separators: a separator id may also occur inside a document's text, and a batch stays a pure function
of `(seed, i)` computed on the host. A separator belongs to the document it ends (it is that document's
last token, `doc_starts[d + 1] - 1`), so the EOS still predicts the next document's first token from its
own document only.
"""

from __future__ import annotations

import numpy as np
import torch


def document_ids(doc_starts: np.ndarray, stream_positions: np.ndarray) -> torch.Tensor:
    """(B, T) int64: the document of each stream position of a row (B, T), numbered from 0 in each row."""
    docs = np.searchsorted(doc_starts, stream_positions, side="right") - 1  # (B, T)
    return torch.from_numpy(docs - docs[:, :1])  # (B, T)


def restarted_positions(doc_ids: torch.Tensor) -> torch.Tensor:
    """(B, T) int64 positions that restart at 0 where each document starts inside the row (a document cut
    off by the row's start starts at 0 too, so no position reaches past the row)."""
    B, T = doc_ids.shape
    index = torch.arange(T).expand(B, T)  # (B, T)
    starts = torch.ones_like(doc_ids, dtype=torch.bool)
    starts[:, 1:] = doc_ids[:, 1:] != doc_ids[:, :-1]  # (B, T): a document's first token in the row
    first = torch.where(starts, index, 0).cummax(dim=1).values  # (B, T): where the token's document starts
    return index - first  # (B, T)


def layout(doc_starts: np.ndarray, stream_positions: np.ndarray, reset_positions: bool) -> dict[str, torch.Tensor]:
    """The batch keys of a document-masked row: doc_ids (B, T), and position_ids (B, T) when reset."""
    doc_ids = document_ids(doc_starts, stream_positions)
    if not reset_positions:
        return {"doc_ids": doc_ids}
    return {"doc_ids": doc_ids, "position_ids": restarted_positions(doc_ids)}
