"""A resume continues the run's own recipe: a recipe named beside --resume does not put other training data
under the run (refused in one line unless --force), --set overrides apply on top of the run's recipe.yaml,
and the hint printed after an interruption is a whole command that works."""

import shlex
from pathlib import Path

from typer.testing import CliRunner

from tfkit.checkpoints.folders import latest_checkpoint
from tfkit.cli.main import app
from tfkit.layout import RECIPE_FILE
from tfkit.trainer.loop import TrainState
from tfkit.trainer.recipe import load_recipe
from tfkit.trainer.report import RunResult, report
from tfkit.trainer.run_folder import resume_command

from helpers import TINY


def _sets(*items: str) -> list[str]:
    return [a for s in items for a in ("--set", s)]


def _started(run: Path, corpus: Path) -> None:
    """A gpt-tiny run on the user's corpus, 2 steps."""
    first = CliRunner().invoke(app, ["pretrain", "gpt-tiny", "--run-dir", str(run),
                                     *_sets(f"data.train={corpus}", *TINY)])
    assert first.exit_code == 0, first.output


def test_a_recipe_named_beside_resume_cannot_swap_the_training_data(english_file, tmp_path):
    run = tmp_path / "run"
    _started(run, english_file)
    again = CliRunner().invoke(app, ["pretrain", "gpt-tiny", "--resume", "auto", "--run-dir", str(run),
                                     *_sets("train.max_steps=3")])
    assert again.exit_code == 2, again.output
    (line,) = [line for line in again.output.splitlines() if line.strip()]
    assert "would change the training data" in line and f"data.train: {str(english_file)!r} -> 'stdlib:docs:train'" in line
    assert resume_command(run) in line and "--force" in line
    assert latest_checkpoint(run).name == "step-2"  # nothing trained, nothing written
    assert load_recipe(str(run / RECIPE_FILE)).data.train == str(english_file)


def test_a_resume_trains_with_the_runs_recipe_and_the_set_overrides(english_file, tmp_path):
    run = tmp_path / "run"
    _started(run, english_file)
    command = shlex.split(resume_command(run))
    assert command[:2] == ["tfkit", "pretrain"]
    again = CliRunner().invoke(app, [*command[1:], *_sets("train.max_steps=3")])
    assert again.exit_code == 0, again.output
    assert latest_checkpoint(run).name == "step-3"
    kept = load_recipe(str(run / RECIPE_FILE))
    assert kept.data.train == str(english_file) and kept.train.max_steps == 3
    # the bundled name with the same data resumes too, taking the run's recipe for every other key
    more = CliRunner().invoke(app, ["pretrain", "gpt-tiny", "--resume", "auto", "--run-dir", str(run),
                                    *_sets(f"data.train={english_file}", "train.max_steps=4")])
    assert more.exit_code == 0, more.output
    assert "not used" in more.stdout and "not used" in (run / "start.log").read_text() and load_recipe(str(run / RECIPE_FILE)).model.d_model == kept.model.d_model


def test_force_resumes_on_the_data_given(english_file, tmp_path):
    run = tmp_path / "run"
    _started(run, english_file)
    other = tmp_path / "other.txt"
    other.write_text(english_file.read_text()[::-1], encoding="utf-8")
    forced = CliRunner().invoke(app, ["pretrain", "gpt-tiny", "--resume", "auto", "--run-dir", str(run), "--force",
                                      *_sets(f"data.train={other}", *TINY, "train.max_steps=3")])
    assert forced.exit_code == 0, forced.output
    assert load_recipe(str(run / RECIPE_FILE)).data.train == str(other)
    assert (run / "recipe-before-step-2.yaml").is_file()  # the recipe that trained up to step 2 is kept


def test_the_interrupt_hint_is_a_whole_command(tmp_path, capsys):
    run = tmp_path / "runs" / "int"
    result = RunResult(run, TrainState(step=5, interrupted=2), None, run / "checkpoints" / "step-5", 1.0)
    report(result, type("M", (), {"num_params": lambda self: 1})(), None, load_recipe("gpt-tiny"))
    out = " ".join(capsys.readouterr().out.split())
    assert f"continue with: tfkit pretrain {run / RECIPE_FILE} --resume auto --run-dir {run}" in out
