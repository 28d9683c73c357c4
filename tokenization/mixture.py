"""Weighted mixtures of token sources, mixed before packing, every batch a pure function of (seed, index).

Each source (its token shards, the training part when validation is held out of it) is read as an endless
stream of its own: epoch k visits its chunks of CHUNK_TOKENS tokens in an order seeded by (seed, its name, k),
each chunk in corpus order, so a source that runs out starts its next epoch on its own and its position is
a plain number. The mixed stream is cut into windows of W tokens (`window_tokens`: the sources' total, within
MIN_WINDOW_TOKENS .. WINDOW_TOKENS); window e takes exactly q_s tokens from source s, its positions
[e * q_s, (e + 1) * q_s), where the quotas q_s are the weights' shares of W apportioned by largest remainder.
So every window holds the asked shares to one token in W, whatever the documents' lengths, and window e is
computed from e alone: a resume, or a different number of processes, reads the same tokens.

Inside a window the sources' units (their stretches cut into pieces of at most PIECE_TOKENS, whole
documents and parts of them) are interleaved by how far each has come through its quota, then the window is
packed into the objective's rows (`ClmDataset` / `MlmDataset` over it, `PureDataset.over`), so the shares
hold in the packed rows (mixing packed rows instead breaks them where sources pack differently). The
window's documents start where the sources' documents start, and where a unit does not continue the unit
before it, so a document mask keeps documents, and sources, apart. The window's rows are visited in an order
seeded by (seed, e), its last partial batch dropped, as a single corpus's epoch is.

A source with `repeat: false` ends the mixture when it runs out: the last window takes the same fraction of
every quota, and `num_batches` says how many batches there are (the trainer ends the run there).

Memory is one window (W tokens, its unit table) and each source's chunk order (a number per 64K tokens),
whatever the sources' sizes: the shards themselves stay memory-mapped.
"""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import torch

from ..errors import ConfigError, DataError
from .batches import TRAIN, PureDataset
from .shards import TokenShards
from .spans import TokenSpans

CHUNK_TOKENS = 1 << 16  # a source's epoch visits chunks of this many tokens in a seeded order
PIECE_TOKENS = 1024  # the sources are interleaved in pieces of at most this many tokens
WINDOW_TOKENS = 1 << 22  # the most tokens of a window (the rows shuffled together): 8 MB of uint16 ids
MIN_WINDOW_TOKENS = 1 << 16
WINDOW = 2  # seed-stream tag of the window orders (batches.TRAIN 0, EVAL 1)


def name_key(name: str) -> int:
    """A source's own seed key, from its name: the same stream whatever its place in the list."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:7], "little")


def quotas(shares: list[float], total: int) -> list[int]:
    """`total` tokens apportioned to `shares` (summing to 1) by largest remainder: integers summing to `total`."""
    raw = [share * total for share in shares]
    out = [math.floor(r) for r in raw]
    by_remainder = sorted(range(len(raw)), key=lambda i: (out[i] - raw[i], i))
    for i in by_remainder[: total - sum(out)]:
        out[i] += 1
    return out


@dataclass
class Units:
    """Stretches of source tokens laid end to end: each one's source, start in that source's tokens, length."""

    source: np.ndarray  # (U,) int64
    at: np.ndarray  # (U,) int64
    length: np.ndarray  # (U,) int64

    @classmethod
    def join(cls, parts: list["Units"]) -> "Units":
        return cls(*(np.concatenate([getattr(p, f) for p in parts]) if parts else np.zeros(0, np.int64)
                     for f in ("source", "at", "length")))

    def take(self, order: np.ndarray) -> "Units":
        return Units(self.source[order], self.at[order], self.length[order])


class SourceStream:
    """One source as an endless stream of its tokens (module doc): `units(lo, hi)` are its positions lo..hi."""

    def __init__(self, name: str, shards: TokenShards, share: float, repeat: bool, seed: int, index: int = 0):
        if shards.num_tokens == 0:
            raise DataError(f"source {name}: holds no tokens")
        self.name, self.shards, self.share, self.repeat, self.index = name, shards, share, repeat, index
        self.seed, self.key = seed, name_key(name)
        self.num_tokens = shards.num_tokens
        self.num_chunks = -(-self.num_tokens // CHUNK_TOKENS)
        self._orders: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def _order(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """(chunk order, where each chunk starts in the epoch (num_chunks + 1,)) of one epoch."""
        if epoch not in self._orders:
            if len(self._orders) > 8:
                self._orders.clear()
            perm = np.random.default_rng([self.seed, WINDOW, self.key, epoch]).permutation(self.num_chunks)
            lengths = np.minimum(CHUNK_TOKENS, self.num_tokens - perm * CHUNK_TOKENS)
            self._orders[epoch] = perm, np.concatenate([[0], np.cumsum(lengths)])
        return self._orders[epoch]

    def units(self, lo: int, hi: int) -> Units:
        """The stream's positions [lo, hi) as units: chunk by chunk, cut into pieces of at most PIECE_TOKENS."""
        parts, p = [], lo
        while p < hi:
            epoch, a = divmod(p, self.num_tokens)
            b = min(self.num_tokens, a + hi - p)
            perm, cum = self._order(epoch)
            for r in range(int(np.searchsorted(cum, a, "right")) - 1, int(np.searchsorted(cum, b, "left"))):
                base = int(perm[r]) * CHUNK_TOKENS - int(cum[r])  # chunk position -> source position
                parts.append(self._segment(base + max(a, int(cum[r])), base + min(b, int(cum[r + 1]))))
            p += b - a
        return Units.join(parts)

    def _segment(self, x: int, y: int) -> Units:
        """Source tokens [x, y) in pieces of at most PIECE_TOKENS, also cut where a held-out split's view
        (`TokenSpans`) passes from one range of its memmap to the next, so each piece is one slice of it."""
        at = np.arange(x, y, PIECE_TOKENS, dtype=np.int64)
        if isinstance(self.shards.tokens, TokenSpans):
            offsets = self.shards.tokens.offsets
            at = np.union1d(at, offsets[(offsets > x) & (offsets < y)])
        return Units(np.full(len(at), self.index, np.int64), at, np.diff(np.append(at, y)))

    def read(self, out: np.ndarray, units: Units, positions: np.ndarray) -> None:
        """Copy this source's `units` into `out` at window `positions`: from a token file by `os.preadv`, so
        its pages stay page cache rather than pages of this process (a mapped read of a few MB at random in
        a 1 GB file maps hundreds of MB: the kernel maps whole folios around each fault)."""
        tokens = self.shards.tokens
        base, at = (tokens.base, tokens.to_base(units.at)) if isinstance(tokens, TokenSpans) else (tokens, units.at)
        jobs = zip(positions.tolist(), at.tolist(), units.length.tolist())
        if not (isinstance(base, np.memmap) and base.filename and base.dtype == out.dtype):
            for p, a, n in jobs:
                out[p : p + n] = base[a : a + n]
            return
        size, view = out.itemsize, memoryview(out).cast("B")
        fd = os.open(base.filename, os.O_RDONLY)
        try:
            for p, a, n in jobs:
                if os.preadv(fd, [view[p * size : (p + n) * size]], base.offset + a * size) != n * size:
                    raise DataError(f"{base.filename}: shorter than its token cache says (truncated while read)")
        finally:
            os.close(fd)

    def doc_starts_in(self, units: Units, positions: np.ndarray) -> np.ndarray:
        """The window positions of this source's document starts inside its `units` (laid at `positions`)."""
        starts = self.shards.doc_starts
        first = np.searchsorted(starts, units.at, "left")  # (U,) the first document start at or after each unit
        count = np.searchsorted(starts, units.at + units.length, "left") - first
        which = np.repeat(np.arange(len(first)), count)
        k = np.arange(int(count.sum())) - np.repeat(np.cumsum(count) - count, count)
        return positions[which] + (np.asarray(starts[first[which] + k], np.int64) - units.at[which])


class Mixture:
    """Windows of the mixed stream (module doc) of `streams`; `window_tokens` overrides W (tests)."""

    def __init__(self, streams: list[SourceStream], window_tokens: int | None = None):
        self.streams = streams
        natural = sum(s.num_tokens for s in streams)
        self.window = window_tokens or min(max(natural, MIN_WINDOW_TOKENS), WINDOW_TOKENS)
        self.quota = quotas([s.share for s in streams], self.window)
        for stream, q in zip(streams, self.quota):
            if q == 0:
                raise ConfigError(f"data.train: source {stream.name} has a share of {stream.share:.2g}, less than one "
                                  f"token in a window of {self.window:,}: give it a larger weight or leave it out")
        finite = [(s.num_tokens, q) for s, q in zip(streams, self.quota) if not s.repeat]
        self.full_windows = min((n // q for n, q in finite), default=None)  # None: the mixture never ends
        self.last_quota: list[int] = []  # the partial window after the full ones, a finite mixture's last
        if finite:
            fraction = min((n - self.full_windows * q) / q for n, q in finite)
            self.last_quota = [math.floor(fraction * q) for q in self.quota]
        self.natural_tokens = natural

    @property
    def dtype(self) -> np.dtype:
        return self.streams[0].shards.dtype

    def quota_of(self, e: int) -> list[int]:
        if self.full_windows is not None and e >= self.full_windows:
            if e > self.full_windows:
                raise DataError(f"window {e} is past the end of the mixture (a source with repeat: false ran out)")
            return self.last_quota
        return self.quota

    def units(self, e: int) -> tuple[Units, np.ndarray, np.ndarray]:
        """(window e's units in window order, where each starts in the window, whether each continues the unit
        before it in its source)."""
        parts, clocks = [], []
        for stream, q, take in zip(self.streams, self.quota, self.quota_of(e)):
            if take == 0:
                continue
            part = stream.units(e * q, e * q + take)
            parts.append(part)
            clocks.append((np.cumsum(part.length) - part.length) / q)  # how far through its quota each starts
        units = Units.join(parts)
        units = units.take(np.lexsort((units.source, np.concatenate(clocks) if clocks else np.zeros(0))))
        positions = np.cumsum(units.length) - units.length
        follows = np.zeros(len(units.at), dtype=bool)  # the unit continues the one before it in the window
        follows[1:] = (units.source[1:] == units.source[:-1]) & (units.at[1:] == units.at[:-1] + units.length[:-1])
        return units, positions, follows

    def window_shards(self, e: int) -> TokenShards:
        """Window e's tokens and document starts, as token shards (held in memory)."""
        units, positions, follows = self.units(e)
        out = np.empty(int(units.length.sum()), dtype=self.dtype)
        starts = [positions[~follows], [len(out)]]  # a unit that does not continue the one before starts a document
        for stream in self.streams:
            mine = units.source == stream.index
            stream.read(out, units.take(mine), positions[mine])
            starts.append(stream.doc_starts_in(units.take(mine), positions[mine]))
        doc_starts = np.unique(np.concatenate(starts).astype(np.int64))
        first = self.streams[0].shards
        return TokenShards(out, doc_starts, first.vocab_size, first.separator_id, first.meta)

    def tokens_by_source(self, e: int, spans: np.ndarray) -> np.ndarray:
        """(S,) int64: the tokens of each source in window e's stretches `spans` (N, 2) of (start, length)."""
        units, positions, _ = self.units(e)
        S = len(self.streams)
        per = np.zeros((len(positions) + 1, S), np.int64)  # (U + 1, S) tokens of each source before each unit
        np.add.at(per, (np.arange(1, len(positions) + 1), units.source), units.length)
        per = np.cumsum(per, axis=0)

        def before(x: np.ndarray) -> np.ndarray:  # (N, S) tokens of each source before window position x
            j = np.searchsorted(positions, x, "right") - 1
            inside = np.minimum(x - positions[j], units.length[j])
            return per[j] + inside[:, None] * (units.source[j][:, None] == np.arange(S))

        return (before(spans[:, 0] + spans[:, 1]) - before(spans[:, 0])).sum(axis=0)


class MixedDataset(PureDataset):
    """The packed rows of a `Mixture`: `make` builds the objective's dataset (clm / mlm) over window 0, and
    every window is read through it (`PureDataset.over`). Batch i is window i // (rows per window // B),
    those rows in an order seeded by (seed, window); see the module doc."""

    def __init__(self, mixture: Mixture, make: Callable[[TokenShards], PureDataset], seed: int):
        self.mixture, self.seed = mixture, seed
        self.template = make(mixture.window_shards(0))
        self.name = self.template.name
        self.per_window = self.template.examples_in(mixture.window)  # rows of a full window
        last = mixture.last_quota
        self.last_rows = self.template.examples_in(sum(last)) if last else 0
        if mixture.full_windows is None:  # train.epochs: passes over as many tokens as the sources hold
            self.num_examples = self.template.examples_in(mixture.natural_tokens)
        else:
            self.num_examples = mixture.full_windows * self.per_window + self.last_rows
        # the window being read: (number, its dataset, its row order); one at a time
        self._window: tuple[int, PureDataset, np.ndarray] | None = (0, self.template,
                                                                     self._order(0, self.template.num_examples))

    @property
    def stride(self) -> int:
        """Stream tokens per row (a block's inputs, an MLM row's body)."""
        return getattr(self.template, "body_len", None) or self.template.seq_len

    def _order(self, e: int, rows: int) -> np.ndarray:
        return np.random.default_rng([self.seed, WINDOW, e]).permutation(rows)

    def _per_window(self, batch_size: int) -> int:
        per = self.per_window // batch_size
        if per == 0:
            raise DataError(f"the mixture's window of {self.mixture.window:,} tokens gives {self.per_window} "
                            f"{self.name}, fewer than one batch of {batch_size}")
        return per

    def num_batches(self, batch_size: int) -> int | None:
        """Batches before a source with repeat: false runs out; None when every source repeats."""
        if self.mixture.full_windows is None:
            return None
        return self.mixture.full_windows * self._per_window(batch_size) + self.last_rows // batch_size

    def locate(self, i: int, batch_size: int) -> tuple[int, int]:
        """(window, batch inside it) of global batch i."""
        per = self._per_window(batch_size)
        total = self.num_batches(batch_size)
        if total is not None and i >= total:
            raise DataError(f"batch {i} is past the end of the mixture ({total:,} batches of {batch_size} before a "
                            "source with repeat: false runs out)")
        full = self.mixture.full_windows
        if full is not None and i >= full * per:
            return full, i - full * per
        return divmod(i, per)

    def _window_of(self, e: int) -> tuple[PureDataset, np.ndarray]:
        if self._window is None or self._window[0] != e:
            self._window = None  # one window at a time: drop the old one before building the next
            shards = self.mixture.window_shards(e)
            data = self.template.over(shards.tokens, shards.doc_starts)
            self._window = (e, data, self._order(e, data.num_examples))
        return self._window[1], self._window[2]

    def batch(self, i: int, batch_size: int, rank: int = 0, world_size: int = 1) -> dict[str, torch.Tensor]:
        rows = self._local(batch_size, rank, world_size)
        e, j = self.locate(i, batch_size)
        data, order = self._window_of(e)
        idx = order[[j * batch_size + r for r in rows]]
        return data.rows(idx, [(TRAIN, self.seed, i, r) for r in rows])

    def _rows(self, idx: np.ndarray, keys: list) -> dict[str, torch.Tensor]:
        data, _ = self._window_of(0)
        return data.rows(idx, keys)

    def tokens_by_source(self, batches: int, batch_size: int) -> dict[str, int]:
        """name -> the tokens of each source in the rows of global batches 0 .. batches-1 (their stream
        stretches: a block's inputs, an MLM row's body): the shares realised after packing."""
        totals = np.zeros(len(self.mixture.streams), np.int64)
        for e, used in self._used_rows(batches, batch_size):
            order = self._order(e, self._rows_in(e))[:used]
            spans = np.stack([order * self.stride, np.full(len(order), self.stride)], axis=1)
            totals += self.mixture.tokens_by_source(e, spans)
        return {s.name: int(t) for s, t in zip(self.mixture.streams, totals)}

    def _rows_in(self, e: int) -> int:
        full = self.mixture.full_windows
        return self.last_rows if full is not None and e == full else self.per_window

    def _used_rows(self, batches: int, batch_size: int) -> Iterator[tuple[int, int]]:
        """(window, rows of it read) for global batches 0 .. batches-1."""
        if batches <= 0:
            return
        last_e, last_j = self.locate(batches - 1, batch_size)
        per = self._per_window(batch_size)
        for e in range(last_e):
            yield e, per * batch_size
        yield last_e, (last_j + 1) * batch_size

    def epochs(self, tokens: dict[str, int]) -> dict[str, float]:
        """name -> passes over each source that `tokens` (tokens_by_source) make."""
        return {s.name: tokens.get(s.name, 0) / s.num_tokens for s in self.mixture.streams}


@dataclass
class ValidSources:
    """Validation per named source: each dataset scored alone, the mixed figure their mean under `weights`
    (trainer/validation.py); `byte_table` (token id -> bytes of text) makes bits per byte."""

    datasets: dict[str, PureDataset]
    weights: dict[str, float]
    byte_table: np.ndarray

    @property
    def num_examples(self) -> int:
        return sum(d.num_examples for d in self.datasets.values())

    def eval_batches(self, n: int, batch_size: int, rank: int = 0, world_size: int = 1) -> Iterator[dict]:
        """The first source's batches (what an end-of-run sample's `auto` prompt opens with)."""
        return next(iter(self.datasets.values())).eval_batches(n, batch_size, rank, world_size)
