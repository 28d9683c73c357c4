"""Seq2seq pairs (source, target) from every record format a corpus may come in.

A translation or summarisation corpus is a list of pairs: TSV lines `source<TAB>target`, or records with
a source and a target field (`data.source_field`, `data.target_field`) in JSON lines (plain, `.gz`,
`.zst`), Parquet files or Arrow / `datasets` folders, read with the same readers as documents are
(`corpus`, `formats`). Plain text given to a seq2seq recipe is not pairs: it becomes denoising pairs.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from ..errors import DataError
from ..jsonfile import parse_json
from .corpus import CorpusStats, resolve_files, suffix
from .formats import need, open_bytes, read_rows

JSONL_KINDS = (".jsonl", ".jsonl.gz", ".jsonl.zst")
COLUMN_KINDS = (".parquet", ".arrow")


def _compression(path: Path) -> str | None:
    kind = suffix(path)
    return kind[kind.rindex("."):] if kind.endswith((".gz", ".zst")) else None


def _jsonl_records(path: Path) -> Iterator[tuple[str, object]]:
    """(where, record) for each non-blank line of a JSON-lines file, compressed or not."""
    with open_bytes(path, _compression(path), CorpusStats()) as f:
        for lineno, raw in enumerate(f, 1):
            line = raw.decode("utf-8", errors="replace").strip()
            if not line:
                continue
            yield f"{path}:{lineno}", parse_json(line, f"{path}:{lineno}", max_depth=None)


def _columns(path: Path) -> list[str]:
    """The column names of a Parquet or Arrow file (its schema only)."""
    pa = need("pyarrow", path, "reading Arrow")
    try:
        if suffix(path) == ".parquet":
            return list(need("pyarrow.parquet", path, "reading Parquet").read_schema(path).names)
        with pa.OSFile(str(path)) as source:
            is_file_format = source.read(6) == b"ARROW1"
            source.seek(0)
            reader = pa.ipc.open_file(source) if is_file_format else pa.ipc.open_stream(source)
            return list(reader.schema.names)
    except (pa.ArrowException, OSError):
        return []  # not pairs; the document reader reports the damage, naming the file


def is_pair_data(spec: str, source_field: str) -> bool:
    """Seq2seq data given as pairs (TSV, or records with `source_field`) rather than plain text, which
    becomes denoising pairs. Decided by the first file that has records."""
    if spec.startswith("stdlib:"):
        return False
    files = resolve_files(spec)
    if any(suffix(p) == ".tsv" for p in files):
        return True
    for path in files:
        kind = suffix(path)
        if kind in JSONL_KINDS:
            first = next(_jsonl_records(path), (None, None))[1]
            return isinstance(first, dict) and source_field in first
        if kind in COLUMN_KINDS:
            return source_field in _columns(path)
    return False


def read_pairs(spec: str, source_field: str = "source", target_field: str = "target") -> list[tuple[str, str]]:
    """(source, target) pairs from TSV, JSON-lines, Parquet or Arrow files (a path, glob or folder)."""
    pairs: list[tuple[str, str]] = []
    for path in resolve_files(spec):
        kind = suffix(path)
        if kind == ".tsv":
            pairs += _tsv_pairs(path)
        elif kind in COLUMN_KINDS:
            for row, (source, target) in enumerate(read_rows(path, [source_field, target_field], CorpusStats())):
                if source is None or target is None:
                    field = source_field if source is None else target_field
                    raise DataError(f"{path}: row {row}: {field!r} is null, expected a string")
                pairs.append((source, target))
        else:
            for where, record in _jsonl_records(path):
                missing = [k for k in (source_field, target_field)
                           if not isinstance(record, dict) or not isinstance(record.get(k), str)]
                if missing:
                    raise DataError(f"{where}: no string field {missing[0]!r} (set source_field/target_field)")
                pairs.append((record[source_field], record[target_field]))
    if not pairs:
        raise DataError(f"seq2seq data {spec}: no pairs found")
    return pairs


def _tsv_pairs(path: Path) -> list[tuple[str, str]]:
    pairs = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            cols = line.rstrip("\r\n").split("\t")
            if len(cols) != 2:
                raise DataError(f"{path}:{lineno}: expected 2 tab-separated columns (source, target), got {len(cols)}")
            pairs.append((cols[0], cols[1]))
    return pairs
