"""Corpus files that are not UTF-8 text, or not files: UTF-16 and UTF-32 (with a byte-order mark or
NUL-interleaved without one), binary data (NUL bytes, or mostly invalid UTF-8), a FIFO. Every reader
(train-tokenizer, eval --data, pretrain's data.train), given one alone or inside a folder, refuses it in
one line that says what the file is, and writes nothing."""

from __future__ import annotations

import codecs
import os
import random

import pytest
from fault_helpers import assert_one_line_error, changes, cli, snapshot

TEXT = "The quick brown fox jumps over the lazy dog. Plain English text, line after line.\n" * 400


def _binary_with_nuls() -> bytes:
    return bytes(random.Random(0).randrange(256) for _ in range(20_000))


def _mostly_invalid() -> bytes:
    """No NUL byte, 19% of bytes invalid UTF-8: text with high bytes strewn through it (a Windows-1252
    export of non-Latin text, or a compressed blob without zeros)."""
    rng, out = random.Random(1), bytearray()
    for char in TEXT.encode()[:20_000]:
        out.append(char if rng.random() > 0.19 else rng.randrange(0x80, 0xC0))
    return bytes(out)


KINDS = {
    "utf16-bom": (lambda: TEXT.encode("utf-16"), "UTF-16LE"),
    "utf16be-bom": (lambda: codecs.BOM_UTF16_BE + TEXT.encode("utf-16-be"), "UTF-16BE"),
    "utf16le-no-bom": (lambda: TEXT.encode("utf-16-le"), "UTF-16LE"),
    "utf16be-no-bom": (lambda: TEXT.encode("utf-16-be"), "UTF-16BE"),
    "utf32-bom": (lambda: TEXT.encode("utf-32"), "UTF-32LE"),
    "utf32be-no-bom": (lambda: TEXT.encode("utf-32-be"), "UTF-32BE"),
    "binary-nuls": (_binary_with_nuls, "binary data"),
    "binary-19pct-invalid": (_mostly_invalid, "not UTF-8"),
    "fifo": (None, "FIFO"),
}
READERS = ("train-tokenizer", "eval", "pretrain")
PLACES = ("file", "in-a-folder")
CASES = [(k, r, p) for k in KINDS for r in READERS for p in PLACES if not (k == "fifo" and p == "in-a-folder")]


def _command(reader: str, corpus, tmp_path, tiny_run) -> list:
    recipe, run = tiny_run
    if reader == "train-tokenizer":
        return ["train-tokenizer", corpus, "--out", tmp_path / "tok", "--vocab-size", "300", "-q"]
    if reader == "eval":
        return ["eval", run / "checkpoints" / "step-4", "--data", corpus]
    return ["pretrain", recipe, "--run-dir", tmp_path / "run", "--set", f"data.train={corpus}",
            "--set", "data.valid=null", "--set", "tokenizer.path=null"]


@pytest.mark.parametrize(("kind", "reader", "place"), CASES, ids=[f"{k}-{r}-{p}" for k, r, p in CASES])
def test_a_corpus_that_is_not_utf8_text_is_named_for_what_it_is(kind, reader, place, tiny_run, tmp_path, monkeypatch):
    work = tmp_path / "work"  # what must stay as it was; the token cache (tfkit's own) lies beside it
    folder = work / "corpus"
    folder.mkdir(parents=True)
    monkeypatch.chdir(work)
    monkeypatch.setenv("TFKIT_CACHE", str(tmp_path / "cache"))
    make, expected = KINDS[kind]
    path = folder / "b.txt"
    if make is None:
        os.mkfifo(path)
    else:
        path.write_bytes(make())
    if place == "in-a-folder":
        (folder / "a.txt").write_text(TEXT)
    before = snapshot(work)
    line = assert_one_line_error(cli(_command(reader, path if place == "file" else folder, work, tiny_run)), expected)
    assert str(path) in line, line
    assert not changes(before, snapshot(work)), changes(before, snapshot(work))
    assert not [p for p in tmp_path.rglob("*") if ".tmp-" in p.name], "a staging folder was left"
