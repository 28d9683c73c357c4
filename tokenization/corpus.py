"""Corpus readers: one spec string (file, glob, folder, JSONL, Parquet, `stdlib:...`) to a stream of text.

A *spec* is what users type after `--corpus` or put in a recipe:

- a file: `.txt`/`.md` (one document per file), `.jsonl` (one document per line, `text_field`),
  `.json` (a JSON array of strings or objects with `text_field`, or JSON lines), `.tsv` (one document per
  line, its columns joined by newlines, so a `source<TAB>target` file trains a tokenizer on both sides);
  `.txt.gz`/`.txt.zst` and `.jsonl.gz`/`.jsonl.zst` (the same, compressed); `.parquet` and `.arrow`
  (one document per row, the `text_field` column); see `formats` for those;
- a folder written by HuggingFace `datasets`' `save_to_disk` (`state.json` + `dataset_info.json`
  beside `data-*.arrow`): its Arrow shards, in the order state.json lists them;
- a glob (`data/*.txt`, `**` allowed) or a folder (searched recursively for those suffixes), both sorted
  so the order, and therefore every cache key and split, is deterministic. Inside a folder, files and
  folders whose name starts with "." are skipped, as git and most tools do: `.git/`, `.cache/`, editor
  swap files and the like are tool state, not corpus text (a glob skips them too unless it spells the
  dot, and a hidden file or folder named directly is read);
- `stdlib:code` / `stdlib:docs`, optionally `:train` / `:valid` (see `stdlib_corpus`).

Large plain-text files are never read whole: they stream in ~1 MB pieces cut at line boundaries. A
piece of the same file is *not* a new document, which matters for causal-LM packing (no EOS between
them), so the low-level `iter_pieces` yields `(text, is_new_document)`; `iter_documents` yields the text
only, for consumers that do not care (tokenizer training).

Text files are read by `readers` (one reader per format, shared with labelled data, pairs and task files):
invalid UTF-8 is decoded with U+FFFD replacement, counted, and reported as ONE warning per pass naming the
first position (a few bad bytes in a web scrape should not stop a run). Everything else a user can get
wrong is a one-line `DataError` naming the file (and line) at fault.
"""

from __future__ import annotations

import codecs
import glob
import hashlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path

from ..errors import ConfigError, DataError
from ..jsonfile import kind_of, parse_json
from .formats import (DATASET_FILES, dataset_dict_error, dataset_files, decoded_size, read_arrow,
                      read_parquet)
from .readers import ReadStats, check_head, delimited_rows, jsonl_records, read_text, text_chunks
from .stdlib_corpus import iter_stdlib_documents, stdlib_documents, stdlib_fingerprint

COMPRESSED = (".txt.gz", ".txt.zst", ".jsonl.gz", ".jsonl.zst")
SUFFIXES = (".txt", ".md", ".jsonl", ".json", ".tsv", ".parquet", ".arrow", *COMPRESSED)
FIELD_SUFFIXES = (".json", ".jsonl", ".jsonl.gz", ".jsonl.zst", ".parquet", ".arrow")  # records with fields
CHUNK_BYTES = 1 << 20  # piece size for streaming large plain-text files


class CorpusWarning(UserWarning):
    """Something about the corpus the user should know, though the run goes on (evaluate: tokens cut)."""


def suffix(path: Path | str) -> str:
    """The corpus kind of a file name: its last suffix, or its last two for compressed text (`.jsonl.gz`)."""
    name = str(path).lower()
    return next((s for s in COMPRESSED if name.endswith(s)), Path(name).suffix)


def resolve_files(spec: str) -> list[Path]:
    """The sorted files a path/glob/folder spec stands for; DataError if it names nothing usable."""
    if not spec.strip():  # Path("") is "." : an empty option would read the working folder
        raise DataError(f"corpus {spec!r}: empty path, expected a file, folder, glob or stdlib:docs")
    path = Path(spec).expanduser()
    if path.is_file():
        if suffix(path) in (".gz", ".zst"):  # compressed what? Read as text, it would be noise
            raise DataError(f"corpus {spec}: name a compressed corpus for what it holds: "
                            f"{', '.join(COMPRESSED)}")
        return [path]
    if path.is_dir():
        files = _folder_files(path)
        if not files:
            raise DataError(f"corpus folder {spec}: no {'/'.join(SUFFIXES)} files inside "
                            "(hidden files and folders, named .*, are skipped)")
        return files
    if glob.has_magic(spec):
        matches = sorted(Path(p) for p in glob.glob(os.path.expanduser(spec), recursive=True))
        files: list[Path] = []
        for m in matches:
            files.extend([m] if m.is_file() else resolve_files(str(m)) if m.is_dir() else [])
        if not files:
            raise DataError(f"corpus glob {spec!r} matches no files")
        return files
    if path.exists():
        raise DataError(f"corpus {spec}: {_special_kind(path)}, not a regular file; a corpus is read more than once "
                        "(its size, the tokenizer, the tokens): save the stream to a file first")
    raise DataError(f"corpus {spec}: no such file or folder")


def _special_kind(path: Path) -> str:
    """What a path that is neither a file nor a folder is: a FIFO (named pipe, `<(cmd)`), a socket, a device."""
    mode = path.stat().st_mode
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "not a file"


def corpus_files(spec: str) -> list[str] | None:
    """The files a folder or glob corpus reads, in reading order (relative to the folder), for the record
    of what a run or a tokenizer was trained on; None for a single file or stdlib (its name says it all)."""
    path = Path(spec).expanduser()
    if spec.startswith("stdlib:") or path.is_file():
        return None
    files = resolve_files(spec)
    return [str(p.relative_to(path)) if path.is_dir() else str(p) for p in files]


def listing(files: list[str], limit: int = 20) -> str:
    """`N files: a.txt, b/c.txt, ...` for a console line (the first `limit` names)."""
    more = f", ... ({len(files) - limit:,} more)" if len(files) > limit else ""
    return f"{len(files):,} file{'s' if len(files) != 1 else ''}: {', '.join(files[:limit])}{more}"


def check_text_field(spec: str, text_field: str) -> None:
    """Refuse a non-default `text_field` for a corpus with no JSON/JSONL/Parquet/Arrow files: only those have fields,
    so the option would be ignored, and the user who named a key expects it to pick the text."""
    if text_field == "text":
        return
    if spec.startswith("stdlib:") or not any(suffix(p) in FIELD_SUFFIXES for p in resolve_files(spec)):
        raise ConfigError(f"text_field {text_field!r}: corpus {spec} has no .json/.jsonl files, the only ones with "
                          "fields along with .parquet/.arrow and compressed .jsonl (leave it out for plain text)",
                          params=("text_field",))


def _folder_files(folder: Path) -> list[Path]:
    """The corpus files under `folder`, sorted, without descending into hidden (".") folders at all: a
    `.git` or `.cache` can hold many thousands of files, and their JSON is not text (module doc). A
    `datasets` folder inside stands for its Arrow shards (its JSON files describe them, they are not text)."""
    files = []
    for root, dirs, names in os.walk(folder):  # like rglob, does not follow symlinked folders
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        if "dataset_dict.json" in names:
            raise dataset_dict_error(Path(root))
        if all(n in names for n in DATASET_FILES):
            files += dataset_files(Path(root))  # data-00000-of-00004.arrow, ...: sorted is state.json's order
            dirs[:] = []
            continue
        files += [Path(root, n) for n in names if not n.startswith(".") and suffix(n) in SUFFIXES]
    return sorted(p for p in files if p.is_file())


def _json_text(value: object, field_name: str, where: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and field_name in value:
        text = value[field_name]
        if isinstance(text, str):
            return text
        raise DataError(f"{where}: field {field_name!r} is {type(text).__name__}, expected a string")
    if isinstance(value, dict):
        raise DataError(f"{where}: no {field_name!r} field (name the key holding the text with text_field, "
                        "or data.text_field in a recipe)", params=("text_field",))
    raise DataError(f"{where}: {kind_of(value)}, expected a text or an object with a {field_name!r} field")


def _read_jsonl(path: Path, text_field: str, stats: ReadStats) -> Iterator[str]:
    for where, record in jsonl_records(path, stats):
        yield _json_text(record, text_field, where)


def _read_json(path: Path, text_field: str, stats: ReadStats) -> Iterator[str]:
    """A JSON array of records or one pretty-printed record (read whole: JSON cannot be streamed without a
    parser), or JSON lines: a file whose first line is a whole JSON value."""
    check_head(path)  # before a first line is looked for: a binary file may have none
    with open(path, "rb") as f:
        first = f.readline().strip().removeprefix(codecs.BOM_UTF8)
    if not first.startswith(b"[") and _is_json_value(first):
        yield from _read_jsonl(path, text_field, stats)
        return
    records = parse_json(read_text(path, stats), path, max_depth=None)
    if isinstance(records, dict):  # one record spread over lines (e.g. a dataset_info.json)
        yield _json_text(records, text_field, str(path))
        return
    if not isinstance(records, list):
        raise DataError(f"{path}: {kind_of(records)}, expected a JSON array of texts or records, one record, "
                        "or JSON lines")
    for i, record in enumerate(records):
        yield _json_text(record, text_field, f"{path}: item {i}")


def _is_json_value(line: bytes) -> bool:
    try:
        parse_json(line, "", max_depth=None)
    except DataError:
        return False
    return True


def _read_tsv(path: Path, stats: ReadStats) -> Iterator[str]:
    """One document per line, its columns joined by newlines (a `source<TAB>target` file trains on both)."""
    for _, values in delimited_rows(path, ".tsv", stats):
        yield "\n".join(values)


def _file_pieces(path: Path, text_field: str, stats: ReadStats, chunk_bytes: int):
    """(text, is_new_document) for one file: chunks of a text file continue their document."""
    kind = suffix(path)  # text files are checked to be UTF-8 text by `readers` before a line is read
    if kind in (".jsonl", ".jsonl.gz", ".jsonl.zst"):
        return ((t, True) for t in _read_jsonl(path, text_field, stats))
    if kind == ".json":
        return ((t, True) for t in _read_json(path, text_field, stats))
    if kind == ".tsv":
        return ((t, True) for t in _read_tsv(path, stats))
    if kind == ".parquet":
        return ((t, True) for t in read_parquet(path, text_field, stats))
    if kind == ".arrow":
        return ((t, True) for t in read_arrow(path, text_field, stats))
    return ((t, i == 0) for i, t in enumerate(text_chunks(path, stats, chunk_bytes)))


def iter_pieces(
    spec: str,
    *,
    text_field: str = "text",
    chunk_bytes: int = CHUNK_BYTES,
    stats: ReadStats | None = None,
) -> Iterator[tuple[str, bool]]:
    """Stream `(text, is_new_document)`; pieces of one large text file have `is_new_document=False`.

    Whitespace-only documents are skipped. Raises DataError for a missing path, an empty glob, bad JSON,
    a missing field, or a corpus with no text at all (checked at the end, so nothing is read twice).
    """
    stats = stats if stats is not None else ReadStats()
    if spec.startswith("stdlib:"):
        for text in iter_stdlib_documents(spec):  # a reader that stops early parses only what it read
            stats.documents += 1
            stats.bytes_read += len(text)
            stats.file_bytes += len(text)
            yield text, True
        if not stats.documents:
            raise DataError(f"corpus {spec} is empty")
        return
    files = resolve_files(spec)
    for path in files:
        stats.files += 1
        started = False  # a document starts at its first non-blank piece
        for text, new_doc in _file_pieces(path, text_field, stats, chunk_bytes):
            if new_doc:
                started = False
            if not text.strip() and not started:
                continue
            if not started:
                stats.documents += 1
            yield text, not started
            started = True
    stats.repairs.warn(f"corpus {spec}")
    if not stats.documents:
        raise DataError(f"corpus {spec} is empty: {len(files)} file(s) but no text")


def iter_documents(spec: str, *, text_field: str = "text", stats: ReadStats | None = None) -> Iterator[str]:
    """Stream the corpus as text units: each record, each small file, or each ~1 MB piece of a big file.

    Use `iter_pieces` when document boundaries matter (token packing); here they do not.
    """
    for text, _ in iter_pieces(spec, text_field=text_field, stats=stats):
        yield text


def corpus_size(spec: str) -> int:
    """Approximate size in bytes (file sizes, compressed as they are, or characters for stdlib): for
    progress bars only, against `ReadStats.file_bytes`."""
    if spec.startswith("stdlib:"):
        return sum(len(t) for t in stdlib_documents(spec))
    return sum(p.stat().st_size for p in resolve_files(spec))


def text_size(spec: str, text_field: str = "text") -> int:
    """Approximate size of the corpus's text once decoded (bytes, or characters for stdlib): for progress
    bars that count characters, such as tokenizer training (`formats.decoded_size`)."""
    if spec.startswith("stdlib:"):
        return corpus_size(spec)
    return sum(decoded_size(p, text_field) for p in resolve_files(spec))


def corpus_fingerprint(spec: str, text_field: str = "text") -> str:
    """Cheap cache key: resolved paths, sizes and mtimes (Python version for stdlib), no reading."""
    h = hashlib.sha256(f"text_field={text_field}".encode())
    if spec.startswith("stdlib:"):
        h.update(stdlib_fingerprint(spec).encode())
    else:
        for path in resolve_files(spec):
            st = path.stat()
            h.update(f"|{path.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode())
    return h.hexdigest()[:16]
