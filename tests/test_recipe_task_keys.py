"""Every key of a fine-tuning recipe's `task` section is checked when the recipe loads, as every other key is:
`tfkit recipes validate` names a bad one in its one line, and `tfkit finetune` refuses it before a run folder
is claimed (it used to fail after, inside the trainer, when the head was built)."""

import json

import pytest
from typer.testing import CliRunner

from tfkit.cli.main import app
from tfkit.trainer.recipe import load_recipe
from tfkit.trainer.sections import TaskSection
from helpers import one_error_line

runner = CliRunner()


@pytest.mark.parametrize("key, value, says", [
    ("pooling", "bogus", "task.pooling: got 'bogus', expected null (the family's own) or one of cls, last, mean"),
    ("label", -1, "task.label: got -1, expected a column name or a position (0, 1, ...)"),
    ("text", "", "task.text: got '', expected a column name or a position (0, 1, ...)"),
    ("text_pair", "label", "task: text, text_pair and label must be different columns"),
    ("truncation", "middle", "task.truncation: got 'middle', expected one of head, tail, head+tail"),
    ("stride", 0, "task.stride: got 0, expected a positive integer or null"),
    ("dropout", 1.5, "task.dropout"),
    ("metric", "f1", "task.metric: got 'f1', expected auto or one of"),
])
def test_each_task_key_names_its_value_and_what_it_may_be(key, value, says):
    problems = TaskSection(**{key: value}).problems()
    assert len(problems) == 1 and says in problems[0], problems


def test_every_task_problem_is_reported_at_once():
    problems = TaskSection(pooling="max", label=-2, truncation="both").problems()
    assert [p.split(":")[0] for p in problems] == ["task.label", "task.pooling", "task.truncation"]


def test_a_random_init_control_is_checked_against_its_own_family():
    """Without train.init_from the recipe's model.arch is the body's, so a pooling it lacks is known now; with
    a checkpoint the family is the checkpoint's, checked once the trainer has read it."""
    control = ["train.init_from=null", "tokenizer.path=tok", "task.pooling=last"]
    with pytest.raises(Exception, match=r"task.pooling: 'last' is not a pooling of bert models \(model.arch\), "
                                        "which pool cls or mean"):
        load_recipe("finetune-classify", control)
    assert load_recipe("finetune-classify", ["task.pooling=last"]).task.pooling == "last"  # init_from: its arch


def test_recipes_validate_refuses_a_bad_pooling_in_one_line_exit_2():
    result = runner.invoke(app, ["recipes", "validate", "finetune-classify", "--set", "task.pooling=bogus"])
    line = one_error_line(result)
    assert "task.pooling" in line and "'bogus'" in line and "cls, last, mean" in line


def test_finetune_refuses_a_bad_pooling_before_claiming_a_run_folder(tmp_path, english_file):
    from tfkit.tokenization.train import TokenizerSpec, train_tokenizer

    tokenizer = tmp_path / "tokenizer"
    text = english_file.read_text(encoding="utf-8")[:20_000].split("\n")
    train_tokenizer(TokenizerSpec(kind="wordpiece", vocab_size=200), text, tokenizer, show_progress=False)
    rows = "".join(f"{'good' if i % 2 else 'bad'} words number {i},{i % 2}\n" for i in range(40))
    (tmp_path / "train.csv").write_text("text,label\n" + rows)
    recipe = {"model": {"arch": "bert", "d_model": 32, "n_layers": 1, "n_heads": 2, "max_seq_len": 32},
              "tokenizer": {"path": str(tokenizer)}, "data": {"train": str(tmp_path / "train.csv"), "valid": None,
                                                            "seq_len": 32},
              "objective": {"name": "classify"}, "task": {"pooling": "bogus"},
              "train": {"max_steps": 2, "batch_size": 4, "device": "cpu"},
              "log": {"progress": False, "plot": False, "tensorboard": False}}
    (tmp_path / "bad.yaml").write_text(json.dumps(recipe))
    run_dir = tmp_path / "run"
    line = one_error_line(runner.invoke(app, ["finetune", str(tmp_path / "bad.yaml"), "--run-dir", str(run_dir)]))
    assert "task.pooling" in line and "'bogus'" in line
    assert not run_dir.exists()
