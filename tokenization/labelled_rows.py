"""The rows of a labelled-data file, whatever its format: CSV, TSV, JSON lines or Parquet, text ones plain or
compressed (`.csv.gz`, `.tsv.zst`, `.jsonl.gz`, ...), read by the readers corpora use (`readers`).

Every row comes as a `Row`: where it is (`train.csv:12`, `train.parquet: row 7`, for messages), its cells
in file order and the column names when the file has them (a header, a record's keys, a schema), so the
caller picks columns by name or by position the same way in every format (`labelled.py`).

- CSV is read with Python's csv module (quoted fields may hold commas and newlines, a cell may be as long
  as a document); TSV without quoting, as the GLUE loaders read it: a tab-separated file has no quoting
  convention, and a sentence's quotes are part of the sentence. A leading byte-order mark (Excel's "CSV
  UTF-8") is dropped. `header=False` reads the first line as data; its columns then have positions only.
- JSON lines: one object per line (`readers.jsonl_records`), its keys the column names.
- invalid UTF-8 in a text file is replaced with U+FFFD, and the read gives one warning naming the file,
  the count and the first line and byte (`encoding`); a class name holding one is refused (`labelled`).
- Parquet: every column of each record batch (labels are often integers, so any type comes through;
  `labelled.py` says what a cell must be).
Every problem is a one-line DataError naming the file and the line or row.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import DataError
from .formats import BATCH_ROWS, need, reason
from .readers import ReadStats, delimited_rows, jsonl_records, warned

TEXT_KINDS = (".csv", ".tsv", ".jsonl")
COMPRESSIONS = (".gz", ".zst")
SUFFIXES = (*TEXT_KINDS, *(k + c for k in TEXT_KINDS for c in COMPRESSIONS), ".parquet")


@dataclass(frozen=True)
class Row:
    where: str  # "train.csv:12" or "train.parquet: row 7": how a message names this row
    values: list[Any]  # the cells, in file order
    names: list[str] | None  # the column names, None for a file read without a header


def file_kind(path: Path) -> str:
    """The kind of a labelled-data file from its name, compressed or not: ".csv" for `train.csv.gz`."""
    name = path.name.lower()
    for kind in (".parquet", *TEXT_KINDS):
        for compression in ("", *(COMPRESSIONS if kind != ".parquet" else ())):
            if name.endswith(kind + compression):
                return kind
    raise DataError(f"labelled data {path}: expected a {', '.join(SUFFIXES)} file")


def read_rows(path: Path, header: bool = True, what: str = "labelled data") -> Iterator[Row]:
    """The rows of `path`; `header` says whether a CSV / TSV file's first line names its columns; `what`
    the data is, for the warning about invalid UTF-8 (`chat data`)."""
    if not path.is_file():
        raise DataError(f"{what} {path}: no such file")
    kind = file_kind(path)
    if kind == ".parquet":
        return _parquet_rows(path)
    stats = ReadStats()
    rows = _jsonl_rows(path, stats) if kind == ".jsonl" else _delimited_rows(path, kind, header, stats)
    return warned(rows, stats, f"{what} {path}")


def _delimited_rows(path: Path, kind: str, header: bool, stats: ReadStats) -> Iterator[Row]:
    names = None
    for line, values in delimited_rows(path, kind, stats):
        if not values or values == [""]:  # a blank line is no row
            continue
        if header and names is None:
            names = [name.strip() for name in values]
            continue
        yield Row(f"{path}:{line}", values, names)


def _jsonl_rows(path: Path, stats: ReadStats) -> Iterator[Row]:
    for where, record in jsonl_records(path, stats):
        if not isinstance(record, dict):
            raise DataError(f"{where}: expected a JSON object with named fields, got {type(record).__name__}")
        yield Row(where, list(record.values()), list(record.keys()))


def _parquet_rows(path: Path) -> Iterator[Row]:
    pq = need("pyarrow.parquet", path, "reading Parquet")
    import pyarrow as pa

    try:
        shard = pq.ParquetFile(path)  # reads the footer only
    except (pa.ArrowException, OSError) as e:
        raise DataError(f"{path}: not a readable Parquet file ({reason(e)})") from None
    names, row = list(shard.schema_arrow.names), 0
    batches = shard.iter_batches(batch_size=BATCH_ROWS)
    while True:
        try:
            batch = next(batches, None)
        except (pa.ArrowException, OSError) as e:
            raise DataError(f"{path}: row {row}: damaged Parquet data ({reason(e)})") from None
        if batch is None:
            return
        for values in zip(*(column.to_pylist() for column in batch.columns)):
            yield Row(f"{path}: row {row}", list(values), names)
            row += 1
