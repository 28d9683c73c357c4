"""Training runs that go wrong, in-process: a second process on a run folder, a stale lock, a run that
diverges, a kill between the last checkpoint and the last validation, and recipes that fail once the run
has started (they must leave nothing behind)."""

from __future__ import annotations

import json
import math
import shutil

import pytest
import torch
from safetensors.torch import load_file

from tfkit.checkpoints.run_record import read_metrics
from tfkit.files import LOCK_FILE, folder_lock
from tfkit.checkpoints.folders import latest_checkpoint, list_checkpoints
from tfkit.checkpoints.training import NonFiniteWeights, save_checkpoint

from fault_helpers import assert_one_line_error, changes, cli, snapshot, tiny_recipe


@pytest.mark.parametrize("resume", ["auto", None], ids=["lock-resume", "lock-fresh"])
def test_a_run_folder_in_use_is_refused_in_one_line(resume, tiny_run, copy_run, tmp_path):
    recipe, _ = tiny_run
    run = copy_run() if resume else tmp_path / "fresh"
    run.mkdir(exist_ok=True)
    args = ["pretrain", recipe, "--run-dir", run, "--set", "train.max_steps=6"]
    args += ["--resume", resume] if resume else []
    with folder_lock(run):  # another process training into it (flock is per open file, so this process counts)
        before = snapshot(run)
        assert_one_line_error(cli(args), str(run), "in use by another tfkit process")
        assert not changes(before, snapshot(run))
    assert run.is_dir(), "the refused run removed a folder it did not make"


def test_a_stale_lock_file_from_a_dead_process_does_not_block(tiny_run, copy_run):
    recipe, _ = tiny_run
    run = copy_run()
    (run / LOCK_FILE).write_text("999999")  # left by a killed run: nobody holds the lock
    result = cli(["pretrain", recipe, "--run-dir", run, "--resume", "auto", "--set", "train.max_steps=5"])
    assert result.exit_code == 0, result.output
    assert latest_checkpoint(run).name == "step-5"


def _diverge_after(monkeypatch, good_steps: int) -> None:
    """The learning rate of a normal run for `good_steps` updates, then 1e6: the weights explode."""
    from tfkit.trainer import loop

    real = loop.lr_at  # the rates a window of updates is opened with
    monkeypatch.setattr(loop, "lr_at", lambda n, *a, **k: real(n, *a, **k) if n < good_steps else 1e6)


@pytest.mark.parametrize("good_steps", [0, 4], ids=["diverge-at-once", "diverge-after-4-good-steps"])
def test_a_diverged_run_names_only_a_good_checkpoint_and_never_resumes_an_exploded_one(
        good_steps, english_text, tmp_path, monkeypatch):
    recipe = tiny_recipe(tmp_path, english_text, train={"max_steps": 12, "save_every": 1, "eval_every": 1,
                                                        "max_bad_steps": 2, "keep_last": 20, "log_every": 1},
                         schedule={"name": "constant", "warmup_steps": 0}, optim={"grad_clip": None})
    _diverge_after(monkeypatch, good_steps)
    run = tmp_path / "run"
    line = assert_one_line_error(cli(["pretrain", recipe, "--run-dir", run]), "training diverged")
    good = [step for step, _ in list_checkpoints(run)]
    assert good == list(range(1, good_steps + 1)), (good, line)
    assert f"last good checkpoint: {run / 'checkpoints' / f'step-{good_steps}'}" in line if good_steps else \
        "last good checkpoint: none" in line, line
    for _, folder in list_checkpoints(run):
        weights = load_file(str(folder / "model.safetensors"))
        assert all(torch.isfinite(t).all() for t in weights.values())
    val = {r["step"]: r["val_loss"] for r in read_metrics(run / "metrics.jsonl") if "val_loss" in r}
    assert all(math.isfinite(val[s]) and val[s] < 20 for s in good), val  # the named ones evaluate sanely
    latest = latest_checkpoint(run)
    assert (latest.name if latest else None) == (f"step-{good_steps}" if good_steps else None)


def test_a_checkpoint_of_non_finite_weights_is_never_written(tmp_path):
    from tfkit.models import build_model
    from tfkit.models.config import ModelConfig

    model = build_model(ModelConfig(vocab_size=50, d_model=16, n_layers=1, n_heads=2, max_seq_len=16))
    with torch.no_grad():
        next(model.parameters())[0, 0] = float("nan")
    with pytest.raises(NonFiniteWeights, match="not finite"):
        save_checkpoint(tmp_path, 3, model, {}, tmp_path / "tokenizer", {}, keep_last=3)
    assert not (tmp_path / "checkpoints" / "step-3").exists()
    assert not list((tmp_path / "checkpoints").glob(".step-*"))


def test_a_kill_before_the_last_validation_row_is_made_good_by_the_resume(tiny_run, copy_run):
    """Killed after the final checkpoint, before the final validation was logged: the resume logs it."""
    recipe, reference = tiny_run
    run = copy_run()
    rows = read_metrics(run / "metrics.jsonl")
    final = [r for r in rows if r["step"] == 4 and "val_loss" in r]
    assert final
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows if r not in final))
    result = cli(["pretrain", recipe, "--run-dir", run, "--resume", "auto"])
    assert result.exit_code == 0, result.output
    again = [r for r in read_metrics(run / "metrics.jsonl") if r["step"] == 4 and "val_loss" in r]
    assert [r["val_loss"] for r in again] == [r["val_loss"] for r in final]
    result = cli(["pretrain", recipe, "--run-dir", run, "--resume", "auto"])  # and only once
    assert len([r for r in read_metrics(run / "metrics.jsonl") if r["step"] == 4 and "val_loss" in r]) == 1


FAILING_STARTS = {
    "train corpus missing": ({"data": {"train": "{T}/missing.txt"}}, "missing.txt"),
    "train corpus empty": ({"data": {"train": "{T}/empty.txt"}}, "empty.txt"),
    "valid corpus missing": ({"data": {"valid": "{T}/nope.txt"}}, "nope.txt"),
    "tokenizer path missing": ({"tokenizer": {"path": "{T}/no-tokenizer"}}, "no-tokenizer"),
    "init_from missing": ({"train": {"init_from": "{T}/no-checkpoint"}}, "no-checkpoint"),
    "model vocabulary below the tokenizer's": ({"model": {"vocab_size": 100}}, "vocab_size"),
    "too little text for seq_len": ({"data": {"train": "{T}/tiny.txt", "valid": None}}, "validation data"),
    "corpus is a folder of nothing": ({"data": {"train": "{T}/nothing"}}, "nothing"),
}


@pytest.mark.parametrize("case", sorted(FAILING_STARTS),
                         ids=[f"start-{c.replace(' ', '-')}" for c in sorted(FAILING_STARTS)])
def test_a_run_that_fails_at_the_start_leaves_nothing(case, english_text, tmp_path, monkeypatch):
    sections, expected = FAILING_STARTS[case]
    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "tiny.txt").write_text("one two")
    (tmp_path / "nothing").mkdir()
    filled = json.loads(json.dumps(sections).replace("{T}", str(tmp_path)))
    recipe = tiny_recipe(tmp_path / "recipe", english_text, **filled)
    json_recipe = json.loads(recipe.read_text())
    json_recipe["log"]["run_dir"] = None
    recipe.write_text(json.dumps(json_recipe))
    before = snapshot(tmp_path)
    assert_one_line_error(cli(["pretrain", recipe]), expected)
    assert not changes(before, snapshot(tmp_path)), changes(before, snapshot(tmp_path))
    shutil.rmtree(tmp_path / "recipe")
