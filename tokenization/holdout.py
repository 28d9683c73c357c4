"""Held-out data taken from the training corpus itself: a seeded sample spread through it, not its tail.

A corpus is often ordered (by time, source, chapter, module), and its end is often unlike the rest: a
book's licence, a changelog, the last module of an alphabetical walk. Validation on the tail then measures
that shift (a Grimm run looked like it overfitted: 6.53 on the licence vs 4.29 on the tales). So the held-out
part is made of chunks drawn at random (seeded: the same split for every run of one seed) from every region
of the corpus, each long enough to hold whole sequences. The seed is fixed (`HOLDOUT_SEED`), not the
run's: runs with different seeds then validate on the same tokens, so their losses compare.

- token shards (`heldout_chunks`): `HOLDOUT_CHUNKS` equal chunks, a seeded `valid_fraction` of them held out;
  the rest are the training data, seen through `spans.TokenSpans` (several ranges of one memmap, no copy);
- text streams for the tokenizer report (`hold_out_spread`): a seeded reservoir sample of blocks of lines;
- seq2seq pairs (`sample_documents`): a seeded sample of the pairs.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator, Sequence
from typing import TypeVar

from ..errors import ConfigError

T = TypeVar("T")
HOLDOUT_CHUNKS = 100  # token chunks a corpus is cut into; valid_fraction of them are held out
MIN_CHUNK_TOKENS = 2048  # fewer, longer chunks for small corpora: each holds several training sequences
TEXT_BLOCKS = 100  # held-out text comes in at least this many blocks when they can be >= 200 characters
HOLDOUT_SEED = 0


def check_fraction(valid_fraction: float) -> None:
    if not 0.0 < valid_fraction < 1.0:
        raise ConfigError(f"data.valid_fraction: got {valid_fraction}, expected 0 < value < 1")


def heldout_chunks(num_tokens: int, valid_fraction: float, min_chunk: int = 256,
                   seed: int = HOLDOUT_SEED) -> list[tuple[int, int]]:
    """The (start, end) token ranges held out: `valid_fraction` of up to HOLDOUT_CHUNKS equal chunks, one
    drawn with `seed` from each of as many equal strata, so they are spread over the whole corpus; sorted,
    at least one, never all. Small corpora get at least 5 held-out chunks while a chunk keeps `min_chunk`
    tokens (a few training sequences), and at least one in any case."""
    check_fraction(valid_fraction)
    n_chunks = min(HOLDOUT_CHUNKS, max(num_tokens // MIN_CHUNK_TOKENS, round(5 / valid_fraction)))
    n_chunks = min(n_chunks, max(round(1 / valid_fraction), num_tokens // max(min_chunk, 1)))
    n_chunks = max(2, min(n_chunks, num_tokens))
    bounds = [i * num_tokens // n_chunks for i in range(n_chunks + 1)]
    n_valid = min(n_chunks - 1, max(1, round(n_chunks * valid_fraction)))
    strata = [i * n_chunks // n_valid for i in range(n_valid + 1)]  # one held-out chunk in each stratum
    rng = random.Random(seed)
    picked = [rng.randrange(lo, hi) for lo, hi in zip(strata[:-1], strata[1:])]
    return [(bounds[k], bounds[k + 1]) for k in picked]


def complement(ranges: list[tuple[int, int]], total: int) -> list[tuple[int, int]]:
    """The ranges of 0..total not covered by the sorted, disjoint `ranges`."""
    out, at = [], 0
    for lo, hi in ranges:
        out.append((at, lo))
        at = hi
    out.append((at, total))
    return [(lo, hi) for lo, hi in out if hi > lo]


def sample_documents(docs: Sequence[T], valid_fraction: float, seed: int = HOLDOUT_SEED) -> tuple[list[T], list[T]]:
    """(train, valid): a seeded sample of `valid_fraction` of the documents held out (at least one when
    there are two), both in corpus order."""
    check_fraction(valid_fraction)
    n_valid = max(1, round(len(docs) * valid_fraction)) if len(docs) >= 2 else 0
    picked = set(random.Random(seed).sample(range(len(docs)), n_valid))
    return ([d for i, d in enumerate(docs) if i not in picked], [d for i, d in enumerate(docs) if i in picked])


def hold_out_spread(
    texts: Iterable[str], max_chars: int, heldout: list[str], seed: int = HOLDOUT_SEED, max_fraction: float = 0.1,
) -> Iterator[str]:
    """Yield the stream minus about `max_chars` characters (at most `max_fraction` of it), held out as a
    uniform sample of blocks of whole lines from all through the stream and put in `heldout` at its end.

    One pass, no size known in advance (a compressed corpus does not say), memory bounded by the sample:
    the stream is grouped into blocks of at most 200-2,000 characters (long texts cut at newlines, short
    ones gathered) and a seeded reservoir sample keeps max_chars worth of them, never more than
    `max_fraction` of the blocks seen so far; a block the sample drops is yielded then, later
    than its place in the stream, which tokenizer training (counts of words and pairs) does not see. The
    same documents give the same sample in any file format.
    """
    size = min(max(200, max_chars // TEXT_BLOCKS), 2000)  # short enough that small corpora hold several
    rng, sample, seen = random.Random(seed), [], 0
    for block in _blocks(texts, size):
        seen += 1
        capacity = min(max_chars // size, int(max_fraction * seen))
        if len(sample) < capacity:
            sample.append(block)
            continue
        slot = rng.randrange(seen)
        if slot < len(sample):  # reservoir sampling: this block takes the place of one held so far
            sample[slot], block = block, sample[slot]
        yield from block
    heldout.extend(part for block in sample for part in block)


def _blocks(texts: Iterable[str], size: int) -> Iterator[list[str]]:
    """The stream as consecutive blocks of at most `size` characters: lists of text pieces, a long text cut
    after newlines (`_line_blocks`), short ones gathered until the next would not fit."""
    block: list[str] = []
    chars = 0
    for text in texts:
        for part in _line_blocks(text, size):
            if block and chars + len(part) > size:
                yield block
                block, chars = [], 0
            block.append(part)
            chars += len(part)
    if block:
        yield block


def _line_blocks(text: str, size: int) -> Iterator[str]:
    """`text` in consecutive parts of at most `size` characters, each ending after a newline when one lies
    in its second half (else mid-line)."""
    at = 0
    while at < len(text):
        end = min(len(text), at + size)
        if end < len(text):
            newline = text.rfind("\n", at + size // 2, end)
            end = newline + 1 if newline >= 0 else end
        yield text[at:end]
        at = end
