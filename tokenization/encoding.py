"""The one UTF-8 policy of every data file tfkit reads: what a file's bytes are, and what a bad byte gets.

tfkit reads text as UTF-8, in every format (plain text, JSON lines, CSV / TSV; `readers` decodes them all
through `decode`). A few invalid bytes, as a web scrape or a file saved in Latin-1 has them, are replaced
with U+FFFD, counted, and said in ONE warning per read (`Repairs.warn`: a file, or a corpus of many): the
count and where the first is (file, line, byte of that line), in the same words for every format. A class
name is the exception (`labelled._label` refuses one holding U+FFFD): it names a model's output.

A file that is not UTF-8 text at all is refused from its first 64 kB (`check_text`, before `readers` reads
a line of it), in one line that says what it is:
- UTF-16 or UTF-32 text (a byte-order mark, or every second or fourth byte a NUL, as Windows tools write
  it): decoded as UTF-8 it is NUL-interleaved noise that trains without a word of complaint;
- binary data (NUL bytes in no such pattern, or more than MAX_INVALID of the bytes, and at least
  MIN_INVALID of them, not UTF-8): an image, an archive or a model file picked up by a folder or a glob.
"""

from __future__ import annotations

import codecs
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import DataError

SNIFF_BYTES = 1 << 16
MAX_INVALID = 0.10  # a Latin-1 French or German text has 1-5% of such bytes; binary data far more
MIN_INVALID = 32  # a few bad bytes in a one-line file are a large share, and still a repair, not binary
BOMS = ((codecs.BOM_UTF32_LE, "UTF-32LE"), (codecs.BOM_UTF32_BE, "UTF-32BE"), (codecs.BOM_UTF16_LE, "UTF-16LE"),
        (codecs.BOM_UTF16_BE, "UTF-16BE"))
CONVERT = "tfkit reads UTF-8: convert it first, e.g. `iconv -f {code} -t UTF-8 FILE > FILE.utf8`"
SURROGATES = re.compile("[\udc80-\udcff]")  # what surrogateescape makes of undecodable bytes, one per byte
REPLACEMENT = "\ufffd"


class Utf8Warning(UserWarning):
    """Invalid UTF-8 in a data file was replaced with U+FFFD rather than refused (`Repairs.warn`)."""


@dataclass
class Repairs:
    """The invalid UTF-8 bytes replaced during one read (a file, or every file of a corpus): how many, in
    which files, and where the first was, for the one warning that read gives."""

    count: int = 0
    files: set[str] = field(default_factory=set)
    first: str | None = None  # "train.csv:2, byte 5": the file, its line and the byte of that line, from 1

    def warn(self, what: str, stacklevel: int = 2) -> None:
        """One warning saying what was replaced in `what` (`corpus SPEC`, `labelled data FILE`); none if nothing."""
        if self.count:
            many = f" in {len(self.files)} files" if len(self.files) > 1 else ""
            warnings.warn(f"{what}: {self.count} invalid UTF-8 byte{'s' if self.count > 1 else ''} replaced with "
                          f"U+FFFD{many}, the first at {self.first}", Utf8Warning, stacklevel=stacklevel + 1)


def decode(data: bytes, repairs: Repairs, file: str | Path, line: int = 1) -> str:
    """`data` as UTF-8 text, its invalid bytes replaced with U+FFFD and counted in `repairs`; `line` is the
    line of the file that `data` starts on, so the first repair is named by line and byte."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        text = data.decode("utf-8", errors="surrogateescape")  # one surrogate per bad byte: countable
        repairs.count += len(SURROGATES.findall(text))
        repairs.files.add(str(file))
        if repairs.first is None:
            start = data.rfind(b"\n", 0, exc.start) + 1  # the bad byte's line starts here
            number = line + data.count(b"\n", 0, start)
            repairs.first = f"{file}:{number}, byte {exc.start - start + 1}"
        return SURROGATES.sub(REPLACEMENT, text)


def _nul_pattern(head: bytes) -> str | None:
    """The UTF-16/32 variant whose NUL bytes `head` shows (mostly ASCII text stored wide), or None."""
    size = len(head) - len(head) % 4
    if size < 8:
        return None
    lanes = [head[i:size:4].count(0) / (size // 4) for i in range(4)]  # share of NULs per byte position mod 4
    if lanes[1] > 0.9 and lanes[2] > 0.9 and lanes[3] > 0.9:
        return "UTF-32LE"
    if lanes[0] > 0.9 and lanes[1] > 0.9 and lanes[2] > 0.9:
        return "UTF-32BE"
    if lanes[1] > 0.7 and lanes[3] > 0.7 and lanes[0] < 0.3 and lanes[2] < 0.3:
        return "UTF-16LE"
    if lanes[0] > 0.7 and lanes[2] > 0.7 and lanes[1] < 0.3 and lanes[3] < 0.3:
        return "UTF-16BE"
    return None


def _invalid_bytes(head: bytes) -> int:
    """How many of `head`'s bytes are not UTF-8 (a character cut at the end of the sample is not counted)."""
    text = head.decode("utf-8", errors="surrogateescape")
    bad = sum(1 for c in text if "\udc80" <= c <= "\udcff")
    tail = next((n for n in range(1, 4) if len(head) >= n and head[-n] >= 0xC0), 0)  # a cut lead byte
    return max(bad - tail, 0)


def check_text(head: bytes, path: Path | str) -> None:
    """DataError naming `path` when its first bytes `head` are UTF-16/32 text or binary data, not UTF-8."""
    for bom, code in BOMS:
        if head.startswith(bom):
            raise DataError(f"{path}: {code} text, not UTF-8 (it starts with the byte-order mark "
                            f"{bom.hex(' ').upper()}); {CONVERT.format(code=code)}")
    wide = _nul_pattern(head)
    if wide is not None:
        nuls = "every second byte" if "16" in wide else "three bytes in four"
        raise DataError(f"{path}: {wide} text without a byte-order mark, not UTF-8 ({nuls} NUL); "
                        f"{CONVERT.format(code=wide)}")
    if b"\0" in head:
        raise DataError(f"{path}: binary data, not text (it holds NUL bytes); name only text files (a corpus "
                        "folder: move it out)")
    bad = _invalid_bytes(head)
    share = bad / max(len(head), 1)
    if share > MAX_INVALID and bad >= MIN_INVALID:
        raise DataError(f"{path}: binary data, not UTF-8 text ({share:.0%} of its first {len(head):,} bytes "
                        "are not UTF-8); name only text files, or convert a text in another encoding "
                        f"({CONVERT.format(code='LATIN1')})")


@dataclass
class ReadStats:
    """Filled while files are read: sizes and throughput for the caller's report and progress bars without a
    second pass, and the invalid UTF-8 replaced (`repairs`)."""

    files: int = 0
    documents: int = 0
    bytes_read: int = 0  # of text (decompressed)
    file_bytes: int = 0  # of the files on disk, for progress against `corpus_size` (compressed sizes)
    repairs: Repairs = field(default_factory=Repairs)

