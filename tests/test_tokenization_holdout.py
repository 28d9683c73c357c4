"""Held-out data from the training corpus: seeded, spread through the corpus, disjoint from training."""

import numpy as np
import pytest

from tfkit.errors import ConfigError
from tfkit.tokenization.holdout import complement, heldout_chunks, hold_out_spread, sample_documents
from tfkit.tokenization.spans import TokenSpans


def test_heldout_chunks_are_spread_through_the_corpus_and_repeatable():
    n = 1_000_000
    held = heldout_chunks(n, 0.05)
    assert held == heldout_chunks(n, 0.05)  # the same split for every run
    assert abs(sum(hi - lo for lo, hi in held) / n - 0.05) < 0.01
    fifths = {lo * 5 // n for lo, _ in held}
    assert fifths == {0, 1, 2, 3, 4}  # a chunk in every fifth of the corpus, not a tail
    assert max(hi for _, hi in held) < n or len(held) > 1


@pytest.mark.parametrize("n,fraction", [(3000, 0.05), (10, 0.01), (3000, 0.5), (50_000, 0.2)])
def test_heldout_share_stays_near_the_fraction_for_small_corpora(n, fraction):
    held = heldout_chunks(n, fraction)
    share = sum(hi - lo for lo, hi in held) / n
    assert 0 < share < 1 and (share <= max(2 * fraction, 0.1) or n < 20)


def test_heldout_fraction_out_of_range_names_the_key():
    with pytest.raises(ConfigError, match=r"data.valid_fraction: got 1.5, expected 0 < value < 1"):
        heldout_chunks(100, 1.5)


def test_token_spans_read_as_the_concatenated_ranges():
    base = np.arange(10_000, dtype=np.uint16)
    ranges = complement([(1000, 1500), (7000, 7100)], len(base))
    spans = TokenSpans(base, ranges)
    ref = np.concatenate([base[lo:hi] for lo, hi in ranges])  # (N,) the independent reference
    assert len(spans) == len(ref) and spans.shape == ref.shape and spans.dtype == base.dtype
    for lo, hi in [(0, 5), (990, 1010), (0, len(ref)), (6400, 6600), (len(ref) - 3, len(ref))]:
        assert np.array_equal(spans[lo:hi], ref[lo:hi])
    idx = np.array([0, 999, 1000, 6499, 6500, len(ref) - 1])
    assert np.array_equal(spans[idx], ref[idx]) and spans[-1] == ref[-1] and spans[1000] == ref[1000]
    assert np.array_equal(np.asarray(spans), ref)


def test_sample_documents_holds_out_a_seeded_spread_sample():
    docs = list(range(100))
    train, valid = sample_documents(docs, 0.1)
    assert (train, valid) == sample_documents(docs, 0.1)
    assert len(valid) == 10 and sorted(train + valid) == docs and not set(train) & set(valid)
    assert valid != docs[-10:] and min(valid) < 50  # not the tail
    assert sample_documents([0, 1, 2], 0.01)[1] != []  # at least one when possible


def test_hold_out_spread_samples_blocks_of_lines_from_all_through_the_stream():
    texts = [f"part {i} line {j}\n" for i in range(100) for j in range(50)]
    total = sum(map(len, texts))
    heldout: list[str] = []
    trained = list(hold_out_spread(iter(texts), max_chars=total // 20, heldout=heldout))
    held = "".join(heldout)
    assert total // 40 <= len(held) <= total // 20
    assert sorted("".join(trained).splitlines() + held.splitlines()) == sorted("".join(texts).splitlines())
    parts = {int(line.split()[1]) for line in held.splitlines()}
    assert min(parts) < 30 and max(parts) > 70  # from the start and the end, not one tail
    assert all(block.endswith("\n") for block in heldout)  # whole lines
    again: list[str] = []
    list(hold_out_spread(iter(texts), max_chars=total // 20, heldout=again))
    assert again == heldout  # seeded: the same sample every time


def test_hold_out_spread_never_takes_more_than_its_share_of_a_small_stream():
    heldout: list[str] = []
    trained = "".join(hold_out_spread(["one line\n" * 5000], max_chars=1_000_000, heldout=heldout))
    assert 0 < len("".join(heldout)) <= 0.1 * 45_000 and len(trained) + len("".join(heldout)) == 45_000
