"""A training run SIGKILLed at any moment leaves a folder tfkit continues: `--resume auto` (or a plain
restart) finishes it, and it ends exactly where the uninterrupted run ended: the same last checkpoint,
the same best/, the same metrics rows.

The kill points are the run's own file-system steps (Python's audit hook: opens for writing, mkdir, rename,
remove, rmtree; kill_points.py), named by what they write: the tokenizer half-published, best/ half-written
and just published (keep_best's window: best/ exists, no checkpoint yet, so the restart begins at step 0
and best/ is set aside), a checkpoint half-written. The run is forked from this process (no interpreter
start), so each case costs one tiny training and its resume. Every other entry a killed run may leave is
tried at once, in one folder (`test_a_folder_holding_everything_a_killed_run_leaves_is_continued`)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tfkit.checkpoints.run_record import read_metrics
from tfkit.checkpoints.record import CheckpointRecord

from fault_helpers import cli, tiny_recipe
from kill_points import killed_at

# keep_best with a validation every update and the first checkpoint at step 3: best/ is written at steps
# 1 and 2 (at least at 1) before any checkpoint exists, the window of the issue.
TRAIN = {"max_steps": 4, "eval_every": 1, "save_every": 3, "keep_best": True, "log_every": 1}


# name -> (a mutation whose path holds this (a rename's destination that ends with it: "$" at the end), which
# such mutation, how many mutations later the kill comes). Each left a folder today's main refused.
POINTS = {
    "in-the-tokenizer-staging": (".tokenizer.tmp-", 1, 2),
    "in-the-first-best-staging": (".best.tmp-", 1, 1),
    "right-after-the-first-best": ("/best$", 1, 1),
    "in-the-second-best-staging": (".best.tmp-", 2, 2),
    "in-the-first-checkpoint-staging": ("/checkpoints/.step-3.tmp-", 1, 2),
}


@pytest.fixture(scope="module")
def reference(english_text, tmp_path_factory):
    """(recipe, the folder of the same run, uninterrupted)."""
    root = tmp_path_factory.mktemp("run-kills")
    recipe = tiny_recipe(root, english_text, train=TRAIN)
    result = cli(["pretrain", recipe, "--run-dir", root / "reference"])
    assert result.exit_code == 0, result.output
    return recipe, root / "reference"


def _weights(folder: Path) -> dict:
    return load_file(str(folder / "model.safetensors"))


def _rows(run: Path) -> dict:
    return {(r["step"], k): r[k] for r in read_metrics(run / "metrics.jsonl") for k in ("loss", "val_loss") if k in r}


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# every point with `--resume auto`; two with a plain restart (no --resume) too
CASES = [(p, "resume-auto") for p in POINTS] + [(p, "fresh") for p in ("in-the-tokenizer-staging",
                                                                       "right-after-the-first-best")]


@pytest.mark.parametrize(("point", "restart"), CASES, ids=[f"kill-{p}-then-{r}" for p, r in CASES])
def test_a_run_killed_at_any_moment_is_continued_to_the_same_end(point, restart, reference, tmp_path, monkeypatch):
    monkeypatch.setenv("TFKIT_CACHE", str(tmp_path / ".cache"))
    recipe, done = reference
    run = tmp_path / "run"
    assert killed_at(["pretrain", recipe, "--run-dir", run], *POINTS[point]), "the run was not killed"
    has_checkpoint = (run / "checkpoints" / "step-3").is_dir()
    again = ["pretrain", run / "recipe.yaml" if (run / "recipe.yaml").is_file() else recipe, "--run-dir", run]
    if restart == "resume-auto" or has_checkpoint:
        again += ["--resume", "auto"]
    result = cli(again)
    assert result.exit_code == 0, result.output
    assert _same(_weights(run / "checkpoints" / "step-4"), _weights(done / "checkpoints" / "step-4"))
    assert _same(_weights(run / "best"), _weights(done / "best"))
    assert CheckpointRecord.read(run / "best").step == CheckpointRecord.read(done / "best").step
    assert _rows(run) == _rows(done)
    leftovers = [p.name for p in run.iterdir() if ".tmp-" in p.name or ".old-" in p.name]
    assert leftovers == [], leftovers
    aside = sorted(p.name for p in run.iterdir() if p.name.startswith("best-set-aside-"))
    if point == "right-after-the-first-best":  # best/ of step 1 or 2, from updates the restart trains again
        assert len(aside) == 1 and "set aside as best-set-aside-step-" in result.output
    if has_checkpoint:
        assert aside == []  # the resumed run continues the updates its best/ came from


def _leave_what_a_killed_run_leaves(run: Path, with_checkpoint: bool) -> None:
    """Every entry a run killed at some moment may leave, at once: temporaries of a dead process beside each
    entry it writes, a best/ from a later step than the run resumes from, a torn last metrics row, the lock,
    TensorBoard and W&B folders, a recipe a resume replaced."""
    import subprocess
    import sys

    from tfkit import files

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    tag = f"{dead.pid}-{files._host()}"
    checkpoints = run / "checkpoints"
    shutil.copytree(checkpoints / "step-4", run / "best")  # a best/ of step 4: later than any resume here
    shutil.rmtree(checkpoints / "step-4")
    if not with_checkpoint:
        shutil.rmtree(checkpoints / "step-2")
    (checkpoints / f".step-4.tmp-{tag}-a1").mkdir()  # a checkpoint half-written
    (checkpoints / f".step-4.tmp-{tag}-a1" / "model.safetensors").write_bytes(b"half")
    for name in ("best", "tokenizer", "recipe.yaml", "metrics.jsonl", "loss.png"):
        (run / f".{name}.tmp-{tag}-b2").mkdir()
    (run / "data" / f".cache.tmp-{tag}-c3").mkdir(parents=True)
    (run / ".tfkit.lock").write_text(str(dead.pid))
    (run / "tensorboard").mkdir(exist_ok=True)
    (run / "tensorboard" / "events.out.tfevents.1.host").write_bytes(b"\x00" * 16)
    (run / "wandb" / "offline-run-20260101_000000-abc").mkdir(parents=True)
    (run / "recipe-before-step-2.yaml").write_text((run / "recipe.yaml").read_text())
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 4, "loss": 3.')  # the torn last row


@pytest.mark.parametrize("with_checkpoint", [True, False], ids=["resume-from-step-2", "restart-from-step-0"])
def test_a_folder_holding_everything_a_killed_run_leaves_is_continued(with_checkpoint, tiny_run, copy_run, monkeypatch,
                                                                     tmp_path):
    monkeypatch.setenv("TFKIT_CACHE", str(tmp_path / ".cache"))
    recipe, done = tiny_run
    run = copy_run()
    _leave_what_a_killed_run_leaves(run, with_checkpoint)
    result = cli(["pretrain", run / "recipe.yaml", "--run-dir", run, "--resume", "auto"])
    assert result.exit_code == 0, result.output
    assert _same(_weights(run / "checkpoints" / "step-4"), _weights(done / "checkpoints" / "step-4"))
    assert _rows(run) == _rows(done)
    assert [p.name for p in run.iterdir() if p.name.startswith("best")] == ["best-set-aside-step-4"]
    leftovers = [p.name for p in (*run.iterdir(), *(run / "checkpoints").iterdir()) if ".tmp-" in p.name]
    assert leftovers == [], leftovers
