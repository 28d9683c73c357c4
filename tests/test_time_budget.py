"""train.max_time: the run ends when its time is spent, its schedule decayed over the steps that fit."""

import json

import pytest
from typer.testing import CliRunner

from tfkit.cli.main import app
from tfkit.errors import ConfigError
from tfkit.trainer.budget import MARGIN, TimeBudget, parse_duration
from tfkit.trainer.recipe import load_recipe

from helpers import Clock, fake_machine


@pytest.mark.parametrize("text,seconds", [("90s", 90), ("3m", 180), ("1h30m", 5400), ("1.5h", 5400), (45, 45),
                                          ("2m 30s", 150)])
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("bad", ["5 minutes", "0s", "-3m", "m", True, "90x"])
def test_a_bad_duration_names_the_key_and_the_forms(bad):
    with pytest.raises(ConfigError, match=r"train.max_time: got .*expected a .*duration such as 90s, 3m or 1h30m"):
        parse_duration(bad)
    with pytest.raises(ConfigError, match="train.max_time"):
        load_recipe("gpt-tiny", [f"train.max_time={bad}"])


def test_the_horizon_is_the_steps_that_fit_after_what_the_end_needs():
    clock = Clock()
    budget = TimeBudget(100.0, clock=clock)
    assert budget.horizon(0, cap=10_000) == 10_000  # nothing timed yet: the cap
    clock.now = 10.0  # data preparation and the baseline validation: spent, not the pace
    budget.took("validation", 2.0)
    budget.start(0)
    clock.now = 20.0  # 20 updates in 10 s: 0.5 s each
    left = 100 * (1 - MARGIN) - 20.0 - 2.0
    assert budget.horizon(20, cap=10_000) == 20 + int(left / 0.5)
    assert budget.horizon(20, cap=50) == 50  # max_steps stays a cap
    assert budget.window_cap(20) == int(0.05 * 100 / 0.5)  # windows of ~5% of the budget once paced
    assert TimeBudget(100.0, clock=clock).window_cap(0) == 3  # a few updates first: one window must not outlast it
    budget.took("checkpoint", 30.0)
    clock.now = 99.0
    assert budget.horizon(40, cap=10_000) == 40  # spent: end now
    resumed = TimeBudget(100.0, spent_before=60.0, clock=clock)
    assert resumed.spent() == 60.0  # a resume continues the budget where the run left it


def test_a_time_limited_run_ends_in_time_with_its_schedule_decayed(english_file, tmp_path, monkeypatch):
    fake_machine(monkeypatch)  # the steps that fit in 2 s are the same on any machine
    run = tmp_path / "run"
    sets = [f"data.train={english_file}", "train.max_steps=100000", "train.max_time=2s", "train.batch_size=4",
            "data.seq_len=32", "eval.batches=1", "eval.batch_size=4", "tokenizer.vocab_size=400",
            "tokenizer.max_train_mb=0.1", "log.progress=false", "log.plot=false", "log.tensorboard=false",
            "eval.sample_prompt=null", "train.threads=1", "train.log_every=7", "train.eval_every=20",
            "train.save_every=20", "schedule.warmup_steps=5", "schedule.min_lr=1e-4"]
    result = CliRunner().invoke(app, ["pretrain", "gpt-tiny", "--run-dir", str(run),
                                      *[a for s in sets for a in ("--set", s)]])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train_rows = [r for r in rows if "loss" in r and "val_loss" not in r]
    last = train_rows[-1]
    steps = max(int(p.name.split("-")[1]) for p in (run / "checkpoints").iterdir())
    assert 5 < steps < 100000 and last["step"] == steps  # ended early, its last update logged
    assert last["lr"] < 3e-3 / 2  # the schedule decayed over the steps that fit (peak 3e-3)
    config = json.loads((run / "checkpoints" / f"step-{steps}" / "config.json").read_text())
    assert "as many steps as fit in 2s" in result.stdout and f"{steps:,} of train.max_steps=" in result.stdout and "(fitted in train.max_time=2s" in result.stdout
    assert config["step"] == steps


def test_a_run_that_reaches_max_steps_inside_its_budget_says_so(english_file, tmp_path, monkeypatch):
    """On a fast machine max_steps ends the run before the budget: the report must not call the step count
    what fitted in the budget."""
    fake_machine(monkeypatch)  # 6 updates take 0.3 s of the budget's 10 minutes on any machine
    sets = [f"data.train={english_file}", "train.max_steps=6", "train.max_time=10m", "train.batch_size=4",
            "data.seq_len=32", "eval.batches=1", "eval.batch_size=4", "tokenizer.vocab_size=400",
            "tokenizer.max_train_mb=0.1", "log.progress=false", "log.plot=false", "log.tensorboard=false",
            "eval.sample_prompt=null", "train.threads=1"]
    result = CliRunner().invoke(app, ["pretrain", "gpt-tiny", "--run-dir", str(tmp_path / "run"),
                                      *[a for s in sets for a in ("--set", s)]])
    assert result.exit_code == 0, result.output
    assert "6 (train.max_steps=6 reached in" in result.stdout and "within train.max_time=10m)" in result.stdout
    assert "fitted in" not in result.stdout
