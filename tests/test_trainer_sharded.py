"""Runs of several gloo processes on CPU that outgrow one process count and survive their processes: a run
stopped by SIGUSR1 at 4 processes, resumed at 2, then at 1, consumes the token ids of every update of an
uninterrupted 4-process run (read from the batches) and ends with its losses and weights; a 2-node x 2-process
run (two torchrun agents on 127.0.0.1, c10d rendezvous, --max-restarts) whose worker is SIGKILLed at a random
update restarts, resumes by itself and ends with the uninterrupted run's weights, byte for byte.

Every kill and stop comes at a step of the run's own progress (benchmarks/hooked_tfkit.py), never at a
moment of the clock."""

import random
import socket
import subprocess
import sys

import pytest
import torch

from tfkit.checkpoints.folders import is_sharded, latest_checkpoint
from tfkit.checkpoints.run_record import read_metrics
from tfkit.checkpoints.weights import load_model

from helpers import HOOKED_TFKIT, ONE_THREAD, update_ids, write_recipe

# torchrun processes: CI's second step (`pytest -m slow --dist loadgroup`) runs them on one worker, so that
# the module's 4-process reference run is made once, not once per worker
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("sharded")]

STEPS = 6
# log_every 1: a window of the loop per update, so that any step can be a kill point (benchmarks/hooked_tfkit.py)
TRAIN = {"max_steps": STEPS, "batch_size": 8, "save_every": 2, "eval_every": 3, "log_every": 1, "distributed": "fsdp"}


def torchrun(script, args: list, procs: int, env: dict, *launcher) -> subprocess.CompletedProcess:
    launch = list(launcher) or ["--standalone", f"--nproc-per-node={procs}"]
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", *launch, str(script), *map(str, args)],
                          capture_output=True, text=True, timeout=300, env=env)


@pytest.fixture(scope="module")
def reference(english_text, tmp_path_factory):
    """(recipe, tfkit script, an uninterrupted 4-process FSDP run of STEPS updates, its ids per update)."""
    folder = tmp_path_factory.mktemp("sharded-runs")
    recipe = write_recipe(folder, english_text, "gpt", model={"dropout": 0.0}, train=TRAIN)
    script = HOOKED_TFKIT
    env = {**ONE_THREAD, "TFKIT_HOOK_IDS": str(folder / "ids-reference")}
    done = torchrun(script, ["pretrain", recipe, "--run-dir", folder / "reference"], 4, env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "x4 (fsdp)" in " ".join(done.stdout.split()) and "checkpoints and best/: sharded" in done.stdout
    return recipe, script, folder / "reference", update_ids(folder / "ids-reference", STEPS)


def test_resumed_at_4_then_2_then_1_processes_it_consumes_the_same_tokens(reference, tmp_path):
    recipe, script, ref_run, ref_ids = reference
    run, ids = tmp_path / "run", []
    for procs, stop in ((4, 2), (2, 4), (1, None)):  # SIGUSR1 stops the first two at steps 2 and 4
        env = {**ONE_THREAD, "TFKIT_HOOK_IDS": str(tmp_path / f"ids-{procs}"), "TFKIT_HOOK_STOP": str(stop or "")}
        args = ["pretrain", recipe, "--run-dir", run] + (["--resume", "auto"] if procs < 4 else [])
        done = (torchrun(script, args, procs, env) if procs > 1 else
                subprocess.run([sys.executable, str(script), *map(str, args)], capture_output=True, text=True,
                               timeout=300, env=env))
        if stop:  # 128 + SIGUSR1 from the workers (torchrun reports the first): unfinished, for a requeue script
            assert done.returncode != 0 and "exitcode  : 138" in done.stderr, done.stderr[-3000:]
            assert is_sharded(latest_checkpoint(run)) and latest_checkpoint(run).name == f"step-{stop}"
        else:
            assert done.returncode == 0, done.stderr[-3000:]
            assert "4 micro-batch(es) of 2 sequences per process" in " ".join(done.stdout.split())  # memory kept
        ids += update_ids(tmp_path / f"ids-{procs}", STEPS)[(stop or STEPS) - 2:(stop or STEPS)]
    assert ids == ref_ids  # every update, the same rows of token ids at 4, 2 and 1 processes
    ours, theirs = read_metrics(run / "metrics.jsonl"), read_metrics(ref_run / "metrics.jsonl")
    losses = lambda rows: {(r["step"], k): r[k] for r in rows for k in ("loss", "val_loss") if k in r}  # noqa: E731
    assert losses(ours).keys() == losses(theirs).keys()
    for key, value in losses(theirs).items():  # sums over rows in another order: float rounding only
        assert losses(ours)[key] == pytest.approx(value, abs=1e-5), key
    final = load_model(run / "checkpoints" / f"step-{STEPS}")[0].state_dict()
    expected = load_model(ref_run / "checkpoints" / f"step-{STEPS}")[0].state_dict()
    assert all(torch.allclose(final[k], expected[k], atol=1e-5) for k in expected)


def test_a_ddp_run_resumed_on_one_process_consumes_the_same_tokens(reference, tmp_path):
    """DDP's sharded checkpoint (each rank writes a part of the replicated tensors) resumed in one process."""
    recipe, script, ref_run, ref_ids = reference
    run, stop = tmp_path / "run", 3
    env = {**ONE_THREAD, "TFKIT_HOOK_IDS": str(tmp_path / "ids-ddp"), "TFKIT_HOOK_STOP": str(stop)}
    done = torchrun(script, ["pretrain", recipe, "--run-dir", run, "--set", "train.distributed=ddp"], 2, env)
    assert done.returncode != 0 and "x2 (ddp)" in " ".join(done.stdout.split()), done.stderr[-3000:]
    assert is_sharded(latest_checkpoint(run)) and latest_checkpoint(run).name == f"step-{stop}"
    env = {**ONE_THREAD, "TFKIT_HOOK_IDS": str(tmp_path / "ids-one")}
    done = subprocess.run([sys.executable, str(script), "pretrain", str(recipe), "--run-dir", str(run), "--resume",
                           "auto"], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    ids = update_ids(tmp_path / "ids-ddp", STEPS)[:stop] + update_ids(tmp_path / "ids-one", STEPS)[stop:]
    assert ids == ref_ids
    final = load_model(run / "checkpoints" / f"step-{STEPS}")[0].state_dict()
    expected = load_model(ref_run / "checkpoints" / f"step-{STEPS}")[0].state_dict()
    assert all(torch.allclose(final[k], expected[k], atol=1e-5) for k in expected)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# the update a worker is killed at, past the first checkpoint (step 2) so that the restart resumes; the seed keeps
# CI repeatable (benchmarks/elastic.py draws 10 kill points over the whole run)
KILL_AT = random.Random(46).randint(TRAIN["save_every"] + 1, STEPS - 1)


def test_two_nodes_restart_after_a_kill_and_end_byte_identical(reference, tmp_path):
    recipe, script, ref_run, _ = reference
    port, run = free_port(), tmp_path / "run"
    env = {**ONE_THREAD, "TFKIT_HOOK_KILL": f"0:{KILL_AT}"}  # rank 0: the nodes restart with different counts
    agents = [subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=2", f"--node-rank={node}",
         "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=tfkit-test", "--max-restarts=3",
         str(script), "pretrain", str(recipe), "--run-dir", str(run)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env) for node in (0, 1)]
    outputs = [agent.communicate(timeout=400)[0] for agent in agents]
    assert [agent.returncode for agent in agents] == [0, 0], outputs[0][-3000:] + outputs[1][-3000:]
    said = " ".join(" ".join(outputs).split())
    assert "resuming" in said and "its newest complete checkpoint" in said, said[-3000:]  # on its own, and says so
    ours = load_model(run / "checkpoints" / f"step-{STEPS}")[0].state_dict()
    theirs = load_model(ref_run / "checkpoints" / f"step-{STEPS}")[0].state_dict()
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours), KILL_AT
