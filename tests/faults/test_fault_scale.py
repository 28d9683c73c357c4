"""Runs of several processes meeting bad input and kills: one line, exit 2, nothing lost. A resume of a checkpoint
of another shape or objective, a process count that cannot split the global batch, ranks given different
recipes, a process group that cannot be joined (naming the endpoint); a kill during a sharded save, during an
asynchronous save and during a consolidation leaves the previous checkpoint the one that loads and resumes.

The multi-process cases run torchrun on CPU (gloo) and are slow; every kill comes at a point of the run's own
progress (a hook in the subprocess), never at a moment of the clock."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tfkit.checkpoints.folders import is_sharded, latest_checkpoint, list_checkpoints
from tfkit.checkpoints.sharded import check_shards
from tfkit.checkpoints.trainer_state import load_trainer_state
from tfkit.checkpoints.weights import load_model

from fault_helpers import assert_one_line_error, cli, environment, snapshot, tiny_recipe
from helpers import shard_checkpoint


@pytest.mark.parametrize("override, expected", [
    ("model.d_model=64", "model.d_model is 64 but the checkpoint has 32"),
    ("objective.name=mlm", "objective.name: 'mlm' does not train model.arch='gpt'"),
])
def test_a_resume_of_another_shape_or_objective_is_one_line(copy_run, tiny_run, override, expected):
    run = copy_run()
    result = cli(["pretrain", tiny_run[0], "--run-dir", run, "--resume", "auto", "--set", override])
    assert_one_line_error(result, expected)


def torchrun(procs: int, args: list, folder: Path, script: str | None = None, **env: str):
    """`torchrun --standalone` of `tfkit ARGS` on `procs` CPU processes; with `script`, of that file instead (hooks)."""
    target = ["-m", "tfkit"]
    if script is not None:
        (folder / "hooked.py").write_text(script)
        target = [str(folder / "hooked.py")]
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={procs}",
                           *target, *map(str, args)], capture_output=True, text=True, timeout=300,
                          env={**environment(), **env})


def error_lines(done: subprocess.CompletedProcess) -> list[str]:
    """The distinct `error:` lines of every process (each rank says the same one)."""
    return sorted({line.strip() for line in (done.stdout + done.stderr).splitlines() if line.startswith("error: ")})


@pytest.mark.slow
def test_a_process_count_that_cannot_split_the_batch_says_which_can(tiny_run, tmp_path):
    done = torchrun(3, ["pretrain", tiny_run[0], "--run-dir", tmp_path / "run"], tmp_path)
    assert done.returncode != 0 and "Traceback" not in done.stdout
    lines = error_lines(done)
    assert len(lines) == 1 and "cannot be split evenly over 3 processes" in lines[0], done.stderr[-3000:]
    assert "process counts that work: 1, 2, 4, 8" in lines[0]
    assert not (tmp_path / "run").exists()  # refused before anything was written


RANK_1_DIFFERS = """
import os, sys
sys.argv[0] = "tfkit"
if os.environ["RANK"] == "1":
    sys.argv += ["--set", "optim.lr=0.1"]
from tfkit.cli.entry import run
run()
"""


@pytest.mark.slow
def test_ranks_given_different_recipes_are_named(tiny_run, tmp_path):
    done = torchrun(2, ["pretrain", tiny_run[0], "--run-dir", tmp_path / "run"], tmp_path, RANK_1_DIFFERS)
    lines = error_lines(done)
    assert done.returncode != 0 and len(lines) == 1, done.stderr[-3000:]
    assert "recipe: rank 1 of 2 runs another recipe than rank 0" in lines[0]
    assert not (tmp_path / "run").exists()


JOIN_WITHIN_2S = """
import datetime, sys
from tfkit.trainer import distributed
distributed.JOIN_TIMEOUT = datetime.timedelta(seconds=2)
sys.argv[0] = "tfkit"
from tfkit.cli.entry import run
run()
"""


@pytest.mark.slow
def test_a_process_group_that_cannot_be_joined_names_the_endpoint(tiny_run, tmp_path):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**environment(), "RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(port)}
    done = subprocess.run([sys.executable, "-c", JOIN_WITHIN_2S, "pretrain", str(tiny_run[0]), "--run-dir",
                           str(tmp_path / "run")], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and f"could not reach the process group's endpoint 127.0.0.1:{port}" in lines[0], lines


KILL_IN_SAVE = """
import os, signal, sys
from tfkit.checkpoints import sharded
from tfkit.trainer import checkpointer
save, wait = sharded.save, checkpointer.Checkpointer.wait
def killed_in_the_write(folder, state, async_group=None):  # rank 1, the second checkpoint: dies in its write
    if os.environ["RANK"] == "1" and "step-4" in str(folder):
        os.kill(os.getpid(), signal.SIGKILL)
    return save(folder, state, async_group)
def killed_while_pending(self):  # rank 0: dies while the second checkpoint is being written by a thread
    if os.environ["RANK"] == "0" and self.pending is not None and self.pending.final.name == "step-4":
        os.kill(os.getpid(), signal.SIGKILL)
    return wait(self)
if os.environ["WHERE"] == "sync":
    sharded.save = killed_in_the_write
else:
    checkpointer.Checkpointer.wait = killed_while_pending
sys.argv[0] = "tfkit"
from tfkit.cli.entry import run
run()
"""


@pytest.mark.slow
@pytest.mark.parametrize("where", ["sync", "async"], ids=["kill-in-sharded-save", "kill-in-async-save"])
def test_a_kill_during_a_sharded_save_leaves_the_previous_checkpoint(english_text, tmp_path, where):
    recipe = tiny_recipe(tmp_path / "recipe", english_text, train={"distributed": "fsdp", "async_save": where == "async"})
    run = tmp_path / "run"
    done = torchrun(2, ["pretrain", recipe, "--run-dir", run], tmp_path, KILL_IN_SAVE, WHERE=where)
    assert done.returncode != 0, done.stdout[-2000:]
    assert [step for step, _ in list_checkpoints(run)] == [2], sorted(p.name for p in (run / "checkpoints").iterdir())
    previous = latest_checkpoint(run)
    assert is_sharded(previous)
    check_shards(previous)
    load_model(previous)
    assert load_trainer_state(previous)["state"]["step"] == 2
    resumed = cli(["pretrain", recipe, "--run-dir", run, "--resume", "auto"])  # one process, from the shards
    assert resumed.exit_code == 0, resumed.output[-3000:]
    assert latest_checkpoint(run).name == "step-4"


KILL_IN_CONSOLIDATE = """
import os, signal, sys
from tfkit.checkpoints import consolidate
save_model = consolidate.save_model
def killed_after_the_weights(model, folder, *args, **kw):
    save_model(model, folder, *args, **kw)
    os.kill(os.getpid(), signal.SIGKILL)
consolidate.save_model = killed_after_the_weights
sys.argv[0] = "tfkit"
from tfkit.cli.entry import run
run()
"""


@pytest.mark.slow
def test_a_kill_during_a_consolidation_leaves_no_half_folder(tiny_run, tmp_path):
    source = shard_checkpoint(latest_checkpoint(tiny_run[1]), tmp_path / "sharded")
    before = snapshot(source)
    out = tmp_path / "single"
    done = subprocess.run([sys.executable, "-c", KILL_IN_CONSOLIDATE, "consolidate", str(source), "--out", str(out)],
                          capture_output=True, text=True, timeout=120, env=environment())
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    assert not out.exists() and [p.name for p in tmp_path.iterdir() if p.name.startswith(".single.tmp-")]
    assert snapshot(source) == before  # the input untouched, and still what loads
    load_model(source)
    again = cli(["consolidate", source, "--out", out])  # what the killed process left is cleared
    assert again.exit_code == 0, again.output
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".single.tmp-")]
    load_model(out)
