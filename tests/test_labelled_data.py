"""Labelled data for fine-tuning (tokenization/labelled.py, labelled_rows.py, stdlib_topics.py): the same
examples from every format, labels numbered the same way whatever the row order, stratified hold-out,
and one-line errors naming the file, row and column. Every file is written here."""

import csv
import gzip
import json
from collections import Counter

import pytest

from tfkit.errors import ConfigError, DataError
from tfkit.tokenization.labelled import Columns, label_names, load_labelled, stratified_holdout
from tfkit.tokenization.stdlib_topics import TOPICS

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
zstandard = pytest.importorskip("zstandard")

ROWS = [("a fine film, \"truly\"", 1), ("dull, long, and loud", 0), ("I'd watch it again", 1),
        ("multi\nline text", 0), ("plain", 1)]
TEXTS, LABELS = [t for t, _ in ROWS], [y for _, y in ROWS]


def write_csv(path, header, rows, delimiter=","):
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f, delimiter=delimiter)
        if header:
            writer.writerow(header)
        writer.writerows(rows)
    return str(path)


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return str(path)


def same_examples(data, texts=TEXTS, labels=LABELS):
    assert data.train.texts == texts
    assert [data.labels[i] for i in data.train.targets] == [str(y) for y in labels]


def test_every_format_gives_the_same_examples(tmp_path):
    """CSV by name, TSV without a header by position (its quotes are text), JSON lines, Parquet (int64
    labels), and gzip / zstd copies of the text formats."""
    tsv_rows = [(y, t.replace("\n", " ")) for t, y in ROWS]
    specs = {
        "csv": (write_csv(tmp_path / "t.csv", ["text", "label"], ROWS), Columns(), True),
        "tsv": (str(tmp_path / "t.tsv"), Columns(text=1, label=0), False),
        "jsonl": (write_jsonl(tmp_path / "t.jsonl", [{"text": t, "label": y} for t, y in ROWS]), Columns(), True),
        "parquet": (str(tmp_path / "t.parquet"), Columns(text="sentence"), True),
    }
    (tmp_path / "t.tsv").write_text("".join(f"{y}\t{t}\n" for y, t in tsv_rows), encoding="utf-8")
    pq.write_table(pa.table({"sentence": TEXTS, "label": pa.array(LABELS, pa.int64())}), tmp_path / "t.parquet")
    for kind in ("csv", "tsv", "jsonl"):
        raw = open(specs[kind][0], "rb").read()
        (tmp_path / f"z.{kind}.gz").write_bytes(gzip.compress(raw))
        (tmp_path / f"z.{kind}.zst").write_bytes(zstandard.ZstdCompressor().compress(raw))
        for suffix in ("gz", "zst"):
            specs[f"{kind}.{suffix}"] = (str(tmp_path / f"z.{kind}.{suffix}"), *specs[kind][1:])
    for kind, (spec, columns, header) in specs.items():
        data = load_labelled(spec, spec, columns=columns, header=header)
        expected = [t.replace("\n", " ") for t in TEXTS] if kind.startswith("tsv") else TEXTS
        same_examples(data, texts=expected)
        assert data.labels == ("0", "1") and data.valid.texts == data.train.texts, kind


def test_a_csv_header_may_be_named_by_position_and_a_byte_order_mark_is_not_a_name(tmp_path):
    path = tmp_path / "excel.csv"
    path.write_bytes(b"\xef\xbb\xbftext,label\r\n" + "".join(f'"{t.replace(chr(34), 2 * chr(34))}",{y}\r\n' for t, y in ROWS).encode())
    same_examples(load_labelled(str(path), str(path)))
    same_examples(load_labelled(str(path), str(path), columns=Columns(text=0, label=1)))


def test_labels_are_numbered_by_value_not_by_row_order():
    assert label_names({"10", "2", "1"}) == ("1", "2", "10")  # integers numerically: GLUE's 0/1 stay 0/1
    assert label_names({"pos", "neg", "neutral"}) == ("neg", "neutral", "pos")
    assert label_names({"1", "b"}) == ("1", "b")


def test_an_integer_label_is_one_class_however_it_is_written(tmp_path):
    spec = write_jsonl(tmp_path / "t.jsonl", [{"text": str(i), "label": y} for i, y in enumerate(
        [1, "1", 1.0, "1.0", " 01 ", "-2", -2, True, "pos"])])
    data = load_labelled(spec, spec)
    assert data.labels == ("-2", "1", "pos", "true")
    assert [data.labels[i] for i in data.train.targets] == ["1"] * 5 + ["-2", "-2", "true", "pos"]


def test_string_labels_and_text_pairs(tmp_path):
    rows = [("a man sleeps", "a person rests", "entailment"), ("a cat", "a dog", "contradiction"),
            ("it rains", "it is wet", "entailment"), ("x", "", "neutral"), ("q", "r", "neutral")]
    spec = write_csv(tmp_path / "nli.csv", ["premise", "hypothesis", "gold"], rows)
    data = load_labelled(spec, spec, columns=Columns(text="premise", text_pair="hypothesis", label="gold"))
    assert data.labels == ("contradiction", "entailment", "neutral")
    assert data.train.pairs == ["a person rests", "a dog", "it is wet", "r"]  # the empty second text is skipped
    assert data.id2label == {0: "contradiction", 1: "entailment", 2: "neutral"} and data.label2id["neutral"] == 2
    assert f"{spec}: 1 rows with an empty text skipped (the first at {spec}:5)" in data.notes


def test_regression_targets_are_floats(tmp_path):
    spec = write_jsonl(tmp_path / "sts.jsonl", [{"a": "x", "b": "y", "score": s} for s in (0.2, 4, "3.8")])
    data = load_labelled(spec, spec, task="regression", columns=Columns(text="a", text_pair="b", label="score"))
    assert data.labels is None and data.train.targets == [0.2, 4.0, 3.8]


def one_line(excinfo) -> str:
    message = str(excinfo.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize("rows, options, kind, expected", [
    ([["t", "1"]], {"columns": Columns(label="gold")}, DataError,
     ":2: no column 'gold' (task.label); the columns there are: text, label; set task.label to the one to read"),
    ([["t", "1"]], {"columns": Columns(text=0, label=5)}, DataError,
     ":2: no column 5 for task.label (this row has 2 columns, counted from 0)"),
    ([["t", "pos"], ["u", "pos"]], {}, DataError, "every label is 'pos'; classification needs at least two classes"),
    ([["t", "0.5"], ["u", "high"]], {"task": "regression"}, DataError,
     ":3: column 'label' is 'high', expected a finite number (task: regression)"),
    ([["t", "0.5"], ["u", "nan"]], {"task": "regression"}, DataError, ":3: column 'label' is 'nan', expected a finite"),
    ([["t", "1"], ["u", ""]], {}, DataError, ":3: the label (column 'label') is empty"),
    ([["t", "1"], ["u", "3.8"]], {}, DataError, ":3: label '3.8' (column 'label'): expected a class name or an "
                                                "integer (fractional targets are task: regression)"),
    ([["", "1"], [" ", "0"]], {}, DataError, "no examples (2 rows with an empty text)"),
    ([["t", "1"]], {"header": False}, ConfigError, "task.text: 'text' names a column, but the file is read "
                                                   "without a header (task.header: false); give its position"),
    ([["t", "1"]], {"columns": Columns(text="label")}, ConfigError, "must be different columns"),
    ([["t", "1"]], {"task": "ranking"}, ConfigError, "task: got 'ranking', expected one of classification, regression"),
])
def test_bad_input_is_one_line_naming_file_row_and_column(tmp_path, rows, options, kind, expected):
    spec = write_csv(tmp_path / "train.csv", ["text", "label"], rows)
    with pytest.raises(kind) as excinfo:
        load_labelled(spec, spec, **options)
    assert expected in one_line(excinfo)


def test_a_validation_label_never_seen_in_training_is_refused(tmp_path):
    train = write_csv(tmp_path / "train.csv", ["text", "label"], [["a", "neg"], ["b", "pos"]])
    valid = write_csv(tmp_path / "valid.csv", ["text", "label"], [["c", "pos"], ["d", "neutral"]])
    with pytest.raises(DataError) as excinfo:
        load_labelled(train, valid)
    assert one_line(excinfo) == (f"{valid}:3: label 'neutral' never occurs in the training data {train} "
                                 "(its labels: neg, pos)")


@pytest.mark.parametrize("name, content, expected", [
    ("data.xlsx", b"x", "expected a .csv, .tsv, .jsonl, .csv.gz"),
    ("latin1.csv", "text,label\ncafe,sea\ntea,th\xe9\n".encode("latin-1"), "latin1.csv:3: label 'th\ufffd'"),
    ("bad.jsonl", b'{"text": "a", "label": 1}\n{"text": \n', "bad.jsonl:2: invalid JSON"),
    ("list.jsonl", b'["a", 1]\n', "list.jsonl:1: expected a JSON object with named fields, got list"),
    ("trunc.csv.gz", gzip.compress(b"text,label\na,1\nb,0\n", mtime=0)[:-8], "gzip stream ends before its end marker"),
])
def test_unreadable_files_are_one_line(tmp_path, name, content, expected):
    (tmp_path / name).write_bytes(content)
    with pytest.raises(DataError) as excinfo:
        load_labelled(str(tmp_path / name), str(tmp_path / name))
    assert expected in one_line(excinfo)


def test_missing_file_is_named(tmp_path):
    with pytest.raises(DataError, match="no such file"):
        load_labelled(str(tmp_path / "nope.csv"))


def test_held_out_share_is_stratified_seeded_and_disjoint(tmp_path):
    rows = [[f"text {i}", label] for i, label in enumerate(["a"] * 60 + ["b"] * 30 + ["c"] * 10)]
    spec = write_csv(tmp_path / "train.csv", ["text", "label"], rows)
    data = load_labelled(spec, valid_fraction=0.2, seed=3)
    assert Counter(data.labels[i] for i in data.valid.targets) == {"a": 12, "b": 6, "c": 2}  # 20% of each class
    assert sorted(data.train.texts + data.valid.texts) == sorted(r[0] for r in rows)
    assert data.train.texts == [r[0] for r in rows if r[0] in set(data.train.texts)]  # file order kept
    assert load_labelled(spec, valid_fraction=0.2, seed=3).valid.texts == data.valid.texts
    assert load_labelled(spec, valid_fraction=0.2, seed=4).valid.texts != data.valid.texts
    assert data.notes == [f"no validation data: 20 of the 100 examples of {spec} held out for validation "
                          "(fraction 0.2, seed 3, stratified by label)"]


def test_stratified_holdout_keeps_a_training_example_of_every_class():
    held = stratified_holdout([0, 0, 0, 0, 1, 2, 2], fraction=0.5, seed=0)
    targets = [0, 0, 0, 0, 1, 2, 2]
    assert Counter(targets[i] for i in held) == {0: 2, 2: 1}  # the single 1 stays in training
    assert stratified_holdout([0, 1, 0, 1], fraction=0.1, seed=0) != []  # shares that round to none: one example


def test_too_few_examples_to_hold_out_any_are_refused(tmp_path):
    spec = write_csv(tmp_path / "train.csv", ["text", "label"], [["a", "x"], ["b", "y"]])
    with pytest.raises(DataError, match="2 examples are too few to hold out 0.1 of them"):
        load_labelled(spec)


def test_stdlib_topics_is_a_deterministic_labelled_set_with_disjoint_splits():
    data = load_labelled("stdlib:topics:train", "stdlib:topics:valid")
    assert data.labels == tuple(sorted(TOPICS)) and data.notes == []
    assert set(data.train.texts).isdisjoint(data.valid.texts)
    assert set(data.valid.targets) == set(range(len(TOPICS)))  # every topic in both splits
    everything = load_labelled("stdlib:topics", "stdlib:topics:valid").train
    assert len(everything) == len(data.train) + len(data.valid)
    assert 0.15 < len(data.valid) / len(everything) < 0.25
    json_docs = [t for t, y in zip(data.train.texts, data.train.targets) if data.labels[y] == "json"]
    assert any("JSON" in text for text in json_docs)
    with pytest.raises(DataError, match="expected stdlib:topics, stdlib:topics:train or stdlib:topics:valid"):
        load_labelled("stdlib:topics:test")


@pytest.mark.parametrize("header, columns, read", [
    (["label", "sentence"], Columns(), "'sentence' as the text"),  # SST-2 as published
    (["sentence1", "sentence2", "label"], Columns(), "'sentence1' and 'sentence2' as a text pair"),  # MRPC
    (["premise", "hypothesis", "label"], Columns(), "'premise' and 'hypothesis' as a text pair"),  # MNLI
    (["question", "sentence", "label"], Columns(), "'question' and 'sentence' as a text pair"),  # QNLI
    (["question", "label"], Columns(), "'question' as the text"),
    (["question", "answer", "label"], Columns(text_pair="answer"), "'question' as the text"),  # the pair named
])
def test_a_file_without_a_text_column_is_read_by_huggingfaces_usual_names(tmp_path, header, columns, read):
    """As run_glue.py does, saying which columns it took; a column the recipe names is never replaced."""
    rows = [[{"label": str(i % 2)}.get(name, f"{name} {i}") for name in header] for i in range(6)]
    path = write_csv(tmp_path / "train.tsv", header, rows, delimiter="\t")
    data = load_labelled(str(path), str(path), columns=columns)
    assert data.notes[0] == f"{path}: no column 'text'; reading {read}, as HuggingFace's run_glue.py does (set " \
                            "task.text / task.text_pair to choose)"
    first = dict(zip(header, rows[0]))
    assert data.train.texts[0] == first[read.split("'")[1]]
    assert (data.train.pairs is None) == ("pair" not in read and columns.text_pair is None)


def test_a_named_column_that_is_missing_is_an_error_not_a_guess(tmp_path):
    path = write_csv(tmp_path / "train.csv", ["label", "sentence"], [["0", "a"], ["1", "b"]])
    with pytest.raises(DataError, match=r"no column 'review' \(task.text\); the columns there are: label, "
                                        r"sentence; set task.text to the one to read"):
        load_labelled(str(path), columns=Columns(text="review"))
