"""The recipes a first-time user runs are planned (`model.size: auto`): the quickstart and `small-corpus` train
the model sized for their train.max_time on the machine at hand, and the report says how many of the planned
updates ran. Every run here has a fixed pace and a fixed clock (tests/helpers.py), so what it trains is the
same on any machine."""

import re

from typer.testing import CliRunner

from tfkit.cli.main import app
from tfkit.trainer.recipe import load_recipe

from helpers import TINY, fake_machine, fixed_pace

SMALL_RUN = [s for s in TINY if not s.startswith(("train.max_steps", "schedule.warmup_steps"))] + [
    "train.max_time=3s", "model.d_model=32", "train.log_every=1000", "train.eval_every=100000",
    "train.save_every=100000", "schedule.warmup_steps=2"]


def _run(tmp_path, recipe: str, english_file, *sets: str):
    args = [a for s in [f"data.train={english_file}", "data.valid=null", *SMALL_RUN, *sets] for a in ("--set", s)]
    return CliRunner().invoke(app, ["pretrain", recipe, "--run-dir", str(tmp_path / "run"), *args])


def test_the_first_recipes_a_user_runs_are_planned_and_keep_their_tuned_keys():
    quick, small = load_recipe("quickstart"), load_recipe("small-corpus")
    for recipe in (quick, small):
        assert recipe.model.size == "auto" and recipe.train.max_time is not None and recipe.problems() == []
    assert (small.optim.name, small.tokenizer.vocab_size, small.model.dropout) == ("muon", 2048, 0.05)
    assert not {"model.d_model", "model.n_layers", "model.n_heads"} & set(small.given)  # the plan's to choose


def test_the_report_says_how_many_of_the_planned_updates_ran(tmp_path, english_file, monkeypatch):
    fixed_pace(monkeypatch, seconds=0.01)  # the plan: ~3 s / 0.01 s, less its validations: ~300 updates
    fake_machine(monkeypatch, update=0.02)  # the run: twice as slow as measured, so fewer than half of them run
    result = _run(tmp_path, "quickstart", english_file)
    assert result.exit_code == 0, result.output
    assert "plan for quickstart" in result.output
    out = " ".join(result.output.split())
    assert "updates planned for train.max_time=3s ran" in out and "of the recipe's" not in out
    assert "planned; fitted in train.max_time=3s" in out


def test_a_run_faster_than_planned_trains_on_to_the_end_of_its_budget(tmp_path, english_file, monkeypatch):
    fixed_pace(monkeypatch, seconds=0.01)  # ~300 updates planned, train.max_steps twice that: a cap only
    fake_machine(monkeypatch, update=0.005)  # the run's updates: twice as fast as measured
    result = _run(tmp_path, "small-corpus", english_file)
    assert result.exit_code == 0, result.output
    out = " ".join(result.output.split())
    assert "plan for small-corpus" in out and "note:" not in out
    steps, planned = (int(x.replace(",", "")) for x in
                      re.search(r"│ steps │ ([\d,]+) \(([\d,]+) planned; fitted in train.max_time=3s", out).groups())
    assert steps > planned  # the budget, not the prediction, ended it
