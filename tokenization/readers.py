"""One reader per text format of the data a user gives tfkit: plain text, JSON lines, CSV / TSV.

Corpora (`corpus`), labelled rows (`labelled_rows`, and through them chat data), seq2seq pairs (`pairs`) and
`tfkit eval --task` files (`evaluation/task_file.py`) all read their text files here, so a bad byte or a bad
line gets the same answer whichever of them it arrives in:
- bytes come plain or decompressed (a name ending in `.gz` or `.zst`, through `formats.open_bytes`), a line
  at a time (a plain-text corpus in ~1 MB pieces cut at line boundaries), and are decoded by the one UTF-8
  policy (`encoding`): a file whose first 64 kB are UTF-16/32 text or binary data is refused, saying what
  it is (`check_text`); a few invalid bytes are replaced with U+FFFD and counted in the `ReadStats` the
  caller passes, which gives its one warning at the end of the read (`stats.repairs.warn`: one per file,
  or one per corpus of many files);
- a leading UTF-8 byte-order mark (Excel's "CSV UTF-8", Notepad's UTF-8) is dropped: it is no text;
- every JSON line goes through the guarded parser (`jsonfile.parse_json`): a line nested past the
  recursion limit is one DataError naming the file and the line, like any invalid JSON;
- CSV / TSV cells may be as long as a text is (the csv module's default limit, 131,072 characters, would
  refuse a long document that the fine-tuning rows then truncate as documented), and a malformed line
  is named by its real line number.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Iterator
from pathlib import Path

from ..errors import DataError
from ..jsonfile import parse_json
from .encoding import SNIFF_BYTES, ReadStats, check_text, decode
from .formats import open_bytes

FIELD_LIMIT = 2**31 - 1  # characters in one CSV / TSV cell: a C long on every platform (sys.maxsize is not)
BOM = "\ufeff"
LONE_CR = re.compile(r"(?<=\r)(?!\n)")  # a line break of a file saved with CR line endings only (old Mac Excel)


def compression(path: Path) -> str | None:
    """".gz" or ".zst" for a file compressed so (by its name's last suffix), else None."""
    name = path.name.lower()
    return next((c for c in (".gz", ".zst") if name.endswith(c)), None)


def check_head(path: Path) -> None:
    """Refuse a file whose first bytes are UTF-16/32 text or binary data (`encoding.check_text`)."""
    with open_bytes(path, compression(path), ReadStats()) as f:
        check_text(f.read(SNIFF_BYTES), path)


def text_lines(path: Path, stats: ReadStats) -> Iterator[tuple[int, str]]:
    """(line number from 1, the line's text with its line break) of every line of `path`."""
    check_head(path)
    with open_bytes(path, compression(path), stats) as f:
        for number, raw in enumerate(f, 1):
            stats.bytes_read += len(raw)
            line = decode(raw, stats.repairs, path, number)
            yield number, line.removeprefix(BOM) if number == 1 else line


def text_chunks(path: Path, stats: ReadStats, chunk_bytes: int) -> Iterator[str]:
    """A plain-text file in pieces of about `chunk_bytes`, each ending at a line boundary when one exists
    (a large file is never read whole)."""
    check_head(path)
    with open_bytes(path, compression(path), stats) as f:
        rest, line = b"", 1  # line: the line of the file the next piece starts on
        first = True
        while True:
            block = f.read(chunk_bytes)
            stats.bytes_read += len(block)
            if not block:
                break
            data = rest + block
            cut = data.rfind(b"\n") + 1
            if cut == 0:  # one enormous line: cut anyway, but before the lead byte of the last character
                i = len(data) - 1
                while i > len(data) - 4 and i > 0 and (data[i] & 0xC0) == 0x80:
                    i -= 1
                cut = i if data[i] >= 0xC0 else len(data)
                if cut == 0:
                    rest = data
                    continue
            rest = data[cut:]
            text = decode(data[:cut], stats.repairs, path, line)
            line += data.count(b"\n", 0, cut)
            yield text.removeprefix(BOM) if first else text
            first = False
        if rest:
            text = decode(rest, stats.repairs, path, line)
            yield text.removeprefix(BOM) if first else text


def read_text(path: Path, stats: ReadStats) -> str:
    """A whole (small) text file, by the same policy: a JSON document that must be parsed whole."""
    data = path.read_bytes()
    check_text(data[:SNIFF_BYTES], path)
    stats.bytes_read += len(data)
    stats.file_bytes += len(data)
    return decode(data, stats.repairs, path).removeprefix(BOM)


def jsonl_records(path: Path, stats: ReadStats, max_depth: int | None = None) -> Iterator[tuple[str, object]]:
    """(where, value) for each non-blank line of a JSON-lines file, `where` being `FILE:LINE`; a line that is
    not JSON, or nests past the recursion limit (or `max_depth`), is a DataError naming it."""
    for number, line in text_lines(path, stats):
        if line.strip():
            where = f"{path}:{number}"
            yield where, parse_json(line, where, max_depth=max_depth)


def delimited_rows(path: Path, kind: str, stats: ReadStats) -> Iterator[tuple[int, list[str]]]:
    """(line number, cells) of each record of a CSV (`kind` ".csv": quoted fields may hold commas and line
    breaks) or TSV file (".tsv": no quoting, as the GLUE loaders read it; a sentence's quotes are its own),
    the line number being the record's last line. A malformed line is a DataError naming it."""
    if csv.field_size_limit() < FIELD_LIMIT:
        csv.field_size_limit(FIELD_LIMIT)  # process-wide: the csv module has no per-reader limit
    dialect = {"delimiter": "\t", "quoting": csv.QUOTE_NONE} if kind == ".tsv" else {}
    reader = csv.reader(_csv_lines(path, stats), **dialect)
    try:
        for values in reader:
            yield reader.line_num, values
    except csv.Error as e:
        raise DataError(f"{path}:{reader.line_num}: malformed {kind[1:].upper()} ({e})") from None


def _csv_lines(path: Path, stats: ReadStats) -> Iterator[str]:
    """The lines the csv module reads, as `open(newline="")` would give them: a file with CR line
    endings only is split at each CR."""
    for _, line in text_lines(path, stats):
        if "\r" in line.rstrip("\n").removesuffix("\r"):
            yield from LONE_CR.split(line)
        else:
            yield line


def warned(items: Iterator, stats: ReadStats, what: str) -> Iterator:
    """`items` (a reader's output), then the one warning of the read, naming `what` (`labelled data FILE`),
    once they have all been read: a reader stopped early (a first record looked at) says nothing."""
    yield from items
    stats.repairs.warn(what, stacklevel=3)

