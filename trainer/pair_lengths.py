"""How full a seq2seq run's rows are, read off its corpus: what the plan's synthetic batch must look like.

A seq2seq batch is padded to data.seq_len on both sides, and the loop counts only the real source and
target tokens (objectives.count_inputs): on the built-in docs, whose docstrings are mostly shorter than a
row, 60% of the positions are text. A synthetic batch with every position real made the plan predict 37%
more tokens/s than the run trained (benchmarks/RESULTS.md, "Planning a run", pass 2), and would give the
loss law tokens the run never sees. So the plan samples the corpus's first few MB (or pairs), estimates
their tokens from their UTF-8 bytes (BYTES_PER_TOKEN), cuts them as the run does
(tokenization.batches.Seq2SeqDataset: denoising chunks of seq_len - 1 tokens, source spans collapsed to
one mask token; pairs truncated to the row) and lays the synthetic rows out at those lengths.
No torch here: lengths only.
"""

from __future__ import annotations

import itertools
import random

from .recipe import Recipe

BYTES_PER_TOKEN = 3.6  # of UTF-8 text per token: stdlib:docs:train, 1,556,580 bytes as 435,820 BPE-4096 tokens
SAMPLE_BYTES = 4 << 20  # of text read from the start of the corpus (the whole built-in docs): a second or two
SAMPLE_PAIRS = 20_000  # pairs read from the start of a pair corpus
NOISE_DENSITY, MEAN_SPAN = 0.15, 3.0  # Seq2SeqDataset.denoising's defaults


def _tokens(text: str) -> int:
    return max(1, round(len(text.encode("utf-8", "replace")) / BYTES_PER_TOKEN))


def pair_lengths(recipe: Recipe) -> list[tuple[int, int]]:
    """(source, target) real tokens of each row the run's data gives (EOS and BOS included), from a sample."""
    from ..tokenization.corpus import iter_pieces  # noqa: PLC0415 - reads the corpus: only when planned
    from ..tokenization.pairs import is_pair_data, read_pairs  # noqa: PLC0415

    d, row = recipe.data, recipe.data.seq_len
    if isinstance(d.train, str) and is_pair_data(d.train, d.source_field):
        pairs = itertools.islice(read_pairs(d.train, d.source_field, d.target_field), SAMPLE_PAIRS)
        return [(min(_tokens(s), row - 1) + 1, min(_tokens(t), row - 1) + 1) for s, t in pairs]
    spec = d.train if isinstance(d.train, str) else d.train[0]["path"]  # a mixture: its first source
    documents: list[int] = []  # UTF-8 bytes of each document read
    read = 0
    for text, new in iter_pieces(spec, text_field=d.text_field):
        if new:
            if read >= SAMPLE_BYTES:
                break
            documents.append(0)
        size = len(text.encode("utf-8", "replace"))
        documents[-1] += size
        read += size
    keep = 1 - NOISE_DENSITY + NOISE_DENSITY / MEAN_SPAN  # of a chunk's tokens left in its source
    rows = []
    for size in documents:
        tokens = max(1, round(size / BYTES_PER_TOKEN))
        for start in range(0, tokens, row - 1):
            chunk = min(row - 1, tokens - start)
            rows.append((max(1, round(chunk * keep)) + 1, chunk + 1))
    return rows


def sample_rows(lengths: list[tuple[int, int]], n: int, seed: int = 0) -> list[tuple[int, int]]:
    """`n` rows drawn from `lengths` as the run's shuffled batches draw them (seeded)."""
    return random.Random(seed).choices(lengths, k=n) if lengths else []


def fill(lengths: list[tuple[int, int]], seq_len: int) -> float:
    """The share of a padded row's positions that are text, both sides."""
    return sum(s + t for s, t in lengths) / (2 * seq_len * len(lengths)) if lengths else 1.0
