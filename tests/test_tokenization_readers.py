"""One reader per text format (tokenization/readers.py) and one UTF-8 policy (tokenization/encoding.py): the same
bad byte gets the same answer, in the same words, whichever reader it reaches: corpus, labelled rows, chat data,
seq2seq pairs or a `--task` file. Invalid bytes are replaced and said in one warning naming the file, the line
and the byte of that line; a class name holding one is refused; a JSON line nested past the recursion limit is
one DataError naming its line in every JSON-lines reader; a CSV / TSV cell may be as long as a document."""

from __future__ import annotations

import gzip
import json
import warnings
from pathlib import Path

import pytest

from tfkit.errors import DataError
from tfkit.evaluation.task_file import read_task
from tfkit.tokenization.chat import read_conversations
from tfkit.tokenization.corpus import iter_documents
from tfkit.tokenization.encoding import Utf8Warning
from tfkit.tokenization.labelled import Columns, load_labelled, read_texts
from tfkit.tokenization.pairs import is_pair_data, read_pairs

BAD = "caf\udce9 au lait"  # a Latin-1 é where UTF-8 is expected, as surrogateescape spells the byte


def _bytes(text: str) -> bytes:
    return text.encode("utf-8", errors="surrogateescape")


def _jsonl(*records) -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)


def _corpus(path: Path) -> str:
    return "".join(iter_documents(str(path)))


def _labelled(path: Path) -> str:
    return "".join(text for _, text, _ in read_texts(str(path), Columns()))


def _chat(path: Path) -> str:
    return "".join(content for _, turns in read_conversations(path) for _, content in turns)


def _pairs(path: Path) -> str:
    return "".join(s + t for s, t in read_pairs(str(path)))


def _task(path: Path) -> str:
    return "".join(item.context + "".join(item.choices) for item in read_task(path).items)


# reader name -> (file name, its content with BAD on line 3, how it is read, what the warning calls it)
READERS = {
    "corpus-txt": ("c.txt", f"one\ntwo\n{BAD}\n", _corpus, "corpus"),
    "corpus-txt.gz": ("c.txt.gz", f"one\ntwo\n{BAD}\n", _corpus, "corpus"),
    "corpus-jsonl": ("c.jsonl", _jsonl({"text": "a"}, {"text": "b"}, {"text": BAD}), _corpus, "corpus"),
    "corpus-json": ("c.json", '[\n"a",\n"' + BAD + '"\n]\n', _corpus, "corpus"),
    "corpus-tsv": ("c.tsv", f"a\tb\nc\td\ne\t{BAD}\n", _corpus, "corpus"),
    "labelled-csv": ("l.csv", f"text,label\r\nfine,x\r\n\"{BAD}\",y\r\n", _labelled, "labelled data"),
    "labelled-csv.gz": ("l.csv.gz", f"text,label\nfine,x\n{BAD},y\n", _labelled, "labelled data"),
    "labelled-tsv": ("l.tsv", f"text\tlabel\nfine\tx\n{BAD}\ty\n", _labelled, "labelled data"),
    "labelled-jsonl": ("l.jsonl", _jsonl({"text": "a", "label": "x"}, {"text": "b", "label": "y"},
                                         {"text": BAD, "label": "x"}), _labelled, "labelled data"),
    "chat-jsonl": ("chat.jsonl", _jsonl({"prompt": "a", "response": "b"}, {"prompt": "c", "response": "d"},
                                        {"prompt": "e", "response": BAD}), _chat, "chat data"),
    "pairs-tsv": ("p.tsv", f"a\tb\nc\td\ne\t{BAD}\n", _pairs, "seq2seq data"),
    "pairs-jsonl": ("p.jsonl", _jsonl({"source": "a", "target": "b"}, {"source": "c", "target": "d"},
                                      {"source": BAD, "target": "e"}), _pairs, "seq2seq data"),
    "task-jsonl": ("t.jsonl", _jsonl({"context": "a", "choices": ["b", "c"], "gold": 0},
                                     {"context": "d", "choices": ["e", "f"], "gold": 1},
                                     {"context": BAD, "choices": ["g", "h"], "gold": 0}), _task, "task"),
}


def _write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    data = _bytes(text)
    path.write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    return path


@pytest.mark.parametrize("reader", sorted(READERS))
def test_an_invalid_byte_is_replaced_and_said_once_with_its_line_and_byte_by_every_reader(reader, tmp_path):
    name, text, read, what = READERS[reader]
    path = _write(tmp_path, name, text)
    byte = _bytes(text).split(b"\n")[2].index(b"\xe9") + 1
    with pytest.warns(Utf8Warning) as record:
        got = read(path)
    assert [str(w.message) for w in record if w.category is Utf8Warning] == [
        f"{what} {path}: 1 invalid UTF-8 byte replaced with U+FFFD, the first at {path}:3, byte {byte}"]
    assert "caf\ufffd au lait" in got


@pytest.mark.parametrize("reader", sorted(READERS))
def test_clean_files_read_without_a_word(reader, tmp_path):
    name, text, read, _ = READERS[reader]
    path = _write(tmp_path, name, text.replace(BAD, "café au lait"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert "café au lait" in read(path)


@pytest.mark.parametrize("reader", sorted(READERS))
def test_a_utf16_file_is_refused_saying_what_it_is_by_every_reader(reader, tmp_path):
    """Excel's "Unicode text" is UTF-16: read as UTF-8 it is NUL-interleaved noise, so it is named, not repaired."""
    name, text, read, _ = READERS[reader]
    data = text.replace(BAD, "café").encode("utf-16")
    path = tmp_path / name
    path.write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    with pytest.raises(DataError) as info:
        read(path)
    assert str(info.value).startswith(f"{path}: UTF-16LE text, not UTF-8 (it starts with the byte-order mark FF FE)")


def test_a_utf8_byte_order_mark_is_no_text_in_any_format(tmp_path):
    bom = "\ufeff"
    (tmp_path / "c.txt").write_text(bom + "hello\n", encoding="utf-8")
    assert _corpus(tmp_path / "c.txt") == "hello\n"
    (tmp_path / "c.jsonl").write_text(bom + _jsonl({"text": "hello"}), encoding="utf-8")
    assert _corpus(tmp_path / "c.jsonl") == "hello"
    (tmp_path / "c.json").write_text(bom + '["hello"]', encoding="utf-8")
    assert _corpus(tmp_path / "c.json") == "hello"
    (tmp_path / "t.jsonl").write_text(bom + _jsonl({"context": "a", "choices": ["b", "c"], "gold": 0}),
                                      encoding="utf-8")
    assert _task(tmp_path / "t.jsonl") == "abc"
    (tmp_path / "p.tsv").write_text(bom + "src\ttgt\n", encoding="utf-8")
    assert read_pairs(str(tmp_path / "p.tsv")) == [("src", "tgt")]


def test_a_first_record_looked_at_says_nothing_the_whole_read_says_it(tmp_path):
    path = _write(tmp_path, "p.jsonl", _jsonl({"source": "a", "target": BAD}))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert is_pair_data(str(path), "source")
    with pytest.warns(Utf8Warning, match=rf"seq2seq data {path}: 1 invalid UTF-8 byte .* first at {path}:1, byte 31$"):
        read_pairs(str(path))


@pytest.mark.parametrize("kind", ["csv", "tsv", "jsonl"])
def test_a_class_name_with_an_invalid_byte_is_refused_naming_its_row(kind, tmp_path):
    """A corpus token may carry U+FFFD; a class named `hill\ufffd` would be written into config.json's
    id2label and every prediction, so the row is named and the fix said."""
    rows = [("a", "sea"), ("b", "hill"), ("c", "hill\udce9")]
    if kind == "jsonl":
        text = _jsonl(*({"text": t, "label": y} for t, y in rows))
    else:
        sep = "," if kind == "csv" else "\t"
        text = "".join(f"{t}{sep}{y}\n" for t, y in [("text", "label"), *rows])
    path = _write(tmp_path, f"l.{kind}", text)
    with pytest.raises(DataError) as info:
        load_labelled(str(path))
    line = 3 if kind == "jsonl" else 4
    assert str(info.value).startswith(f"{path}:{line}: label 'hill\ufffd' (column 'label') holds U+FFFD")
    assert "expected a class name in UTF-8 text" in str(info.value) and "\n" not in str(info.value)


def test_a_latin1_csv_is_named_by_the_real_line_of_its_first_bad_byte(tmp_path):
    path = tmp_path / "latin1.csv"
    path.write_bytes("text,label\nplain,sea\ncafé,hill\nthé,sea\n".encode("latin-1"))
    with pytest.warns(Utf8Warning, match=rf"2 invalid UTF-8 bytes replaced with U\+FFFD, the first at {path}:3, "
                                         r"byte 4$"):
        texts = [text for _, text, _ in read_texts(str(path), Columns())]
    assert texts == ["plain", "caf\ufffd", "th\ufffd"]


DEEP = "[" * 200_000 + "]" * 200_000  # past Python's recursion limit at any call depth


@pytest.mark.parametrize("read, first", [
    (_corpus, {"text": "a"}), (_labelled, {"text": "a", "label": "x"}), (_chat, {"prompt": "a", "response": "b"}),
    (_pairs, {"source": "a", "target": "b"}), (_task, {"context": "a", "choices": ["b", "c"], "gold": 0}),
], ids=["corpus", "labelled", "chat", "pairs", "task"])
def test_a_json_line_nested_past_the_recursion_limit_is_one_line_in_every_reader(read, first, tmp_path):
    path = tmp_path / "deep.jsonl"
    path.write_text(_jsonl(first) + DEEP + "\n")
    with pytest.raises(DataError) as info:
        read(path)
    assert str(info.value) == (f"{path}:2: JSON nested too deeply to read (expected at most 100 levels)")


LONG = "word " * 40_000  # 200,000 characters: past the csv module's default cell limit of 131,072


@pytest.mark.parametrize("kind", ["csv", "tsv"])
def test_a_cell_longer_than_the_csv_modules_default_limit_is_read_whole(kind, tmp_path):
    sep = "," if kind == "csv" else "\t"
    path = tmp_path / f"long.{kind}"
    path.write_text(f"text{sep}label\nshort{sep}a\n{LONG}{sep}b\n")
    data = load_labelled(str(path), str(path))
    assert data.train.texts == ["short", LONG] and data.labels == ("a", "b")
    (tmp_path / "long.tsv").write_text(f"{LONG}\tshort\n")
    assert read_pairs(str(tmp_path / "long.tsv")) == [(LONG, "short")]
    assert list(iter_documents(str(tmp_path / "long.tsv"))) == [f"{LONG}\nshort"]


def test_a_csv_saved_with_cr_line_endings_reads_as_lines(tmp_path):
    path = tmp_path / "mac.csv"
    path.write_bytes(b'text,label\r"one, two",a\rthree,b\r')
    rows = [(where, text) for where, text, _ in read_texts(str(path), Columns())]
    assert rows == [(f"{path}:2", "one, two"), (f"{path}:3", "three")]
