"""Processes that are killed or run side by side (subprocesses, so marked slow): SIGKILL at random points
of a run, then `--resume auto` ends bit-exactly where the uninterrupted run ended; SIGINT and SIGTERM
save, exit 130 and 143, and a second Ctrl-C ends the run without a traceback; two `pretrain` on one run
folder: one trains, the other is refused in one line."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file

from tfkit.checkpoints.run_record import read_metrics
from tfkit.checkpoints.folders import latest_checkpoint, list_checkpoints
from tfkit.checkpoints.trainer_state import load_trainer_state

from fault_helpers import environment

pytestmark = pytest.mark.slow


# `tfkit` whose second window of updates waits until a signal has come: a run still training when the test signals it,
# however fast the machine is (a 4-step run could otherwise end before the signal).
WAITS_FOR_A_SIGNAL = """
import signal, sys, time
from tfkit.trainer import loop as loop_module
window = loop_module.run_window
def waiting(loop, *args):
    if loop.state.step >= 1:  # the window after the first update (a row per update here)
        stop = signal.getsignal(signal.SIGTERM).__self__  # the run's StopFlag, which both signals set
        while not stop.signum:
            time.sleep(0.01)
    return window(loop, *args)
loop_module.run_window = waiting
sys.argv[0] = "tfkit"
from tfkit.cli.entry import run
run()
"""


def _start(recipe, run, *extra, wait_for_a_signal: bool = False):
    tfkit = ["-c", WAITS_FOR_A_SIGNAL] if wait_for_a_signal else ["-m", "tfkit"]
    return subprocess.Popen([sys.executable, *tfkit, "pretrain", str(recipe), "--run-dir", str(run), *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=environment())


def _wait_for(proc, text: str, timeout: float = 120) -> list[str]:
    """Read the process's output until a line holds `text` (or it ends)."""
    seen, deadline = [], time.monotonic() + timeout
    for line in proc.stdout:
        seen.append(line)
        if text in line or time.monotonic() > deadline:
            break
    return seen


def _same_as_reference(run, reference) -> None:
    ours = load_file(str(run / "checkpoints" / "step-4" / "model.safetensors"))
    theirs = load_file(str(reference / "checkpoints" / "step-4" / "model.safetensors"))
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    rows = lambda folder: {(r["step"], k): r[k] for r in read_metrics(folder / "metrics.jsonl")  # noqa: E731
                           for k in ("loss", "val_loss") if k in r}
    assert rows(run) == rows(reference)


# Points of the run's own progress, not of the clock (a loaded host makes a wall-clock point land anywhere):
# the kill comes while the process goes on from the line, so it lands at a varying place after it.
KILL_POINTS = random.Random(20).sample(["run folder", "step 1/4", "step 2/4", "step 3/4"], 3)


@pytest.mark.parametrize("point", KILL_POINTS, ids=[f"sigkill-after-{p.replace(' ', '-')}" for p in KILL_POINTS])
def test_sigkill_at_a_random_point_then_resume_is_bit_exact(point, tiny_run, tmp_path):
    from fault_helpers import cli

    recipe, reference = tiny_run
    run = tmp_path / "run"
    proc = _start(recipe, run, "--set", "train.max_steps=4")
    _wait_for(proc, point)
    proc.kill()
    proc.wait()
    for _, folder in list_checkpoints(run):  # every complete checkpoint loads
        load_trainer_state(folder)
    args = ["pretrain", recipe, "--run-dir", run] + (["--resume", "auto"] if (run / "recipe.yaml").exists() else [])
    result = cli(args)
    assert result.exit_code == 0, result.output
    _same_as_reference(run, reference)


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["sigint", "sigterm"])
def test_a_signal_saves_exits_with_its_code_and_the_run_resumes_exactly(sig, code, tiny_run, tmp_path):
    from fault_helpers import cli

    recipe, reference = tiny_run
    run = tmp_path / "run"
    proc = _start(recipe, run, "--set", "train.max_steps=4", wait_for_a_signal=True)
    _wait_for(proc, "step 1/4")
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == code, out
    assert "Traceback" not in out, out  # Ctrl-C is a stop the user asked for, not a crash
    assert latest_checkpoint(run) is not None
    assert cli(["pretrain", recipe, "--run-dir", run, "--resume", "auto"]).exit_code == 0
    _same_as_reference(run, reference)


@pytest.mark.parametrize("gap", [0.0, 0.05, 0.3], ids=lambda gap: f"second-ctrl-c-after-{gap}s")
def test_a_second_ctrl_c_ends_the_run_without_a_traceback(gap, tiny_run, tmp_path):
    """The first Ctrl-C lets the update, the checkpoint and the report finish; a second one stops whatever is
    left at once (exit 130, or killed by SIGINT as a shell expects) and never prints a traceback."""
    recipe, _ = tiny_run
    proc = _start(recipe, tmp_path / "run", "--set", "train.max_steps=4", wait_for_a_signal=True)
    _wait_for(proc, "step 1/4")
    proc.send_signal(signal.SIGINT)
    time.sleep(gap)  # where the second lands varies; none may print a traceback
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode in (130, -signal.SIGINT), out
    assert "Traceback" not in out and "KeyboardInterrupt" not in out, out


def test_two_pretrain_processes_on_one_run_folder(tiny_run, tmp_path):
    recipe, _ = tiny_run
    run = tmp_path / "run"
    first = _start(recipe, run, "--set", "train.max_steps=100000", "--set", "train.save_every=50")
    _wait_for(first, "step 1/")  # training: its SIGTERM below is the trainer's to handle
    second = _start(recipe, run, "--resume", "auto", "--set", "train.max_steps=100000")
    out, _ = second.communicate(timeout=120)
    assert second.returncode == 2, out
    lines = [line for line in out.splitlines() if line.strip()]
    assert len(lines) == 1 and "in use by another tfkit process" in lines[0] and str(run) in lines[0], out
    assert first.poll() is None, "the first run did not hold the folder while the second was refused"
    first.send_signal(signal.SIGTERM)
    first.communicate(timeout=120)
    assert first.returncode == 143
    step = latest_checkpoint(run)
    assert step is not None and load_trainer_state(step)["state"]["step"] > 0
