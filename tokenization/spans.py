"""Several ranges of one memory-mapped token array seen as one array, with nothing copied until read: how
a training split with held-out chunks cut out of it (`holdout.heldout_chunks`) is read."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


class TokenSpans:
    """Several ranges of one token array seen as one array: what `ClmDataset`, `MlmDataset` and the
    denoising pairs read (`len`, slices, integer-array indexing), with nothing copied until read."""

    def __init__(self, tokens: np.ndarray, ranges: Sequence[tuple[int, int]]):
        self.base = tokens
        self.ranges = [(int(lo), int(hi)) for lo, hi in ranges if hi > lo]
        lengths = np.array([hi - lo for lo, hi in self.ranges], dtype=np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)  # (R + 1,) virtual starts
        self.starts = np.array([lo for lo, _ in self.ranges], dtype=np.int64)  # (R,) base starts

    def __len__(self) -> int:
        return int(self.offsets[-1])

    @property
    def shape(self) -> tuple[int]:
        return (len(self),)

    @property
    def dtype(self) -> np.dtype:
        return self.base.dtype

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        out = self[0 : len(self)]
        return out if dtype is None else out.astype(dtype)

    def to_base(self, index: np.ndarray) -> np.ndarray:
        """Virtual positions -> positions in the base array."""
        which = np.searchsorted(self.offsets, index, side="right") - 1  # range holding each position
        return self.starts[which] + (index - self.offsets[which])

    def __getitem__(self, key):
        if isinstance(key, slice):
            lo, hi, step = key.indices(len(self))
            if step != 1:
                raise IndexError("TokenSpans takes slices with step 1")
            parts = []
            for (a, b), start in zip(self.ranges, self.offsets[:-1]):
                s, e = max(lo, int(start)), min(hi, int(start) + b - a)
                if s < e:
                    parts.append(self.base[a + s - int(start) : a + e - int(start)])
            return np.concatenate(parts) if len(parts) != 1 else np.asarray(parts[0])
        index = np.asarray(key, dtype=np.int64)
        if index.ndim == 0:
            index = int(index) + len(self) if int(index) < 0 else int(index)
            if not 0 <= index < len(self):
                raise IndexError(f"index {key} out of range for {len(self)} tokens")
            return self.base[int(self.to_base(np.array([index]))[0])]
        return self.base[self.to_base(np.where(index < 0, index + len(self), index))]
