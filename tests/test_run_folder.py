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


def test_an_uptraining_recipe_follows_the_data_its_source_was_trained_on(english_file, tmp_path):
    """gqa-uptrain's `data.train: null`: a model pretrained on the user's text is uptrained on that text, not
    on the built-in corpus; every training checkpoint records its data for that."""
    import json

    import pytest
    from typer.testing import CliRunner

    from tfkit.cli.main import app
    from tfkit.errors import ConfigError
    from tfkit.trainer.recipe import load_recipe
    from tfkit.trainer.source import source_data

    sets = [f"data.train={english_file}", "data.valid=null", "data.valid_fraction=0.1", "train.max_steps=2",
            "train.batch_size=4", "data.seq_len=32", "train.eval_every=100", "eval.batches=1",
            "tokenizer.vocab_size=400", "tokenizer.max_train_mb=0.1", "log.progress=false", "log.plot=false",
            "eval.sample_prompt=null"]
    result = CliRunner().invoke(app, ["pretrain", "gpt-tiny", "--run-dir", str(tmp_path / "run"),
                                      *[a for s in sets for a in ("--set", s)]])
    assert result.exit_code == 0, result.output
    source = tmp_path / "run" / "checkpoints" / "step-2"
    resolved = source_data(load_recipe("gqa-uptrain"), source)
    assert (resolved.data.train, resolved.data.valid, resolved.data.valid_fraction) == (str(english_file), None, 0.1)
    named = load_recipe("gqa-uptrain", ["data.train=mine.txt"])
    assert source_data(named, source) is named  # told otherwise: kept
    config = json.loads((source / "config.json").read_text())
    assert config["cpu_threads"] == 1  # what a resumed `threads: auto` run reuses (the session runs one thread)
    del config["data"]
    (source / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match="does not record it .* set data.train"):
        source_data(load_recipe("gqa-uptrain"), source)
    with pytest.raises(ConfigError, match="starts from none"):
        source_data(load_recipe("gqa-uptrain"), None)
