"""`tfkit eval --task FILE` on a damaged task file: one line naming the file, the line and the field at fault,
exit 2, before any checkpoint is scored, and the `--json` file that held earlier results left as it was; a line
nested past the recursion limit is such a line too (it reads through the guarded JSON parser every reader
uses). Bytes that are not UTF-8 get the policy of every reader: replaced, with one warning naming the line."""

from __future__ import annotations

import json

import pytest
from fault_helpers import assert_one_line_error, cli

GOOD = {"context": "The cat sat on the", "choices": ["mat", "moon"], "gold": 0}

CASES = {  # what line 2 holds -> what the error names
    "no choices": ({"context": "A", "gold": 0}, [":2:", 'no "choices"']),
    "gold out of range": ({**GOOD, "gold": 2}, [":2:", '"gold" is 2', "0..1"]),
    "negative gold": ({**GOOD, "gold": -1}, [":2:", '"gold" is -1']),
    "gold a string": ({**GOOD, "gold": "0"}, [":2:", '"gold" is "0"']),
    "no gold": ({"context": "A", "choices": ["x", "y"]}, [":2:", 'no "gold"']),
    "one choice": ({**GOOD, "choices": ["mat"]}, [":2:", '"choices"', "at least 2"]),
    "a choice not text": ({**GOOD, "choices": ["mat", 3]}, [":2:", '"choices"']),
    "no context": ({"choices": ["x", "y"], "gold": 0}, [":2:", 'no "context"']),
    "not an object": ([1, 2], [":2:", "expected a JSON object"]),
    "not JSON": ("{context: 1", [":2:", "invalid JSON"]),
    "nested 200,000 deep": ("[" * 200_000 + "]" * 200_000, [":2:", "JSON nested too deeply to read"]),
    "an object nested 200,000 deep": ('{"a": ' * 200_000 + "1" + "}" * 200_000, [":2:", "nested too deeply"]),
}


@pytest.mark.parametrize("case", CASES)
def test_a_bad_task_line_is_one_line_naming_file_line_and_field(case, tiny_run, tmp_path):
    line, expected = CASES[case]
    task = tmp_path / "task.jsonl"
    task.write_text(json.dumps(GOOD) + "\n" + (line if isinstance(line, str) else json.dumps(line)) + "\n")
    earlier = tmp_path / "results.json"
    earlier.write_text('[{"checkpoint": "x", "acc": 0.5}]\n')
    result = cli(["eval", tiny_run[1], "--task", task, "--json", earlier])
    assert_one_line_error(result, str(task), *expected)
    assert earlier.read_text() == '[{"checkpoint": "x", "acc": 0.5}]\n'


def test_a_cloze_line_of_one_word_names_the_line(tiny_run, tmp_path):
    task = tmp_path / "lambada.jsonl"
    task.write_text('{"text": "she handed him the key"}\n{"text": "key"}\n')
    assert_one_line_error(cli(["eval", tiny_run[1], "--task", task]), f"{task}:2:", '"text"', "two words")


def test_an_empty_or_missing_task_file_is_one_line(tiny_run, tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    assert_one_line_error(cli(["eval", tiny_run[1], "--task", empty]), str(empty), "no items")
    assert_one_line_error(cli(["eval", tiny_run[1], "--task", tmp_path / "nope.jsonl"]), "nope.jsonl", "no such file")


def test_task_and_data_together_or_neither_is_one_line(tiny_run, tmp_path):
    task = tmp_path / "task.jsonl"
    task.write_text(json.dumps(GOOD) + "\n")
    assert_one_line_error(cli(["eval", tiny_run[1], "--task", task, "--data", task]), "--data", "--task")
    assert_one_line_error(cli(["eval", tiny_run[1]]), "--data", "--task")
    assert_one_line_error(cli(["eval", tiny_run[1], "--task", task, "--stride", "4"]), "--stride")


def test_a_task_line_that_is_not_utf8_is_scored_with_one_warning_naming_line_and_byte(tiny_run, tmp_path):
    task = tmp_path / "task.jsonl"
    bad = json.dumps({**GOOD, "context": "The caf\u00e9 sat on the"}, ensure_ascii=False).encode("latin-1")
    task.write_bytes((json.dumps(GOOD) + "\n").encode() + bad + b"\n")
    result = cli(["eval", tiny_run[1], "--task", task])
    assert result.exit_code == 0, result.output[-3000:]
    assert [line for line in result.stderr.splitlines() if "UTF-8" in line] == [
        f"warning: task {task}: 1 invalid UTF-8 byte replaced with U+FFFD, the first at {task}:2, "
        f"byte {bad.index(0xE9) + 1}"]
