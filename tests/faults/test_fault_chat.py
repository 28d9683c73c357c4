"""Chat fine-tuning (`data.format: chat`) refuses bad input in one line naming the file, line and field, and
leaves the checkpoint it starts from as it was."""

from __future__ import annotations

import json

import pytest
from fault_helpers import assert_one_line_error, changes, cli, snapshot, tiny_recipe

CHAT = ["--set", "data.format=chat", "--set", "data.valid=null", "--set", "data.seq_len=32",
        "--set", "train.max_steps=1"]


def _chats(path, *records) -> str:
    good = {"prompt": "hi", "response": "hello"}
    path.write_text("".join(json.dumps(r) + "\n" for r in [good] * 20 + list(records)))
    return str(path)


@pytest.mark.parametrize("record, fragments", [
    ({"messages": [{"role": "bot", "content": "x"}, {"role": "assistant", "content": "y"}]},
     (":21: field messages[0].role: got 'bot'", "expected one of system, user, assistant")),
    ({"messages": [{"role": "user", "content": "x"}]}, (":21: field messages: no assistant turn",)),
])
def test_a_bad_conversation_is_one_line_and_the_source_checkpoint_is_kept(record, fragments, tiny_run, tmp_path):
    recipe, run = tiny_run
    data = _chats(tmp_path / "chat.jsonl", record)
    before = snapshot(run)
    result = cli(["pretrain", recipe, "--run-dir", tmp_path / "sft", "--set", f"train.init_from={run}",
                  "--set", f"data.train={data}", *CHAT])
    assert_one_line_error(result, data, *fragments)
    assert changes(before, snapshot(run)) == []
    assert not (tmp_path / "sft").exists()


def test_a_turn_that_is_not_utf8_trains_with_one_warning_naming_line_and_byte(tiny_run, tmp_path):
    """The policy of every reader (a corpus's, a labelled file's): replaced, said once with where, not silently."""
    recipe, run = tiny_run
    data = tmp_path / "chat.jsonl"
    _chats(data)
    bad = json.dumps({"prompt": "hi", "response": "caf\u00e9"}, ensure_ascii=False).encode("latin-1")
    data.write_bytes(data.read_bytes() + bad + b"\n")
    result = cli(["pretrain", recipe, "--run-dir", tmp_path / "sft", "--set", f"train.init_from={run}",
                  "--set", f"data.train={data}", "--set", "train.batch_size=2", "--set", "eval.batch_size=1", *CHAT])
    assert result.exit_code == 0, result.output[-3000:]
    assert [line for line in result.stderr.splitlines() if "UTF-8" in line] == [
        f"warning: chat data {data}: 1 invalid UTF-8 byte replaced with U+FFFD, the first at {data}:21, "
        f"byte {bad.index(0xE9) + 1}"]


def test_an_encoder_checkpoint_is_refused_for_chat_fine_tuning(english_text, tmp_path):
    bert = tiny_recipe(tmp_path / "bert", english_text, model={"arch": "bert"}, objective={"name": "mlm"},
                       tokenizer={"kind": "wordpiece"}, train={"max_steps": 1, "save_every": 1})
    assert cli(["pretrain", bert, "--run-dir", tmp_path / "b"]).exit_code == 0
    result = cli(["pretrain", "sft-chat", "--run-dir", tmp_path / "sft", "--set", f"train.init_from={tmp_path / 'b'}",
                  "--set", f"data.train={_chats(tmp_path / 'chat.jsonl')}", *CHAT])
    assert_one_line_error(result, str(tmp_path / "b"), "a bert model; data.format: chat fine-tunes a GPT")
    assert not (tmp_path / "sft").exists()


def test_chat_on_a_model_never_fine_tuned_for_it_names_its_tokenizer(tiny_run):
    _, run = tiny_run
    assert_one_line_error(cli(["generate", run, "--chat", "hi"]), "has no chat token <|system|>")
    assert_one_line_error(cli(["generate", run, "--system", "be brief", "-p", "hi"]), "--system", "--chat")
