"""`tfkit pretrain` through the real app: the bundled tiny recipes clearly lower the validation loss on
English prose in CI-sized runs, Ctrl-C semantics are reported by exit code, and user errors are one line."""

import json
import random
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tfkit.checkpoints.run_record import read_metrics
from tfkit.cli.main import app

CI_SIZED = ["train.max_steps=60", "train.batch_size=8", "data.seq_len=64", "schedule.warmup_steps=10",
            "train.eval_every=1000", "train.save_every=1000", "train.log_every=20", "eval.batches=4",
            "tokenizer.vocab_size=1024", "data.valid=null", "data.valid_fraction=0.1", "log.progress=false",
            "log.plot=false", "train.device=cpu"]


def _args(*sets: str) -> list[str]:
    return [arg for s in sets for arg in ("--set", s)]


@pytest.fixture(scope="module")
def english(english_text: str, tmp_path_factory) -> Path:
    """300 kB of English prose as the training file, its paragraphs in a seeded random order. The docstrings
    come sorted by module, so the tail that data.valid_fraction holds out would otherwise be other modules'
    prose (distutils), unlike the first 90%: a shift the loss is not meant to measure."""
    paragraphs = english_text.split("\n\n")
    random.Random(0).shuffle(paragraphs)
    path = tmp_path_factory.mktemp("corpus") / "english.txt"
    path.write_text("\n\n".join(paragraphs)[:300_000], encoding="utf-8")
    return path


@pytest.mark.parametrize("recipe", ["gpt-tiny", "bert-tiny"])
def test_tiny_recipes_lower_the_validation_loss_on_english(recipe, english, tmp_path):
    run_dir = tmp_path / recipe
    result = CliRunner().invoke(app, ["pretrain", recipe, "--run-dir", str(run_dir),
                                      *_args(*CI_SIZED, f"data.train={english}")])
    assert result.exit_code == 0, result.output + repr(result.exception)
    valid = [r for r in read_metrics(run_dir / "metrics.jsonl") if "val_loss" in r]
    first, last = valid[0], valid[-1]
    print(f"{recipe}: val loss {first['val_loss']:.3f} (step 0) -> {last['val_loss']:.3f} (step {last['step']}), "
          f"accuracy {first['val_accuracy']:.3f} -> {last['val_accuracy']:.3f}")
    assert (first["step"], last["step"]) == (0, 60)
    # MLM learns from the ~15% masked tokens only: 1/6.7 of the labels a causal LM gets from the same batch
    assert last["val_loss"] < first["val_loss"] - (1.0 if recipe == "gpt-tiny" else 0.5)
    assert last["val_accuracy"] > first["val_accuracy"]
    assert "validation loss" in result.output and "perplexity" in result.output
    checkpoint = run_dir / "checkpoints" / "step-60"
    assert json.loads((checkpoint / "config.json").read_text())["objective"] == ("clm" if recipe == "gpt-tiny" else "mlm")
    if recipe == "gpt-tiny":
        assert "sample:" in result.output  # eval.sample_prompt continued by the trained model


def test_a_recipe_mistake_is_one_red_line_with_exit_code_2(tmp_path):
    result = CliRunner().invoke(app, ["pretrain", "gpt-tiny", "--run-dir", str(tmp_path), "--set", "train.max_step=3"])
    assert result.exit_code == 2
    assert "train.max_step: unknown key (did you mean 'max_steps'?)" in result.output
    assert "Traceback" not in result.output


def test_resume_from_a_folder_without_checkpoints_is_an_error(tmp_path):
    result = CliRunner().invoke(app, ["pretrain", "gpt-tiny", "--resume", str(tmp_path)])
    assert result.exit_code == 2
    assert "not a training checkpoint" in result.output


def test_help_is_the_docstring():
    result = CliRunner().invoke(app, ["pretrain", "--help"])
    assert result.exit_code == 0
    assert "Pretrain a model from a recipe" in result.output and "--resume" in result.output
