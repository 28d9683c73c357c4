"""train.keep_best: the weights of the best validation loss are kept, and eval / generate take them."""

import dataclasses
import json

import pytest
from typer.testing import CliRunner

from tfkit.checkpoints.training import best_loss
from tfkit.checkpoints.weights import load_model
from tfkit.cli.main import app

SETS = ["train.max_steps=6", "train.eval_every=2", "train.save_every=100", "train.keep_best=true",
        "train.batch_size=4", "eval.batch_size=4", "data.seq_len=32", "eval.batches=1", "tokenizer.vocab_size=400",
        "tokenizer.max_train_mb=0.1", "log.progress=false", "log.plot=false", "log.tensorboard=false",
        "eval.sample_prompt=null", "train.threads=1", "schedule.warmup_steps=1", "optim.lr=3e-2"]


def test_the_best_validation_weights_are_kept_and_eval_and_generate_take_them(english_file, tmp_path):
    run = tmp_path / "run"
    args = ["pretrain", "gpt-tiny", "--run-dir", str(run), "--set", f"data.train={english_file}"]
    result = CliRunner().invoke(app, [*args, *[a for s in SETS for a in ("--set", s)]])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    valid = {r["step"]: r["val_loss"] for r in rows if "val_loss" in r and r["step"] > 0}
    best_step = min(valid, key=valid.get)
    config = json.loads((run / "best" / "config.json").read_text())
    assert (config["step"], config["val_loss"]) == (best_step, valid[best_step]) and best_loss(run) == valid[best_step]
    assert not (run / "best" / "trainer_state.pt").exists()  # never resumed from
    kept, _ = load_model(run / "best")
    assert sum(p.numel() for p in kept.parameters()) > 0
    evaluated = CliRunner().invoke(app, ["eval", str(run), "--data", str(english_file), "--max-tokens", "128",
                                         "--json", str(tmp_path / "r.json")])
    assert evaluated.exit_code == 0, evaluated.output
    assert f"{run}: using best/ (step {best_step}, validation loss {valid[best_step]:.4f})" in evaluated.stderr
    assert f"for the latest weights pass {run / 'checkpoints' / 'step-6'}" in evaluated.stderr
    assert json.loads((tmp_path / "r.json").read_text())[0]["checkpoint"] == str(run / "best")
    generated = CliRunner().invoke(app, ["generate", str(run), "--prompt", "The", "--max-new-tokens", "3"])
    assert generated.exit_code == 0 and "using best/" in generated.stderr, generated.output
    latest = CliRunner().invoke(app, ["generate", str(run / "checkpoints" / "step-6"), "-p", "The",
                                      "--max-new-tokens", "3"])
    assert latest.exit_code == 0 and "using best/" not in latest.stderr


@pytest.mark.parametrize(("best_step", "start", "same_run", "kept"), [
    (2, 3, True, True),  # a resume from step 3 keeps the best of the updates it continues
    (3, 3, True, True),
    (4, 3, True, False),  # from updates the resume trains again (killed after best/, before the checkpoint)
    (1, 0, True, False),  # a restart from step 0 (killed before the first checkpoint)
    (2, 3, False, False),  # a run continuing another folder's checkpoint
    (None, 3, True, False),  # unreadable
])
def test_a_best_the_start_cannot_stand_behind_is_set_aside_never_deleted(best_step, start, same_run, kept, tmp_path):
    from tfkit.checkpoints.record import CheckpointRecord
    from tfkit.checkpoints.folders import set_aside_best
    from tfkit.models.config import ModelConfig

    best = tmp_path / "best"
    best.mkdir()
    record = CheckpointRecord(model=ModelConfig(vocab_size=10, d_model=8, n_layers=1, n_heads=2, max_seq_len=8))
    text = "{damaged" if best_step is None else dataclasses.replace(record, step=best_step).to_json()
    (best / "config.json").write_text(text)
    moved = set_aside_best(tmp_path, start, same_run)
    assert (moved is None) == kept and best.exists() == kept
    if not kept:
        assert moved[0].name == f"best-set-aside-step-{best_step if best_step is not None else 'unknown'}"
        assert (moved[0] / "config.json").is_file()
        best.mkdir()  # a second restart that sets aside a best/ of the same step keeps both
        (best / "config.json").write_text((moved[0] / "config.json").read_text())
        assert set_aside_best(tmp_path, start, same_run)[0].name == moved[0].name + "-1"
