"""Token shards: a corpus tokenized once into a flat memory-mapped token file, reused by every run.

Layout of a cache folder `<cache_dir>/tokens-<key>/`:

- `tokens.bin`: every document's ids followed by one separator token (EOS, or [SEP] for tokenizers
  without EOS), all documents back to back: `doc0 SEP doc1 SEP ...`. Tokenizers whose documents begin
  with a BOS of their own (`TfkitTokenizer.doc_start_id`: Llama's `<s>`) get `BOS doc0 SEP BOS doc1 SEP`,
  the BOS counted as the document's first token. uint16 when every id fits
  (vocab <= 65,536: half the disk and page cache of uint32), else uint32.
- `doc_starts.bin`: int64 offset of each document's first token, plus a final entry = num_tokens, so
  document d is `tokens[doc_starts[d] : doc_starts[d + 1] - 1]` (without its separator).
- `meta.json`: counts, dtype, separator, fingerprints, throughput; written last.

`key` hashes the tokenizer fingerprint (sha256 of tokenizer.json) and the corpus fingerprint (paths,
sizes, mtimes), so a changed corpus or tokenizer gets a new cache and a second call is just a memmap.
The folder is filled under a temporary name and renamed into place whole (`files.staged_folder`), so a
killed run never leaves a cache that loads. Pieces of one large text file are concatenated without
separators (they are one document).

The corpus is read, decompressed and parsed one batch ahead by a thread while `encode_batch` (Rust,
which releases the GIL) spreads the current batch over every core, so reading costs no encoding time.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import time
from collections.abc import Generator, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import TypeVar

import numpy as np

from ..errors import DataError
from ..files import staged_folder
from ..jsonfile import read_json
from ..progress import progress_bar
from .corpus import corpus_fingerprint, corpus_size, iter_pieces
from .holdout import complement, heldout_chunks
from .readers import ReadStats
from .spans import TokenSpans
from .train import TfkitTokenizer

log = logging.getLogger("tfkit.tokenization")
FORMAT_VERSION = 3  # 2: documents may begin with the tokenizer's BOS; 3: long texts cut into ~2K-char parts
BATCH_CHARS = 4 << 20  # characters handed to one encode_batch call (bounded memory)
SPLIT_CHARS = 2 << 10  # long texts are encoded in parts of about this size (see _sub_pieces)
_SAFE_CUT = re.compile(r"(?<=\S)\n(?=\S)")  # a newline between two non-space characters

T = TypeVar("T")


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every id (0 .. vocab_size-1) fits, else uint32."""
    return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)


@dataclass
class TokenShards:
    """A memory-mapped token stream and its document boundaries (see the module docstring)."""

    tokens: np.ndarray | TokenSpans  # (N,) np.memmap of uint16/uint32 ids (TokenSpans: a split's part)
    doc_starts: np.ndarray  # (D + 1,) int64, last entry == N
    vocab_size: int
    separator_id: int | None  # token appended after each document (None: nothing appended)
    meta: dict
    from_cache: bool = False  # True when this call found the shards already built

    @property
    def doc_start_id(self) -> int | None:
        """The BOS each document begins with, or None (see the module docstring)."""
        return self.meta.get("doc_start_id")

    @property
    def num_tokens(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def num_documents(self) -> int:
        return int(self.doc_starts.shape[0] - 1)

    @property
    def dtype(self) -> np.dtype:
        return self.tokens.dtype

    def split(self, valid_fraction: float, min_chunk: int = 256) -> tuple["TokenShards", "TokenShards"]:
        """(train, valid) for recipes without a valid corpus: `valid_fraction` of the tokens held out as
        seeded chunks of at least `min_chunk` tokens where the corpus allows, spread through it (holdout.py
        says why not the tail), the training data the chunks between them; both views of the one memmap."""
        held = heldout_chunks(self.num_tokens, valid_fraction, min_chunk)
        return self._view(complement(held, self.num_tokens)), self._view(held)

    def _view(self, ranges: list[tuple[int, int]]) -> "TokenShards":
        """The shards restricted to `ranges` of tokens, in order; every range starts a document (a chunk
        may begin mid-document), and so does every document start inside one."""
        tokens = TokenSpans(self.tokens, ranges)
        starts = [np.asarray(self.doc_starts[(self.doc_starts > lo) & (self.doc_starts < hi)]) - lo + at
                  for (lo, hi), at in zip(tokens.ranges, tokens.offsets[:-1])]
        firsts = tokens.offsets[:-1]
        doc_starts = np.unique(np.concatenate([firsts, *starts, [len(tokens)]]).astype(np.int64))
        return TokenShards(tokens, doc_starts, self.vocab_size, self.separator_id, self.meta, self.from_cache)


def _batches(spec: str, text_field: str, stats: ReadStats) -> Generator[tuple[list[str], list[bool]], None, None]:
    """The corpus as batches of about BATCH_CHARS characters: (pieces, whether each starts a document)."""
    texts: list[str] = []
    new_doc: list[bool] = []
    chars = 0  # counted as pieces arrive: summing the batch per piece is quadratic in its length
    for text, new in iter_pieces(spec, text_field=text_field, stats=stats):
        subs = _sub_pieces(text)
        texts += subs
        new_doc += [new] + [False] * (len(subs) - 1)
        chars += len(text)
        if chars >= BATCH_CHARS:
            yield texts, new_doc
            texts, new_doc, chars = [], [], 0
    if texts:
        yield texts, new_doc


def _read_ahead(items: Generator[T, None, None]) -> Iterator[T]:
    """`items`, each made on a background thread while the caller works on the one before: the next batch
    is read, decompressed and parsed while `encode_batch` (which releases the GIL) keeps every core on this
    one. What reading raises (a DataError naming the file) is raised here."""
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tfkit-read-ahead")
    try:
        ahead = pool.submit(next, items, None)
        while (item := ahead.result()) is not None:
            ahead = pool.submit(next, items, None)
            yield item
    finally:
        pool.shutdown(wait=True)  # the batch being read is finished first, then its file closed
        items.close()


def _sub_pieces(text: str) -> list[str]:
    """Cut a long text into parts of about SPLIT_CHARS characters (one document still: joined by the caller).

    `tokenizers` encodes long inputs slower per character (a 64K-character part costs 1.45x the CPU time
    of the same text in 2K parts), and many parts spread over every core. The cut follows a newline between
    two non-space characters, where byte-level BPE makes the same pre-tokens with or without it (a cut in
    "\n    " would split one); with none for 8 x SPLIT_CHARS, any newline; without newlines, no cut.
    """
    if len(text) <= SPLIT_CHARS:
        return [text]
    out, start = [], 0
    while len(text) - start > SPLIT_CHARS:
        lo = start + SPLIT_CHARS
        cut = _SAFE_CUT.search(text, lo, lo + 8 * SPLIT_CHARS)
        end = cut.end() if cut else text.find("\n", lo) + 1
        if end <= 0:
            break
        out.append(text[start:end])
        start = end
    if start < len(text):
        out.append(text[start:])
    return out


class _Writer:
    """Appends encoded batches to the token file and records document starts; never holds the corpus."""

    def __init__(self, folder: Path, dtype: np.dtype, separator: int | None, doc_start: int | None):
        self.tokens = open(folder / "tokens.bin", "wb")
        self.dtype, self.separator, self.doc_start = dtype, separator, doc_start
        self.starts: list[int] = []
        self.count = 0

    def write(self, tokenizer: TfkitTokenizer, texts: list[str], new_doc: list[bool]) -> None:
        ids = tokenizer.encode_batch(texts)
        parts = []
        at = self.count  # where the next token goes (kept as we go: summing `parts` per piece is quadratic)
        for piece_ids, new in zip(ids, new_doc):
            if new:
                if self.starts and self.separator is not None:
                    parts.append([self.separator])
                    at += 1
                self.starts.append(at)
                if self.doc_start is not None:
                    parts.append([self.doc_start])
                    at += 1
            parts.append(piece_ids)
            at += len(piece_ids)
        flat = np.fromiter(chain.from_iterable(parts), self.dtype, count=at - self.count)
        self.tokens.write(flat.tobytes())
        self.count += len(flat)

    def close(self) -> None:
        if self.starts and self.separator is not None:
            self.tokens.write(np.array([self.separator], dtype=self.dtype).tobytes())
            self.count += 1
        self.tokens.close()


def cache_problem(folder: Path) -> str | None:
    """What is wrong with a token cache folder (meta.json unreadable or of the wrong shape, tokens.bin or
    doc_starts.bin missing or of another size than meta.json records), None when it can be opened."""
    try:
        meta = read_json(folder / "meta.json", expect=None)
    except DataError as exc:
        return f"meta.json is not readable JSON ({exc})"
    types = {"dtype": str, "num_tokens": int, "vocab_size": int, "num_documents": int}
    if not isinstance(meta, dict) or any(not isinstance(meta.get(k), t) or isinstance(meta.get(k), bool)
                                         for k, t in types.items()):
        return "meta.json does not hold the dtype, num_tokens, vocab_size and num_documents tfkit writes"
    try:
        dtype = np.dtype(meta["dtype"])
    except TypeError:
        return f"meta.json names an unknown dtype {meta['dtype']!r}"
    if meta["dtype"] not in ("uint16", "uint32") or meta["num_tokens"] < 0 or meta["num_documents"] < 0:
        return "meta.json holds impossible values"
    sizes = {"tokens.bin": meta["num_tokens"] * dtype.itemsize, "doc_starts.bin": (meta["num_documents"] + 1) * 8}
    for name, size in sizes.items():
        path = folder / name
        if not path.is_file() or path.stat().st_size != size:
            found = path.stat().st_size if path.is_file() else "missing"
            return f"{name} is {found} bytes, meta.json says {size} (truncated or damaged)"
    return None


def _open(folder: Path, from_cache: bool) -> TokenShards:
    meta = read_json(folder / "meta.json")  # checked by cache_problem
    dtype = np.dtype(meta["dtype"])
    tokens = np.memmap(folder / "tokens.bin", dtype=dtype, mode="r", shape=(meta["num_tokens"],))
    starts = np.memmap(folder / "doc_starts.bin", dtype=np.int64, mode="r")  # mapped too: memory flat in corpus size
    return TokenShards(tokens, starts, meta["vocab_size"], meta["separator_id"], meta, from_cache)


def prepare_tokens(
    spec: str,
    tokenizer: TfkitTokenizer,
    cache_dir: str | Path,
    *,
    text_field: str = "text",
    show_progress: bool = True,
) -> TokenShards:
    """Tokenize corpus `spec` once (multi-core `encode_batch`), or reopen the cached result."""
    corpus_key = corpus_fingerprint(spec, text_field)
    key = hashlib.sha256(f"{tokenizer.fingerprint()}|{corpus_key}|v{FORMAT_VERSION}".encode()).hexdigest()[:16]
    folder = Path(cache_dir) / f"tokens-{key}"
    damaged = (folder / "meta.json").is_file() and cache_problem(folder)
    if (folder / "meta.json").is_file() and not damaged:
        return _open(folder, from_cache=True)
    if damaged:  # a cache is derived data: a damaged one is tokenized again, not a reason to stop
        log.warning("token cache %s is damaged (%s): tokenizing %s again", folder, damaged, spec)
    # Another process may publish the same cache first: theirs is then kept, and read below. A folder
    # already there without meta.json was not written by tfkit's staging (which publishes whole
    # folders only): damaged, so it is replaced.
    with staged_folder(folder, keep_existing=not folder.exists()) as tmp:
        separator, doc_start = tokenizer.separator_id, tokenizer.doc_start_id
        dtype = token_dtype(tokenizer.vocab_size)
        writer, stats = _Writer(tmp, dtype, separator, doc_start), ReadStats()
        start = time.perf_counter()
        # MB/s and an ETA against the size on disk (compressed files by their compressed size); the
        # built-in corpus has no size without reading it all, so it gets a count only.
        total = None if spec.startswith("stdlib:") else corpus_size(spec)
        with closing(_read_ahead(_batches(spec, text_field, stats))) as batches, \
                progress_bar(desc=f"tokenize {spec}", total=total, unit="B", unit_scale=True,
                             enabled=show_progress) as bar:
            for texts, new_doc in batches:
                writer.write(tokenizer, texts, new_doc)
                bar.update(stats.file_bytes - bar.n)
                bar.set_postfix(tokens=f"{writer.count:,}")
            writer.close()
        seconds = time.perf_counter() - start
        np.array(writer.starts + [writer.count], dtype=np.int64).tofile(tmp / "doc_starts.bin")
        meta = {
            "format_version": FORMAT_VERSION,
            "corpus": spec,
            "text_field": text_field,
            "corpus_fingerprint": corpus_key,
            "tokenizer_fingerprint": tokenizer.fingerprint(),
            "tokenizer_kind": tokenizer.kind,
            "vocab_size": tokenizer.vocab_size,
            "dtype": dtype.name,
            "separator_id": separator,
            "doc_start_id": doc_start,
            "num_tokens": writer.count,
            "num_documents": len(writer.starts),
            "bytes": stats.bytes_read,
            "seconds": round(seconds, 3),
            "mb_per_s": round(stats.bytes_read / 1e6 / max(seconds, 1e-9), 3),
            "replaced_bytes": stats.repairs.count,
        }
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    log.info("tokenized %s: %s tokens, %s documents, %.1f MB/s", spec, f"{writer.count:,}",
             f"{len(writer.starts):,}", meta["mb_per_s"])
    return _open(folder, from_cache=False)
