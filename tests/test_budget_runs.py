"""What a time budget means to a user: it says what it covers (recipe key, `tfkit recipes keys`, the run's
start block and report), it validates at evenly spaced points of the steps that fit (so `keep_best` has a
choice however eval_every was tuned), and the end-of-run sample starts from the run's own text."""

import json

from typer.testing import CliRunner

from tfkit.cli.main import app
from tfkit.trainer.budget import VALIDATIONS, TimeBudget
from tfkit.trainer.loop import TrainState
from tfkit.trainer.recipe import load_recipe
from tfkit.trainer.recipe_keys import recipe_keys
from tfkit.trainer.report import RunResult, report

from helpers import TINY, Clock, fake_machine

BUDGET_RUN = [s for s in TINY if not s.startswith(("train.max_steps", "eval.sample_prompt"))] + [
    "train.max_steps=100000", "train.max_time=2s", "train.log_every=7", "train.eval_every=100000",
    "train.save_every=100000", "train.keep_best=true"]


def _sets(*items: str) -> list[str]:
    return [a for s in items for a in ("--set", s)]


def test_the_budget_says_what_it_covers(tmp_path, capsys):
    (key,) = [k for k in recipe_keys("train") if k.name == "train.max_time"]
    assert "setup before (tokenizer, token cache) and the sample after come on top" in key.meaning
    recipe = load_recipe("small-corpus")
    result = RunResult(tmp_path, TrainState(step=40, seconds=88.0), None, None, 97.5)
    report(result, type("M", (), {"num_params": lambda self: 1})(), 1000.0, recipe)
    out = " ".join(capsys.readouterr().out.split())
    assert "40 of train.max_steps=100,000 (fitted in train.max_time=90s, 88 s)" in out
    assert ("note: 40 of the recipe's 100,000 steps fitted in train.max_time=90s on this machine; the schedule "
            "decayed over those, so the loss is what this machine reaches in the budget (a faster machine or a "
            "longer train.max_time fits more steps and reaches lower)") in out
    assert "97.5 s (train.max_time counts training, validation and checkpoints; setup (tokenizer, token cache, " \
           "model) and the final sample and report come on top)" in out


def test_validations_come_at_evenly_spaced_points_of_the_steps_that_fit():
    clock = Clock()
    budget = TimeBudget(100.0, clock=clock)
    budget.start(0)
    horizon = 400
    due = [step for step in range(1, horizon) if budget.validation_due(step, horizon)]
    assert due == [horizon * k // VALIDATIONS for k in range(1, VALIDATIONS)]  # the final one is the run's own
    late = TimeBudget(100.0, clock=clock)
    assert late.next_validation(horizon) == horizon // VALIDATIONS
    assert late.validation_due(130, horizon) and late.next_validation(horizon) == 150  # points passed count once
    assert not late.validation_due(140, horizon)


def test_a_budget_run_validates_through_the_run_and_samples_from_its_own_text(english_file, tmp_path, monkeypatch):
    fake_machine(monkeypatch)  # the steps that fit in 2 s, and where the validations fall, on any machine
    run = tmp_path / "run"
    done = CliRunner().invoke(app, ["pretrain", "gpt-tiny", "--run-dir", str(run),
                                    *_sets(f"data.train={english_file}", *BUDGET_RUN, "eval.sample_prompt=auto")])
    assert done.exit_code == 0, done.output
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = max(r["step"] for r in rows)
    validated = sorted(r["step"] for r in rows if "val_loss" in r and 0 < r["step"] < steps)
    assert len(validated) >= 3 and validated[0] < steps // 2, (validated, steps)  # not only at the end
    assert json.loads((run / "best" / "config.json").read_text())["step"] in validated + [steps]
    sample = done.stdout.split("sample:")[1].strip()
    assert not sample.startswith(("auto", "Return the")) and sample.split()[0] in english_file.read_text()
