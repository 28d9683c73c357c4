"""`tfkit plan` of a fine-tuning recipe (trainer/finetune_plan.py): the checkpoint's model kept, read from its
config.json; the micro-batch and accumulation that fit memory; updates and epochs in the budget; and a
`finetune` whose hand-given batch does not fit refused before training with the accumulation that fits."""

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tfkit.cli.main import app
from tfkit.errors import ConfigError
from tfkit.trainer import fits
from tfkit.trainer import pace as pace_module
from tfkit.trainer.budget import EVAL_COST, VALIDATIONS
from tfkit.trainer.finetune_plan import plan_finetune
from tfkit.trainer.fits import parse_memory
from tfkit.trainer.pace import Pace
from tfkit.trainer.recipe import load_recipe

from helpers import one_error_line

OLD = Path(__file__).parent / "data" / "checkpoints-cd30549"  # a tiny GPT run and labelled rows
SETS = [f"train.init_from={OLD / 'gpt-run'}", f"data.train={OLD / 'labels.csv'}", "data.valid=null",
        "data.seq_len=32", "train.batch_size=8"]


class FixedPace:
    """0.01 s per update whatever the shape; records the micro-batches it was asked to time."""

    def __init__(self):
        self.rows = []

    def __call__(self, recipe, cfg, batch, head):
        self.rows.append(batch["labels"].shape[0])
        return Pace(seconds=0.01, wall=0.01, tokens=int(batch["input_ids"].numel()) * recipe.train.grad_accum)


def test_a_finetuning_plan_keeps_the_checkpoints_model_and_fits_its_micro_batch():
    machine = FixedPace()
    plan = plan_finetune(load_recipe("finetune-classify", SETS), budget=60, measure=machine)
    assert (plan.recipe.model.arch, plan.recipe.model.d_model) == ("gpt", 16)  # the checkpoint's, not bert-tiny
    assert plan.recipe.train.grad_accum == 1 and machine.rows == [8]
    assert plan.updates > 0 and plan.epochs == pytest.approx(plan.updates * 8 / plan.examples)
    text = plan.text()
    for words in ("fine-tuning", "the checkpoint's: not planned", "micro-batch 8 x 1", "predicted peak per device",
                  "tokens/s predicted", "epochs of", "the recipe's train.max_steps=150"):
        assert words in text, text
    tight = plan_finetune(load_recipe("finetune-classify", SETS), budget=60, measure=FixedPace(),
                          memory_limit=plan.memory.peak - 1)
    assert tight.recipe.train.grad_accum > 1 and tight.memory.peak < plan.memory.peak  # fewer rows at a time
    with pytest.raises(ConfigError, match=r"memory: the model of .*gpt-run.* needs .* at micro-batch 1, above"):
        plan_finetune(load_recipe("finetune-classify", SETS), budget=60, measure=FixedPace(),
                      memory_limit=parse_memory("1MiB"))


def test_a_finetuning_plan_counts_the_validations_of_train_eval_every():
    """Each validation scores every validation example forward only (EVAL_COST of a training row), at the
    budget's VALIDATIONS + 1 points and every train.eval_every updates: frequent ones leave fewer updates."""
    sparse = plan_finetune(load_recipe("finetune-classify", [*SETS, "train.eval_every=100000"]), budget=60,
                           measure=FixedPace())
    dense = plan_finetune(load_recipe("finetune-classify", [*SETS, "train.eval_every=1"]), budget=60,
                          measure=FixedPace())
    valid = 40 - sparse.examples  # labels.csv's 40 rows less the training ones: the recipe's 0.1 held out
    assert valid == 4
    fixed = (VALIDATIONS + 1) * valid * EVAL_COST / 8  # in updates of 8 rows
    assert sparse.updates == pytest.approx(60 / 0.01 - fixed, abs=2)
    assert dense.updates == pytest.approx(sparse.updates / (1 + valid * EVAL_COST / 8), abs=2)


def test_plan_command_plans_a_finetuning_recipe(monkeypatch):
    monkeypatch.setattr(pace_module, "measure_pace", lambda recipe, cfg, device, **kw: FixedPace()(
        recipe, cfg, kw["batch"], kw["head"]))
    result = CliRunner().invoke(app, ["plan", "finetune-classify", "--time", "2m",
                                      *[a for s in SETS for a in ("--set", s)]])
    assert result.exit_code == 0, result.output
    assert "plan for finetune-classify (fine-tuning): 2 min" in result.output
    run_it = next(line for line in result.output.splitlines() if line.startswith("run it:"))
    assert run_it.startswith("run it: tfkit finetune finetune-classify") and "train.grad_accum=1" in run_it


def test_size_auto_stays_refused_for_finetuning():
    with pytest.raises(ConfigError, match=r"model.size: auto plans a model to pretrain"):
        load_recipe("finetune-classify", SETS + ["model.size=auto", "train.max_time=1m"])


def test_finetune_with_a_batch_that_does_not_fit_says_so_before_training(monkeypatch, tmp_path):
    monkeypatch.setattr(fits, "default_memory_limit", lambda device: parse_memory("150MiB"))
    run = tmp_path / "run"
    args = [a for s in SETS + ["train.batch_size=4096"] for a in ("--set", s)]
    line = one_error_line(CliRunner().invoke(app, ["finetune", "finetune-classify", "--run-dir", str(run), *args]))
    assert "model: this run's predicted peak memory is" in line and "at micro-batch 4096, above the 150 MiB" in line
    assert "train.grad_accum=" in line and "fits (micro-batch" in line
    assert not run.exists()


def test_pretraining_on_from_a_checkpoint_is_checked_on_the_checkpoints_model(monkeypatch, tmp_path):
    """gpt-tiny's own keys say d_model 128; the run trains init_from's d_model 16, which is what must fit."""
    monkeypatch.setattr(fits, "default_memory_limit", lambda device: parse_memory("150MiB"))
    sets = [f"train.init_from={OLD / 'gpt-run'}", f"data.train={OLD / 'corpus.txt'}", "data.valid=null",
            "data.seq_len=32", "train.batch_size=4096"]
    result = CliRunner().invoke(app, ["pretrain", "gpt-tiny", "--run-dir", str(tmp_path / "run"),
                                      *[a for s in sets for a in ("--set", s)]])
    line = one_error_line(result)
    assert "at micro-batch 4096, above the 150 MiB" in line and "train.grad_accum=" in line
    with pytest.raises(ConfigError) as tiny:  # the recipe's own d_model 128 would need more
        fits.check_fits(load_recipe("gpt-tiny", sets[1:]), "cpu", limit=parse_memory("150MiB"))
    assert peak(str(tiny.value)) > peak(line)


def peak(message: str) -> int:
    return parse_memory(re.search(r"predicted peak memory is ([\d.,]+ [KMGT]iB)", message).group(1).replace(",", ""))
