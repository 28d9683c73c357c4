"""Fine-tuning batches packed: the examples of one batch laid back to back in as few rows as fit.

Why. A batch of labelled texts padded to `data.seq_len` is mostly padding: AG News items are about 55
tokens, so at seq_len 128 more than half of every row is [PAD], and even HuggingFace's padding to the
longest text of each batch leaves about 40%. Every linear layer (most of a step's work) computes those
positions and throws them away. Packed, a batch of 32 such texts fills about 14 rows of 128 instead of 32,
and a fine-tuning step costs about what its real tokens cost (benchmarks/finetune.py measures it).

What makes a packed batch compute exactly what the padded one does:
- `example_ids (R, T)`: the example (0..E-1, its place in the batch) each position belongs to, E for the
  padding at the ends of rows. The model attends only inside an example (`doc_ids`, the document mask of
  pretraining, built once per forward), so no text reads another, and padding reads only padding;
- `position_ids (R, T)`: positions restarted at 0 at each example, as it would sit alone in its row;
- `token_type_ids (R, T)` (BERT pairs): each example's segments, copied with it;
- `starts (E,)` and `lengths (E,)`: where each example begins in the flattened (R * T) positions and how
  many it has, from which the head takes BERT's [CLS] (the first), a GPT's last token, or the mean
  (models/heads.py). E is the batch's size, so the head's output shape is known without a host read.
Rows are filled first-fit in order of decreasing length (ties in batch order): a pure function of the
lengths, so a batch is packed the same way on every call and resume stays exact. An example never spans
two rows (each is at most T long), so R <= E; R varies from batch to batch (a compiled model recompiles
once, with that dimension dynamic).
"""

from __future__ import annotations

import torch

PACKED_KEYS = ("position_ids", "example_ids", "starts", "lengths")  # beside input_ids (and token_type_ids)


def first_fit(lengths: list[int], row_len: int) -> list[tuple[int, int]]:
    """(row, offset) of each example: first-fit decreasing into rows of `row_len` positions."""
    if any(not 0 < n <= row_len for n in lengths):
        raise ValueError(f"example lengths must be 1..{row_len}, got {sorted(set(lengths))}")
    used: list[int] = []  # positions taken in each row so far
    places = [(0, 0)] * len(lengths)
    for k in sorted(range(len(lengths)), key=lambda k: -lengths[k]):  # stable: ties keep batch order
        row = next((r for r, taken in enumerate(used) if taken + lengths[k] <= row_len), len(used))
        if row == len(used):
            used.append(0)
        places[k] = (row, used[row])
        used[row] += lengths[k]
    return places


def packed_batch(rows: list[list[int]], segments: list[list[int]] | None, row_len: int,
                 pad_id: int) -> dict[str, torch.Tensor]:
    """The examples `rows` (token ids, specials included) and their segment ids packed into rows of
    `row_len`: input_ids, position_ids, example_ids (R, T), token_type_ids (R, T) with segments, starts and
    lengths (E,), as the module doc describes."""
    lengths = [len(row) for row in rows]
    places = first_fit(lengths, row_len)
    n_rows = 1 + max(row for row, _ in places)
    ids = torch.full((n_rows, row_len), pad_id, dtype=torch.long)  # (R, T)
    positions = torch.zeros((n_rows, row_len), dtype=torch.long)  # (R, T)
    owners = torch.full((n_rows, row_len), len(rows), dtype=torch.long)  # (R, T): E = padding
    types = torch.zeros((n_rows, row_len), dtype=torch.long) if segments is not None else None  # (R, T)
    for k, ((row, at), n) in enumerate(zip(places, lengths)):
        ids[row, at:at + n] = torch.as_tensor(rows[k], dtype=torch.long)
        positions[row, at:at + n] = torch.arange(n)
        owners[row, at:at + n] = k
        if types is not None:
            types[row, at:at + n] = torch.as_tensor(segments[k], dtype=torch.long)
    batch = {"input_ids": ids, "position_ids": positions, "example_ids": owners,
             "starts": torch.tensor([row * row_len + at for row, at in places], dtype=torch.long),  # (E,)
             "lengths": torch.tensor(lengths, dtype=torch.long)}  # (E,)
    if types is not None:
        batch["token_type_ids"] = types
    return batch
