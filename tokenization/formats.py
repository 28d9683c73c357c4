"""Corpus files beyond plain text: compressed streams (gzip, zstd) and columnar shards (Parquet, Arrow).

- `.txt.gz` / `.jsonl.gz` are read with the standard library's zlib, `.txt.zst` / `.jsonl.zst` with the
  `zstandard` package, both behind `open_bytes`, which gives the plain readers of `corpus` an ordinary
  binary file. Each gzip member or zstd frame must reach its end marker: a truncated download is an
  error, not a quietly shorter corpus (the zstd stream reader would stop without a word).
- `.parquet` files (FineWeb, Wikipedia dumps) are read with pyarrow one record batch at a time, row group
  by row group, and only the text column: a shard's text is never in memory at once.
- `.arrow` files are Arrow IPC, the *stream* format that HuggingFace `datasets` writes with
  `save_to_disk` (`data-00000-of-00003.arrow` beside `state.json` and `dataset_info.json`), or the *file*
  format; told apart by the file format's leading `ARROW1` magic. Read one record batch at a time.

pyarrow and zstandard are the optional `data` extra (`pip install "tfkit[data]"`) and are imported only
when such a file is read, so the CLI never pays for them at start-up. Every problem is a one-line
`DataError` naming the file and the row group, record batch or line at fault.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import DataError
from ..jsonfile import kind_of, member, read_json

if TYPE_CHECKING:
    from .encoding import ReadStats

EXTRA = 'pip install "tfkit[data]"'
INPUT_BYTES = 1 << 16  # compressed bytes fed to a decoder at a time: bounds what one call expands to
BATCH_ROWS = 1024  # Parquet rows decoded at a time
DATASET_FILES = ("state.json", "dataset_info.json")  # what `datasets.Dataset.save_to_disk` leaves beside its shards


class DamagedStream(DataError):
    """A compressed file that cannot be decoded to its end (truncated, damaged, not the format it says)."""


def need(module: str, path: Path, what: str) -> Any:
    """Import an optional library, or a one-line DataError naming the file, the library and the extra."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise DataError(f"corpus {path}: {what} needs {module.split('.')[0]}: {EXTRA}") from None


def reason(error: Exception) -> str:
    """A library's error message on one line (pyarrow's span several)."""
    return " ".join(str(error).split()) or type(error).__name__


# ---------------------------------------------------------------- compressed streams


class _Counted(io.RawIOBase):
    """A file read through this adds every byte it gives to `stats.file_bytes` (progress against the
    on-disk size, which for a compressed file is not the text size)."""

    def __init__(self, raw: io.RawIOBase, stats: ReadStats):
        self.raw, self.stats = raw, stats

    def readable(self) -> bool:
        return True

    def readinto(self, buf) -> int:
        n = self.raw.readinto(buf)
        self.stats.file_bytes += n or 0
        return n

    def close(self) -> None:
        self.raw.close()
        super().close()


class _Decompressed(io.RawIOBase):
    """The decoded bytes of a gzip or zstd file: members / frames one after another, each checked to end."""

    def __init__(self, source: io.RawIOBase, new_decoder: Callable[[], Any], path: Path, fmt: str, errors: tuple):
        self.source, self.new_decoder, self.path, self.fmt, self.errors = source, new_decoder, path, fmt, errors
        self.decoder, self.started = new_decoder(), False  # started: this member / frame has had input
        self.pending = memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, buf) -> int:
        while not self.pending:
            data = self.source.read(INPUT_BYTES)
            if not data:
                if self.started and not self.decoder.eof:
                    raise DamagedStream(f"{self.path}: the {self.fmt} stream ends before its end marker "
                                        "(a truncated file?)")
                return 0
            self.pending = memoryview(self._decode(data))
        n = min(len(buf), len(self.pending))
        buf[:n] = self.pending[:n]
        self.pending = self.pending[n:]
        return n

    def _decode(self, data: bytes) -> bytes:
        out = []
        while data:
            if self.decoder.eof:  # the next member / frame follows the end of this one
                if not data.strip(b"\0"):  # zero padding after the last one, as gzip tolerates
                    break
                self.decoder, self.started = self.new_decoder(), False
            try:
                out.append(self.decoder.decompress(data))
            except self.errors as e:
                raise DamagedStream(f"{self.path}: damaged {self.fmt} data ({reason(e)})") from None
            self.started = True
            data = self.decoder.unused_data if self.decoder.eof else b""
        return b"".join(out)

    def close(self) -> None:
        self.source.close()
        super().close()


def open_bytes(path: Path, compression: str | None, stats: ReadStats) -> io.BufferedReader:
    """`path` as a binary file of its decoded bytes (`compression`: None, ".gz" or ".zst"); the bytes read
    from disk are added to `stats.file_bytes`."""
    raw = _Counted(io.FileIO(path, "r"), stats)
    if compression is None:
        return io.BufferedReader(raw, 1 << 20)
    if compression == ".gz":
        import zlib

        return io.BufferedReader(_Decompressed(raw, lambda: zlib.decompressobj(wbits=31), path, "gzip",
                                               (zlib.error,)), 1 << 20)
    zstandard = need("zstandard", path, "reading zstd")
    decompressor = zstandard.ZstdDecompressor()
    return io.BufferedReader(_Decompressed(raw, decompressor.decompressobj, path, "zstd",
                                           (zstandard.ZstdError,)), 1 << 20)


def decoded_size(path: Path, text_field: str) -> int:
    """About how many bytes of text `path` holds once decoded, for progress bars that count the text
    (tokenizer training): a compressed file's own size would let them run past 100%. gzip records the
    size of its last member (mod 4 GiB) in its last 4 bytes, zstd frames usually their content size, and
    Parquet the uncompressed size of every column chunk; where none says, 4x the file (typical for text)."""
    size, name = path.stat().st_size, path.name.lower()
    try:
        if name.endswith(".gz"):
            with open(path, "rb") as f:
                f.seek(-4, io.SEEK_END)
                isize = int.from_bytes(f.read(4), "little")
            return isize if isize >= size else 4 * size  # a multi-member or > 4 GiB file wraps ISIZE
        if name.endswith(".zst"):
            zstandard = need("zstandard", path, "reading zstd")
            with open(path, "rb") as f:
                content = zstandard.get_frame_parameters(f.read(18)).content_size
            return content if 0 < content < 1 << 62 else 4 * size  # unknown: 2**64 - 1
        if name.endswith(".parquet"):
            pq = need("pyarrow.parquet", path, "reading Parquet")
            meta = pq.ParquetFile(path).metadata
            chunks = [meta.row_group(g).column(c) for g in range(meta.num_row_groups) for c in range(meta.num_columns)]
            return sum(chunk.total_uncompressed_size for chunk in chunks if chunk.path_in_schema == text_field) or size
    except Exception:  # a damaged or odd file is reported by its reader, with the path; here only a bar is at stake
        return size
    return size


# ---------------------------------------------------------------- Parquet and Arrow


def _text_column(path: Path, schema, text_field: str) -> int:
    """Index of the text column in `schema`; DataError naming the columns there are, or the wrong type."""
    pa = need("pyarrow", path, "reading Arrow")
    names = list(schema.names)
    if text_field not in names:
        shown = ", ".join(names[:20]) + (f", ... ({len(names)} in all)" if len(names) > 20 else "")
        raise DataError(f"{path}: no column {text_field!r} (columns: {shown}); name the one holding the text "
                        "with text_field, or data.text_field in a recipe", params=("text_field",))
    kind = schema.field(text_field).type
    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind) or str(kind) == "string_view"):
        raise DataError(f"{path}: column {text_field!r} holds {kind}, expected strings (text)")
    return names.index(text_field)


def _texts(column, stats: ReadStats) -> list[str]:
    """The non-null strings of an Arrow string column; their UTF-8 bytes are added to `stats.bytes_read`."""
    import pyarrow.compute as pc

    if hasattr(column, "dictionary_decode"):
        column = column.dictionary_decode()
    stats.bytes_read += int(pc.sum(pc.binary_length(column)).as_py() or 0)
    return [t for t in column.to_pylist() if t is not None]


def read_parquet(path: Path, text_field: str, stats: ReadStats) -> Iterator[str]:
    """One document per row: the `text_field` column, a record batch at a time, row group by row group."""
    for batch in _parquet_batches(path, [text_field], stats):
        yield from _texts(batch.column(0), stats)


def read_arrow(path: Path, text_field: str, stats: ReadStats) -> Iterator[str]:
    """One document per row of an Arrow IPC stream or file (see the module docstring), batch by batch."""
    for batch in _arrow_batches(path, [text_field], stats):
        yield from _texts(batch.column(0), stats)


def read_rows(path: Path, fields: list[str], stats: ReadStats) -> Iterator[tuple]:
    """The `fields` of each row of a Parquet or Arrow file, as tuples (seq2seq pairs: source, target);
    a null stays None for the caller to name."""
    batches = _parquet_batches if path.name.lower().endswith(".parquet") else _arrow_batches
    for batch in batches(path, fields, stats):
        columns = [batch.column(i) for i in range(len(fields))]
        for column in columns:
            _texts(column, stats)  # counts the bytes read; the values come from to_pylist below
        yield from zip(*(column.to_pylist() for column in columns))


def _parquet_batches(path: Path, columns: list[str], stats: ReadStats) -> Iterator[Any]:
    """Record batches of the `columns` (each checked to hold strings), row group by row group; progress
    in `stats.file_bytes` as the share of the rows read."""
    pq = need("pyarrow.parquet", path, "reading Parquet")
    import pyarrow as pa

    try:
        shard = pq.ParquetFile(path)  # reads the footer only
    except (pa.ArrowException, OSError) as e:
        raise DataError(f"{path}: not a readable Parquet file ({reason(e)})") from None
    for column in columns:
        _text_column(path, shard.schema_arrow, column)
    size, rows, done, counted = path.stat().st_size, max(shard.metadata.num_rows, 1), 0, 0
    for group in range(shard.num_row_groups):
        batches = shard.iter_batches(batch_size=BATCH_ROWS, row_groups=[group], columns=columns)
        while True:
            try:
                batch = next(batches, None)
            except (pa.ArrowException, OSError) as e:
                raise DataError(f"{path}: row group {group}: damaged Parquet data ({reason(e)})") from None
            if batch is None:
                break
            done += batch.num_rows
            stats.file_bytes += size * done // rows - counted  # progress: the share of the rows read
            counted = size * done // rows
            yield batch
    stats.file_bytes += size - counted


def _arrow_batches(path: Path, columns: list[str], stats: ReadStats) -> Iterator[Any]:
    """Record batches of an Arrow IPC stream or file, reduced to the `columns` (each checked to hold
    strings), in that order."""
    pa = need("pyarrow", path, "reading Arrow")
    with pa.OSFile(str(path)) as source:  # not a memory map: pages read stay out of the process's memory
        is_file_format = source.read(6) == b"ARROW1"
        source.seek(0)
        batch_no, counted = -1, 0  # batch_no: the record batch being read (-1: the schema)
        try:
            reader = pa.ipc.open_file(source) if is_file_format else pa.ipc.open_stream(source)
            indices = [_text_column(path, reader.schema, column) for column in columns]
            batch_no = 0
            batches = (reader.get_batch(i) for i in range(reader.num_record_batches)) if is_file_format else reader
            for batch in batches:
                batch = batch.select(indices)
                batch_no += 1
                stats.file_bytes += source.tell() - counted
                counted = source.tell()
                yield batch
        except (pa.ArrowException, OSError) as e:
            where = f"record batch {batch_no}: " if batch_no >= 0 else ""
            raise DataError(f"{path}: {where}damaged Arrow data ({reason(e)})") from None
    stats.file_bytes += path.stat().st_size - counted


def dataset_files(folder: Path) -> list[Path]:
    """The `.arrow` shards of a folder written by `datasets`' `save_to_disk`, in its own order."""
    file = folder / "state.json"
    entries = read_json(file).get("_data_files")
    if not isinstance(entries, list) or not all(isinstance(entry, dict) for entry in entries):
        raise DataError(f"{file}: not a datasets state file (expected '_data_files', a list of objects with a "
                        f"'filename', got {kind_of(entries)})")
    shards = [member(folder, entry.get("filename"), file) for entry in entries]
    missing = [p for p in shards if not p.is_file()]
    if missing:
        raise DataError(f"datasets folder {folder}: state.json lists {missing[0].relative_to(folder)}, which is not there")
    if not shards:
        raise DataError(f"datasets folder {folder}: state.json lists no .arrow files")
    return shards


def dataset_dict_error(folder: Path) -> DataError:
    """A `DatasetDict` folder holds one datasets folder per split: reading them all would mix train and test."""
    try:
        splits = read_json(folder / "dataset_dict.json").get("splits")
    except DataError:
        splits = None
    if not isinstance(splits, list) or not all(isinstance(split, str) for split in splits):
        splits = sorted(p.name for p in folder.iterdir() if (p / "state.json").is_file())
    first = splits[0] if splits else "train"
    return DataError(f"corpus {folder}: a datasets DatasetDict with splits {', '.join(splits) or '(none)'}; "
                     f"name one split's folder, e.g. {folder / first}")
