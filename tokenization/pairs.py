"""Seq2seq pairs (source, target) from every record format a corpus may come in.

A translation or summarisation corpus is a list of pairs: TSV lines `source<TAB>target`, or records with
a source and a target field (`data.source_field`, `data.target_field`) in JSON lines (plain, `.gz`,
`.zst`), Parquet files or Arrow / `datasets` folders, read with the same readers as documents are
(`readers`, `formats`): invalid UTF-8 is replaced and said in one warning naming the first line. Plain
text given to a seq2seq recipe is not pairs: it becomes denoising pairs.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import DataError
from .corpus import resolve_files, suffix
from .formats import need, read_rows
from .readers import ReadStats, delimited_rows, jsonl_records

JSONL_KINDS = (".jsonl", ".jsonl.gz", ".jsonl.zst")
COLUMN_KINDS = (".parquet", ".arrow")


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
            first = next(jsonl_records(path, ReadStats()), (None, None))[1]  # its repairs: said by read_pairs
            return isinstance(first, dict) and source_field in first
        if kind in COLUMN_KINDS:
            return source_field in _columns(path)
    return False


def read_pairs(spec: str, source_field: str = "source", target_field: str = "target") -> list[tuple[str, str]]:
    """(source, target) pairs from TSV, JSON-lines, Parquet or Arrow files (a path, glob or folder)."""
    pairs: list[tuple[str, str]] = []
    stats = ReadStats()
    for path in resolve_files(spec):
        kind = suffix(path)
        if kind == ".tsv":
            pairs += _tsv_pairs(path, stats)
        elif kind in COLUMN_KINDS:
            for row, (source, target) in enumerate(read_rows(path, [source_field, target_field], stats)):
                if source is None or target is None:
                    field = source_field if source is None else target_field
                    raise DataError(f"{path}: row {row}: {field!r} is null, expected a string")
                pairs.append((source, target))
        else:
            for where, record in jsonl_records(path, stats):
                missing = [k for k in (source_field, target_field)
                           if not isinstance(record, dict) or not isinstance(record.get(k), str)]
                if missing:
                    raise DataError(f"{where}: no string field {missing[0]!r} (set source_field/target_field)")
                pairs.append((record[source_field], record[target_field]))
    if not pairs:
        raise DataError(f"seq2seq data {spec}: no pairs found")
    stats.repairs.warn(f"seq2seq data {spec}")
    return pairs


def _tsv_pairs(path: Path, stats: ReadStats) -> list[tuple[str, str]]:
    pairs = []
    for line, cols in delimited_rows(path, ".tsv", stats):
        if not "".join(cols).strip():  # a blank line
            continue
        if len(cols) != 2:
            raise DataError(f"{path}:{line}: expected 2 tab-separated columns (source, target), got {len(cols)}")
        pairs.append((cols[0], cols[1]))
    return pairs
