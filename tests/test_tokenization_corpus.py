"""Corpus readers: every spec form, streaming of big files, repairs and one-line errors."""

import json
import os
import warnings

import pytest

from tfkit.errors import DataError
from tfkit.tokenization.corpus import corpus_fingerprint, iter_documents, iter_pieces, resolve_files
from tfkit.tokenization.encoding import Utf8Warning
from tfkit.tokenization.readers import ReadStats


def test_text_file_is_one_document(tmp_path):
    f = tmp_path / "a.txt"
    f.write_text("hello\nworld\n")
    assert list(iter_pieces(str(f))) == [("hello\nworld\n", True)]


def test_large_file_streams_in_line_aligned_pieces_of_one_document(tmp_path):
    f = tmp_path / "big.txt"
    lines = [f"line {i} " + "é" * (i % 7) + "\n" for i in range(2000)]
    f.write_text("".join(lines), encoding="utf-8")
    pieces = list(iter_pieces(str(f), chunk_bytes=1000))
    assert len(pieces) > 10
    assert [new for _, new in pieces] == [True] + [False] * (len(pieces) - 1)
    assert all(text.endswith("\n") for text, _ in pieces)  # cut at line boundaries
    assert "".join(text for text, _ in pieces) == "".join(lines)


def test_one_enormous_line_is_cut_without_breaking_characters(tmp_path):
    f = tmp_path / "line.txt"
    f.write_text("ab€" * 1000, encoding="utf-8")  # 5 bytes per repeat, no newline
    pieces = list(iter_pieces(str(f), chunk_bytes=64))
    assert len(pieces) > 1 and "".join(t for t, _ in pieces) == "ab€" * 1000


def test_glob_and_folder_are_sorted_and_recursive(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "b.txt").write_text("B")
    (tmp_path / "a.md").write_text("A")
    (tmp_path / "sub" / "c.txt").write_text("C")
    (tmp_path / "skip.bin").write_text("nope")
    assert list(iter_documents(str(tmp_path))) == ["A", "B", "C"]
    assert list(iter_documents(str(tmp_path / "*.txt"))) == ["B"]
    assert list(iter_documents(str(tmp_path / "**" / "*.txt"))) == ["B", "C"]


def test_folder_skips_hidden_files_and_folders(tmp_path):
    """A home or project folder holds tool state (.cache, .git, swap files) that is not corpus text."""
    (tmp_path / ".cache" / "matplotlib").mkdir(parents=True)
    (tmp_path / ".cache" / "matplotlib" / "fontlist.json").write_text('{"not": "a corpus"')  # invalid JSON
    (tmp_path / "sub" / ".git").mkdir(parents=True)
    (tmp_path / "sub" / ".git" / "notes.txt").write_text("git")
    (tmp_path / "sub" / ".draft.md").write_text("draft")
    (tmp_path / "sub" / "b.txt").write_text("B")
    (tmp_path / "a.txt").write_text("A")
    assert resolve_files(str(tmp_path)) == [tmp_path / "a.txt", tmp_path / "sub" / "b.txt"]
    assert list(iter_documents(str(tmp_path))) == ["A", "B"]
    assert list(iter_documents(str(tmp_path / "sub" / ".draft.md"))) == ["draft"]  # named directly: read
    assert list(iter_documents(str(tmp_path / "sub" / ".git"))) == ["git"]  # the folder given is not skipped
    (tmp_path / "only-hidden" / ".venv").mkdir(parents=True)
    (tmp_path / "only-hidden" / ".venv" / "x.txt").write_text("x")
    with pytest.raises(DataError, match=r"only-hidden: no .* files inside \(hidden files and folders"):
        list(iter_documents(str(tmp_path / "only-hidden")))


def test_jsonl_json_and_tsv(tmp_path):
    jl = tmp_path / "d.jsonl"
    jl.write_text('{"text": "one"}\n\n{"text": "two", "id": 2}\n')
    assert list(iter_pieces(str(jl))) == [("one", True), ("two", True)]
    body = tmp_path / "e.jsonl"
    body.write_text('{"body": "x"}\n')
    assert list(iter_documents(str(body), text_field="body")) == ["x"]
    arr = tmp_path / "f.json"
    arr.write_text(json.dumps(["s1", {"text": "s2"}]))
    assert list(iter_documents(str(arr))) == ["s1", "s2"]
    tsv = tmp_path / "g.tsv"
    tsv.write_text("hello\tbonjour\nbye\tau revoir\n")
    assert list(iter_documents(str(tsv))) == ["hello\nbonjour", "bye\nau revoir"]
    lines = tmp_path / "h.json"  # JSON lines under a .json name
    lines.write_text('{"text": "a"}\n{"text": "b"}\n')
    assert list(iter_documents(str(lines))) == ["a", "b"]


def test_a_pretty_printed_json_object_is_one_record(tmp_path):
    """An indented object is read whole, not as broken JSON lines; one without the text field (a
    dataset_info.json) is named as such, not as invalid JSON at line 1."""
    doc = tmp_path / "doc.json"
    doc.write_text(json.dumps({"id": 1, "text": "one document"}, indent=2))
    assert list(iter_documents(str(doc))) == ["one document"]
    info = tmp_path / "dataset_info.json"
    info.write_text(json.dumps({"features": {"text": {"dtype": "string"}}, "splits": {}}, indent=2))
    with pytest.raises(DataError, match=rf"{info}: no 'text' field"):
        list(iter_documents(str(info)))


def test_invalid_utf8_is_replaced_counted_and_warned_once_naming_the_first(tmp_path):
    (tmp_path / "a.txt").write_bytes(b"fine\ngood \xff\xfe text\n")
    (tmp_path / "b.txt").write_bytes(b"more \x80 bad\n")
    stats = ReadStats()
    with pytest.warns(Utf8Warning) as record:
        docs = list(iter_documents(str(tmp_path), stats=stats))
    assert [str(w.message) for w in record if w.category is Utf8Warning] == [
        f"corpus {tmp_path}: 3 invalid UTF-8 bytes replaced with U+FFFD in 2 files, the first at "
        f"{tmp_path / 'a.txt'}:2, byte 6"]
    assert docs == ["fine\ngood \ufffd\ufffd text\n", "more \ufffd bad\n"]
    assert stats.repairs.count == 3 and stats.documents == 2


def test_the_first_invalid_byte_of_a_large_file_is_named_by_its_line(tmp_path):
    """Pieces of a large file are decoded one by one: the line counts on across them."""
    f = tmp_path / "big.txt"
    f.write_bytes(b"a line of text\n" * 1000 + b"caf\xe9\n")
    with pytest.warns(Utf8Warning, match=rf"1 invalid UTF-8 byte replaced with U\+FFFD, the first at {f}:1001, "
                                         r"byte 4$"):
        assert "".join(iter_documents(str(f))).endswith("caf\ufffd\n")
    stats = ReadStats()
    with pytest.warns(Utf8Warning, match=rf"the first at {f}:1001, byte 4$"):
        list(iter_pieces(str(f), chunk_bytes=100, stats=stats))


def test_clean_corpus_gives_no_warning(tmp_path):
    (tmp_path / "a.txt").write_text("fine\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert list(iter_documents(str(tmp_path))) == ["fine\n"]


@pytest.mark.parametrize(
    "setup, spec, match",
    [
        (lambda d: None, "missing.txt", r"missing\.txt: no such file"),
        (lambda d: None, "*.nothing", r"glob .*\*\.nothing.* matches no files"),
        (lambda d: (d / "e.txt").write_text("  \n"), "e.txt", r"corpus .*e\.txt is empty"),
        (lambda d: (d / "m.jsonl").write_text('{"text": "a"}\n{"body": "b"}\n'), "m.jsonl",
         r"m\.jsonl:2: no 'text' field"),
        (lambda d: (d / "j.jsonl").write_text('{"text": "a"}\n{oops\n'), "j.jsonl", r"j\.jsonl:2: invalid JSON"),
        (lambda d: (d / "n.jsonl").write_text('{"text": 5}\n'), "n.jsonl", r"n\.jsonl:1: field 'text' is int"),
        (lambda d: (d / "sub").mkdir(), "sub", r"sub: no .* files inside"),
        (lambda d: None, "stdlib:pictures", r"stdlib:pictures.*expected stdlib:code or stdlib:docs"),
    ],
)
def test_bad_corpus_is_one_line_data_error(tmp_path, setup, spec, match):
    setup(tmp_path)
    path = spec if spec.startswith("stdlib:") else str(tmp_path / spec)
    with pytest.raises(DataError, match=match) as err:
        list(iter_documents(path))
    assert "\n" not in str(err.value)


def test_corpus_fingerprint_tracks_files(tmp_path):
    f = tmp_path / "a.txt"
    f.write_text("abc")
    first = corpus_fingerprint(str(tmp_path))
    assert first == corpus_fingerprint(str(tmp_path))
    assert first != corpus_fingerprint(str(tmp_path), text_field="body")
    f.write_text("abcd")
    os.utime(f, ns=(1, 1))
    assert corpus_fingerprint(str(tmp_path)) != first
    assert len(corpus_fingerprint("stdlib:docs:train")) == 16
