"""Labelled data with bytes that are not UTF-8, or cells longer than the csv module's default limit, through
`tfkit finetune`, `tfkit eval --data` and `tfkit predict`: one UTF-8 policy for every format. A class name
holding such a byte is refused in one line naming the file and its real line (a model must not learn a class
`hill\ufffd`); a text holding one is read with one `warning:` line naming the file, line and byte; a cell of
200,000 characters is read and cut to the row as documented, not refused as malformed CSV."""

from __future__ import annotations

import json
import re

import pytest
from fault_helpers import assert_one_line_error, cli

ROWS = [("a calm sea", "sea"), ("a green hill", "hill")] * 6
LONG = "the sea and the hill " * 10_000  # 210,000 characters: past the csv module's 131,072


def _finetune(run, data, out, *extra):
    return cli(["finetune", "finetune-classify", "--run-dir", out, "--set", f"train.init_from={run}",
                "--set", f"data.train={data}", "--set", "data.valid=null", "--set", "data.valid_fraction=0.25",
                "--set", "data.seq_len=32", "--set", "train.max_steps=1", "--set", "train.batch_size=4",
                "--set", "train.eval_every=1", "--set", "train.device=cpu", "--set", "log.progress=false",
                "--set", "log.plot=false", *extra])


def _csv(path, rows, sep=",", encoding="utf-8"):
    path.write_bytes("".join(f"{t}{sep}{y}\n" for t, y in [("text", "label"), *rows]).encode(encoding))
    return path


@pytest.fixture(scope="module")
def classifier(tiny_run, tmp_path_factory):
    """A classifier fine-tuned one step on a CSV with a 210,000-character cell (refused as malformed CSV before)."""
    folder = tmp_path_factory.mktemp("classifier")
    data = _csv(folder / "long.csv", [*ROWS, (LONG, "sea")])
    result = _finetune(tiny_run[1], data, folder / "run")
    assert result.exit_code == 0, result.output[-3000:]
    return folder / "run"


def test_a_cell_past_the_csv_modules_limit_is_read_and_cut_to_the_row(classifier):
    start = (classifier / "start.log").read_text()
    assert re.search(r"data: 1 cut \(head\) of \d+ (training|validation) rows at data.seq_len=32", start), start


@pytest.mark.parametrize("kind", ["csv", "tsv", "jsonl"])
def test_a_class_name_that_is_not_utf8_is_one_line_naming_its_row(kind, tiny_run, tmp_path):
    rows = [*ROWS[:4], ("a high hill", "h\xe9ll")]  # Latin-1 é on the file's line 6 (line 5 of JSON lines)
    if kind == "jsonl":
        data = tmp_path / "train.jsonl"
        text = "".join(json.dumps({"text": t, "label": y}, ensure_ascii=False) + "\n" for t, y in rows)
        data.write_bytes(text.encode("latin-1"))
        line = 5
    else:
        data = _csv(tmp_path / f"train.{kind}", rows, sep="," if kind == "csv" else "\t", encoding="latin-1")
        line = 6
    result = _finetune(tiny_run[1], data, tmp_path / "run")
    assert_one_line_error(result, f"{data}:{line}: label 'h\ufffdll'", "U+FFFD", "UTF-8")
    assert not (tmp_path / "run").exists()


def test_a_text_that_is_not_utf8_trains_with_one_warning_naming_line_and_byte(tiny_run, tmp_path):
    data = _csv(tmp_path / "train.csv", [*ROWS, ("caf\xe9 by the sea", "sea")], encoding="latin-1")
    result = _finetune(tiny_run[1], data, tmp_path / "run")
    assert result.exit_code == 0, result.output[-3000:]
    warnings = [line for line in result.stderr.splitlines() if "UTF-8" in line]
    assert warnings == [f"warning: labelled data {data}: 1 invalid UTF-8 byte replaced with U+FFFD, the first at "
                        f"{data}:14, byte 4"]


def test_eval_refuses_a_class_name_that_is_not_utf8_and_predict_warns_of_a_text(classifier, tmp_path):
    data = _csv(tmp_path / "test.csv", [("a calm sea", "sea"), ("a hill", "h\xe9ll")], encoding="latin-1")
    assert_one_line_error(cli(["eval", classifier, "--data", data]), f"{data}:3: label 'h\ufffdll'", "U+FFFD")
    texts = _csv(tmp_path / "texts.csv", [("a calm sea", "sea"), ("caf\xe9", "hill")], encoding="latin-1")
    result = cli(["predict", classifier, "--data", texts, "--out", tmp_path / "p.jsonl"])
    assert result.exit_code == 0, result.output[-3000:]
    assert [line for line in result.stderr.splitlines() if "UTF-8" in line] == [
        f"warning: labelled data {texts}: 1 invalid UTF-8 byte replaced with U+FFFD, the first at {texts}:3, byte 4"]
    assert len((tmp_path / "p.jsonl").read_text().splitlines()) == 2
