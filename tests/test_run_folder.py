"""Which run folder a run uses: `--resume auto` continues only folders tfkit itself named."""

import types

from tfkit.layout import CONFIG, TRAINER_STATE, WEIGHTS
from tfkit.trainer.run_folder import choose_run_dir


def with_checkpoint(folder):
    step = folder / "checkpoints" / "step-3"
    step.mkdir(parents=True)
    for name in (WEIGHTS, CONFIG, TRAINER_STATE):
        (step / name).write_bytes(b"x")
    return folder


def test_resume_auto_never_takes_a_users_folder_that_shares_the_prefix(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    recipe = types.SimpleNamespace(name="my-gpt", log=types.SimpleNamespace(run_dir=None))
    with_checkpoint(tmp_path / "runs" / "my-gpt-pre")
    fresh = choose_run_dir(recipe, None, "auto")
    assert fresh.parent.name == "runs" and fresh.name != "my-gpt-pre" and not fresh.exists()
    older = with_checkpoint(tmp_path / "runs" / "my-gpt-20261122-101010")
    newer = with_checkpoint(tmp_path / "runs" / "my-gpt-20261123-090000-1")
    with_checkpoint(tmp_path / "runs" / "my-gpt-zzz")  # sorts last, but tfkit never names a folder so
    assert choose_run_dir(recipe, None, "auto") == newer.relative_to(tmp_path)
    assert older.exists()


def test_a_failed_start_leaves_no_run_folder_behind(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from tfkit.cli.main import app

    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "mine").mkdir()  # the user's own: kept
    result = CliRunner().invoke(app, ["pretrain", "gpt-tiny", "--set", f"data.train={tmp_path / 'missing.txt'}",
                                      "--set", "data.valid=null", "--set", "log.progress=false"])
    assert result.exit_code == 2 and "missing.txt" in result.stderr
    assert [p.name for p in (tmp_path / "runs").iterdir()] == ["mine"]
    result = CliRunner().invoke(app, ["pretrain", "gpt-tiny", "--run-dir", str(tmp_path / "new" / "run"), "--set",
                                      f"data.train={tmp_path / 'missing.txt'}", "--set", "data.valid=null"])
    assert result.exit_code == 2 and not (tmp_path / "new").exists()  # the parent it made goes too
