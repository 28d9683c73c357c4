"""Weighted mixtures of token sources (tokenization/mixture.py): each window holds the asked shares exactly,
the packed rows hold them within a fraction of a point, every batch is a pure function of (seed, index) (the
basis of exact resume at any process count), a source that runs out starts its next epoch on its own and
visits every token once per epoch, `repeat: false` ends the mixture, and a document mask never joins two
sources. Built on synthetic shards whose ids say where each token came from."""

from __future__ import annotations

import numpy as np
import pytest

from tfkit.errors import ConfigError, DataError
from tfkit.tokenization.batches import ClmDataset
from tfkit.tokenization.mixture import Mixture, MixedDataset, SourceStream, quotas
from tfkit.tokenization.shards import TokenShards

BASES = (0, 20_000, 40_000, 60_000)  # source s's ids are BASES[s] + a running count: id -> source and position


def shards(index: int, docs: int, mean: int, seed: int) -> TokenShards:
    """Source `index`: `docs` documents of random lengths around `mean`, each token id its position + a base."""
    lengths = np.random.default_rng(seed).integers(1, 2 * mean, docs)
    n = int(lengths.sum())
    assert n < 20_000
    tokens = (BASES[index] + np.arange(n)).astype(np.uint32)
    return TokenShards(tokens, np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64), 80_000, None, {})


def source_of(ids: np.ndarray) -> np.ndarray:
    return np.searchsorted(np.array(BASES[1:]), ids, side="right")


def mixture(shares=(0.6, 0.3, 0.1), sizes=((60, 300), (8, 2000), (40, 50)), repeat=(True, True, True),
            window: int | None = 1 << 15, seed: int = 1337) -> Mixture:
    streams = [SourceStream(f"s{i}", shards(i, docs, mean, i), share, rep, seed, i)
               for i, (share, (docs, mean), rep) in enumerate(zip(shares, sizes, repeat))]
    return Mixture(streams, window_tokens=window)


def clm(m: Mixture, seq_len: int = 64, document_mask: bool = False, seed: int = 1337) -> MixedDataset:
    return MixedDataset(m, lambda s: ClmDataset.from_shards(s, seq_len, seed, document_mask=document_mask), seed)


def test_quotas_are_the_largest_remainder_apportionment():
    assert quotas([0.6, 0.3, 0.1], 10) == [6, 3, 1]
    assert quotas([1 / 3, 1 / 3, 1 / 3], 10) == [4, 3, 3]
    assert sum(quotas([0.123, 0.456, 0.421], 1001)) == 1001


def test_every_window_holds_the_asked_shares_to_one_token():
    m = mixture()
    for e in range(6):
        window = m.window_shards(e)
        counts = np.bincount(source_of(np.asarray(window.tokens)), minlength=3)
        assert counts.tolist() == m.quota == [19661, 9830, 3277]


@pytest.mark.parametrize("shares", [(0.6, 0.3, 0.1), (0.59, 0.4, 0.01)], ids=["60-30-10", "one-percent"])
def test_packed_rows_hold_the_shares_within_half_a_point(shares):
    data = clm(mixture(shares))
    rows = np.concatenate([data.batch(i, 16)["input_ids"].numpy().ravel() for i in range(200)])
    realised = np.bincount(source_of(rows), minlength=3) / len(rows)
    assert np.abs(realised - np.array(shares)).max() < 0.005, realised
    counted = data.tokens_by_source(200, 16)  # what the report says, counted from the windows
    assert [counted[f"s{i}"] for i in range(3)] == np.bincount(source_of(rows), minlength=3).tolist()


def test_a_batch_is_a_pure_function_of_seed_and_index():
    a, b = clm(mixture()), clm(mixture())
    later = a.batch(37, 16)  # window 2, read before windows 0 and 1
    earlier = a.batch(3, 16)
    assert np.array_equal(b.batch(3, 16)["input_ids"], earlier["input_ids"])
    assert np.array_equal(b.batch(37, 16)["input_ids"], later["input_ids"])
    halves = [b.batch(37, 16, rank=r, world_size=2)["input_ids"] for r in (0, 1)]  # a torchrun of 2 processes
    assert np.array_equal(np.concatenate(halves), later["input_ids"])
    other = clm(mixture(seed=7), seed=7)
    assert not np.array_equal(other.batch(37, 16)["input_ids"], later["input_ids"])


def test_a_small_source_restarts_on_its_own_and_reads_every_token_once_per_epoch():
    m = mixture(shares=(0.5, 0.2, 0.3))  # s2 has about 2,000 tokens and 30% of 32K-token windows
    small = m.streams[2]
    windows = [np.asarray(m.window_shards(e).tokens) for e in range(4)]
    ids = np.concatenate([w[source_of(w) == 2] for w in windows]) - BASES[2]
    epochs = len(ids) // small.num_tokens
    assert epochs > 15
    for k in range(epochs):  # each epoch a permutation of the source's chunks: every token exactly once
        epoch = ids[k * small.num_tokens:(k + 1) * small.num_tokens]
        assert np.array_equal(np.sort(epoch), np.arange(small.num_tokens))
    big = windows[0][source_of(windows[0]) == 0]  # 16K of the large source's 18K tokens: nothing repeated yet
    assert len(np.unique(big)) == len(big) == m.quota[0]


def test_repeat_false_ends_the_mixture_when_the_source_runs_out():
    m = mixture(repeat=(True, True, False))
    data = clm(m)
    total = data.num_batches(16)
    assert total is not None and m.full_windows == m.streams[2].num_tokens // m.quota[2]
    rows = np.concatenate([data.batch(i, 16)["input_ids"].numpy().ravel() for i in range(total)])
    ids = rows[source_of(rows) == 2] - BASES[2]
    assert len(np.unique(ids)) == len(ids) and len(ids) > 0.9 * m.streams[2].num_tokens  # read once, nearly all
    with pytest.raises(DataError, match="past the end of the mixture"):
        data.batch(total, 16)
    assert clm(mixture()).num_batches(16) is None


def test_a_document_mask_keeps_documents_and_sources_apart():
    data = clm(mixture(), document_mask=True)
    for i in (0, 21, 40):
        batch = data.batch(i, 16)
        sources = source_of(batch["input_ids"].numpy())
        for row_docs, row_sources in zip(batch["doc_ids"].numpy(), sources):
            for d in np.unique(row_docs):
                assert len(np.unique(row_sources[row_docs == d])) == 1
    window = data.mixture.window_shards(0)
    ids = np.asarray(window.tokens).astype(np.int64)
    starts = set(window.doc_starts[:-1].tolist())
    # a document of the window continues where it was: consecutive ids of one source, or a new document
    breaks = np.flatnonzero(np.diff(ids) != 1) + 1
    assert set(breaks.tolist()) <= starts
    for s, stream in enumerate(data.mixture.streams):  # and every document of a source starts one of the window
        own = set(np.asarray(stream.shards.doc_starts).tolist())
        begins = [i for i, t in enumerate(ids) if source_of(np.array([t]))[0] == s and t - BASES[s] in own]
        assert begins and set(begins) <= starts


def test_held_out_views_are_read_as_the_tokens_they_stand_for():
    full = shards(0, 60, 300, 0)
    train, _ = full.split(0.1, min_chunk=128)
    stream = SourceStream("s0", train, 1.0, True, 1337)
    m = Mixture([stream], window_tokens=train.num_tokens)
    window = np.asarray(m.window_shards(0).tokens)
    assert np.array_equal(np.sort(window), np.sort(np.asarray(train.tokens)))


def test_a_weight_too_small_for_one_token_of_a_window_is_refused():
    with pytest.raises(ConfigError, match="s2 has a share of"):
        mixture(shares=(0.6, 0.4 - 1e-7, 1e-7))


def test_a_window_read_from_token_files_equals_one_read_from_memory(tmp_path):
    """Sources on disk are read with os.preadv (their pages stay page cache): the same window, held-out views too."""
    def on_disk(shards: TokenShards, name: str) -> TokenShards:
        np.asarray(shards.tokens).tofile(tmp_path / name)
        tokens = np.memmap(tmp_path / name, np.uint32, mode="r")
        return TokenShards(tokens, shards.doc_starts, shards.vocab_size, None, {})

    memory = [shards(0, 60, 300, 0), shards(1, 8, 2000, 1)]
    disk = [on_disk(s, f"{i}.bin") for i, s in enumerate(memory)]
    views = [s.split(0.1, min_chunk=128)[0] for s in disk]
    for sources in (disk, views):
        expected = [s.split(0.1, min_chunk=128)[0] for s in memory] if sources is views else memory
        a = Mixture([SourceStream(f"s{i}", s, 0.5, True, 1, i) for i, s in enumerate(sources)], window_tokens=1 << 14)
        b = Mixture([SourceStream(f"s{i}", s, 0.5, True, 1, i) for i, s in enumerate(expected)], window_tokens=1 << 14)
        for e in (0, 3):
            assert np.array_equal(a.window_shards(e).tokens, b.window_shards(e).tokens)
