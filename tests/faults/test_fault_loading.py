"""Checkpoints that load into trouble: weights of the wrong dtype, weights that are not finite, a config.json
whose model could not even be built here, and a run that rotates its checkpoints away while they are read.
Each is one line naming the checkpoint (exit code 2) and changes nothing, or, for a rotated checkpoint, the
newest complete one is read instead."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from fault_helpers import assert_one_line_error, changes, cli, snapshot
from safetensors.torch import load_file, save_file

READERS = {
    "eval": lambda ckpt, t: ["eval", ckpt, "--data", t / "text.txt"],
    "generate": lambda ckpt, t: ["generate", ckpt, "--prompt", "hi", "-n", "2"],
    "export-hf": lambda ckpt, t: ["export-hf", ckpt, "--out", t / "out"],
    "convert": lambda ckpt, t: ["convert-mqa-to-gqa", ckpt, "--kv-heads", "2", "--out", t / "out"],
}
TENSOR = "blocks.0.attn.q_proj.weight"


def _retype(dtype: torch.dtype):
    def edit(ckpt: Path) -> None:
        state = load_file(ckpt / "model.safetensors")
        state[TENSOR] = state[TENSOR].to(dtype)
        save_file(state, str(ckpt / "model.safetensors"))
    return edit


def _endless_positions(ckpt: Path) -> None:
    config = json.loads((ckpt / "config.json").read_text())
    config["model"].update(positions="sinusoidal", max_seq_len=10**9)
    (ckpt / "config.json").write_text(json.dumps(config))


DAMAGE = {  # name: (edit, what the line must say)
    "weight-int32": (_retype(torch.int32), (TENSOR, "int32")),
    "weight-bool": (_retype(torch.bool), (TENSOR, "bool")),
    "max_seq_len-1e9-sinusoidal": (_endless_positions, ("max_seq_len=1,000,000,000", "GiB")),
}
# export-hf refuses a sinusoidal model by its configuration before any weight is read (no HF class has
# sinusoidal positions; tests/test_hf_export.py), so the endless table never reaches its loader there.
CASES = [(reader, damage) for reader in READERS for damage in DAMAGE
         if (reader, damage) != ("export-hf", "max_seq_len-1e9-sinusoidal")]


def _prepare(copy_run, tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.setenv("TFKIT_CACHE", str(tmp_path / ".cache"))
    (tmp_path / "text.txt").write_text("Plain text for the evaluation. " * 400)
    return copy_run() / "checkpoints" / "step-4"


@pytest.mark.parametrize(("reader", "damage"), CASES, ids=[f"load-{r}-{d}" for r, d in CASES])
def test_a_checkpoint_that_cannot_load_is_one_line_naming_it(reader, damage, copy_run, tmp_path, monkeypatch):
    monkeypatch.setattr("tfkit.checkpoints.weights.machine_memory", lambda: 16 * 2**30)  # a 16 GiB machine, on any machine
    ckpt = _prepare(copy_run, tmp_path, monkeypatch)
    edit, expected = DAMAGE[damage]
    edit(ckpt)
    before = snapshot(tmp_path)
    line = assert_one_line_error(cli(READERS[reader](ckpt, tmp_path)), *expected)
    assert str(ckpt) in line, line
    assert not changes(before, snapshot(tmp_path)), changes(before, snapshot(tmp_path))


@pytest.mark.parametrize("value", ["nan", "inf"])
def test_generate_refuses_weights_that_are_not_finite(value, copy_run, tmp_path, monkeypatch):
    """Sampling from them used to fail inside torch.multinomial with a traceback."""
    ckpt = _prepare(copy_run, tmp_path, monkeypatch)
    state = load_file(ckpt / "model.safetensors")
    state[TENSOR][0, 0] = float(value)
    save_file(state, str(ckpt / "model.safetensors"))
    before = snapshot(tmp_path)
    assert_one_line_error(cli(["generate", ckpt, "--prompt", "hi", "-n", "2"]), str(ckpt), "not finite", TENSOR)
    assert not changes(before, snapshot(tmp_path))


def _rotating(monkeypatch, times: int) -> list[str]:
    """Make the first `times` reads of a run's weights find that the run has just saved a newer checkpoint
    and removed the one being read (train.keep_last), as a training still running does. Returns the
    names of the checkpoints removed so."""
    import tfkit.checkpoints.weights as weights

    real, removed = weights.load_file, []

    def load_file_as_the_run_rotates(filename, device="cpu"):
        folder = Path(filename).parent
        if len(removed) < times and folder.parent.name == "checkpoints":
            newest = max(int(p.name.removeprefix("step-")) for p in folder.parent.glob("step-*"))
            shutil.copytree(folder, folder.parent / f"step-{newest + 2}")
            shutil.rmtree(folder)
            removed.append(folder.name)
        return real(filename, device=device)

    monkeypatch.setattr(weights, "load_file", load_file_as_the_run_rotates)
    return removed


ROTATING = [(reader, outcome) for reader in ("eval", "generate") for outcome in ("newest-read", "still-writing")]


@pytest.mark.parametrize(("reader", "outcome"), ROTATING, ids=[f"rotate-{r}-{o}" for r, o in ROTATING])
def test_a_checkpoint_rotated_away_while_read(reader, outcome, copy_run, tmp_path, monkeypatch):
    """`eval RUN` / `generate RUN` of a run still training: the checkpoint resolved is removed before it is
    read. Once: the newest complete checkpoint is read instead. Every time: one line saying the run writes."""
    ckpt = _prepare(copy_run, tmp_path, monkeypatch)
    run = ckpt.parents[1]
    removed = _rotating(monkeypatch, times=1 if outcome == "newest-read" else 3)
    result = cli(READERS[reader](run, tmp_path) + (["--json", tmp_path / "rows.json"] if reader == "eval" else []))
    if outcome == "newest-read":
        assert result.exit_code == 0, result.output
        read = (json.loads((tmp_path / "rows.json").read_text())[0]["checkpoint"] if reader == "eval"
                else result.stderr.split("loaded ")[1].split()[0])  # generate: `loaded FOLDER (...)`
        assert removed == ["step-4"] and Path(read) == run / "checkpoints" / "step-6"
    else:
        assert_one_line_error(result, str(run), "the run is writing checkpoints", "step-4, step-6, step-8")
