"""Tokenizer training and data preparation: tfkit's wrappers against the raw `tokenizers` calls they wrap.

tfkit never reimplements tokenization, so its cost over `tokenizers` is pure bookkeeping (progress and
alphabet tracking, the report, atomic folders, memory-mapped shards, cache keys); the goal is that this
stays within 10% (ratio >= 1/1.1), on about 1 MB of tfkit's built-in `stdlib:docs:train` corpus (English
docstrings, the same text on every machine), or on the file given with `--corpus`; each row's note names
the corpus it measured.

- training: `train_tokenizer(spec, texts, folder)` vs the same pipeline (`build_pipeline(spec)`) trained
  directly with `train_from_iterator` on the same texts and saved as tokenizer.json;
- data preparation: `prepare_tokens(corpus, tokenizer, fresh cache)` (read, encode, write the token
  file) vs reading the file and one raw `encode_batch` over its lines, concatenated into a uint16 array:
  what a user without tfkit would write, giving the same tokens. Both report corpus MB/s.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from tfkit.tokenization.corpus import iter_documents
from tfkit.tokenization.shards import prepare_tokens
from tfkit.tokenization.stdlib_corpus import stdlib_documents
from tfkit.tokenization.train import TokenizerSpec, build_pipeline, load_tokenizer, train_tokenizer

from .common import Context, Goal, Row, median, paired_ratio, time_interleaved

GOAL = Goal("<= 1.1x raw time", 1 / 1.1)
BUILTIN_CORPUS = "stdlib:docs:train"  # what the section measures unless --corpus names a file
BUILTIN_CHARS = 1_000_000  # about 1 MB, the size of a small single-file corpus
QUICK_CHARS = 100_000  # --quick: the first 100k characters


def builtin_text(chars: int) -> str:
    """The built-in corpus's documents joined by blank lines, as one text file would hold them, cut to `chars`."""
    return "\n\n".join(stdlib_documents(BUILTIN_CORPUS))[:chars]


def train_pair(spec: TokenizerSpec, texts: list[str], work: Path) -> dict[str, Callable[[], object]]:
    """tfkit's train_tokenizer and the raw train_from_iterator + save, on the same in-memory texts."""

    def tfkit() -> None:
        train_tokenizer(spec, texts, work / f"tfkit-{spec.kind}", show_progress=False, force=True)

    def raw() -> None:
        tok, trainer = build_pipeline(spec)
        tok.train_from_iterator(texts, trainer, length=len(texts))
        tok.save(str(work / f"raw-{spec.kind}.json"))

    return {"tfkit": tfkit, "raw": raw}


def prep_pair(corpus: Path, tokenizer_dir: Path, work: Path, counts: dict) -> dict[str, Callable[[], object]]:
    """tfkit's prepare_tokens into a fresh cache every call (never a cache hit) and the raw encode_batch.

    The raw side encodes the file's lines (keeping their newlines): a natural way to batch one text file,
    and it yields exactly the tokens of tfkit's shards (`counts` records both, plus tfkit's one separator)
    where no line starts with whitespace (tinyshakespeare). On indented text (the built-in docstrings)
    byte-level BPE keeps a newline and the next line's indent in one pre-token that a line cut splits, so the
    raw side makes ~0.3% more tokens: the same work within noise, not the same tokens."""
    tokenizer = load_tokenizer(tokenizer_dir)
    raw_tokenizer = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    calls = iter(range(1_000_000))

    def tfkit() -> None:
        shards = prepare_tokens(str(corpus), tokenizer, work / f"cache-{next(calls)}", show_progress=False)
        counts["tfkit_tokens"] = shards.num_tokens

    def raw() -> None:
        lines = corpus.read_text(encoding="utf-8").splitlines(keepends=True)
        encodings = raw_tokenizer.encode_batch(lines, add_special_tokens=False)
        ids = np.concatenate([np.asarray(e.ids, dtype=np.uint16) for e in encodings])
        counts["raw_tokens"] = len(ids)

    return {"tfkit": tfkit, "raw": raw}


def measure(ctx: Context, case: str, corpus: str, unit_size: float, unit: str, fns: dict[str, Callable[[], object]],
            rounds: int, extra: dict | None = None) -> Row:
    """`unit_size` per call (corpus MB): both sides report a rate, the ratio is the paired time ratio.
    `corpus` names the text measured, in the note: numbers on different corpora do not compare."""
    ctx.log(f"tokenizer: {case}")
    samples = time_interleaved(fns, ctx.device, warmup=0 if ctx.quick else 1, rounds=rounds, calls=1,
                               timer=ctx.timer)
    ratio = paired_ratio(samples["tfkit"], samples["raw"])
    note = f"tfkit takes {100 * (1 / ratio - 1):+.1f}% time, on {corpus}"
    return Row("tokenizer", case, unit, unit_size / median(samples["tfkit"]), unit_size / median(samples["raw"]),
               goal=GOAL, note=note, paired=ratio, extra={"samples_s": samples, "corpus": corpus, **(extra or {})})


def run(ctx: Context) -> list[Row]:
    corpus = ctx.corpus
    work = Path(tempfile.mkdtemp(prefix="tfkit-bench-tok-"))
    try:
        if corpus is not None:
            name = corpus.name
            text = corpus.read_text(encoding="utf-8")[:QUICK_CHARS] if ctx.quick else None
        else:  # the built-in corpus: the same text on every machine, nothing to download
            name = BUILTIN_CORPUS
            text = builtin_text(QUICK_CHARS if ctx.quick else BUILTIN_CHARS)
            ctx.log(f"tokenizer: {len(text) / 1e6:.2f} MB of the built-in {name} corpus (--corpus FILE for another)")
        if text is not None:  # a slice or the built-in text, as a file: prepare_tokens reads a path
            corpus = work / "corpus.txt"
            corpus.write_text(text, encoding="utf-8")
        texts = list(iter_documents(str(corpus)))
        mb = sum(len(t.encode()) for t in texts) / 1e6
        kinds = ("bpe",) if ctx.quick else ("bpe", "wordpiece")
        vocab = 1024 if ctx.quick else 8192
        rounds = 2 if ctx.quick else 4
        rows = []
        for kind in kinds:
            spec = TokenizerSpec(kind=kind, vocab_size=vocab)
            rows.append(measure(ctx, f"train {kind} {vocab} ({mb:.2f} MB) vs train_from_iterator", name, mb,
                                "MB/s", train_pair(spec, texts, work), rounds))
        counts: dict = {}
        rows.append(measure(ctx, f"prepare_tokens bpe ({mb:.2f} MB) vs raw encode_batch of its lines", name, mb,
                            "MB/s", prep_pair(corpus, work / "tfkit-bpe", work, counts), rounds, counts))
        return rows
    finally:
        shutil.rmtree(work, ignore_errors=True)
