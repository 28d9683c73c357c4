"""Runs of several processes that lose a worker or change their process count: do they end where an
uninterrupted run ends?

    python -m benchmarks.elastic --only kills --kills 10     # item 1: 2 nodes x 2 processes, a worker SIGKILLed
    python -m benchmarks.elastic --only resume                # item 2: 4 -> 2 -> 1 processes, same tokens per update

`kills`: a 2-node x 2-process CPU run (two torchrun agents on 127.0.0.1, c10d rendezvous, `--max-restarts 3`,
fp32, FSDP2 by default) is run once uninterrupted, then `--kills` times with one worker (a random rank) SIGKILLed
as a random update begins (drawn from `--seed`); torchrun restarts the workers, which resume from the newest
complete checkpoint by themselves. Each row says whether the final weights are byte-identical (`torch.equal`
on every tensor) to the uninterrupted run's.

`resume`: a 4-process run is stopped by SIGUSR1 after a third of its updates, resumed on 2 processes and stopped
after two thirds, then finished on 1; the input ids of every update are recorded from the batches (every rank)
and compared with an uninterrupted 4-process run's, and the largest difference of the losses logged and of the
final weights is the reduction-order tolerance.

A worker is killed (or stopped) at a window of the training loop (`loop.run_window`) chosen by the run's own step,
never at a moment of the clock; a marker file makes the kill happen once whichever rank numbers the restarted
workers get. Tiny GPT (d_model 32, 2 layers), a 400-token BPE on the built-in corpus: the question is exactness,
not speed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HOOKED_TFKIT = Path(__file__).resolve().parent / "hooked_tfkit.py"  # the workers' tfkit, steered by TFKIT_HOOK_*


def recipe_sets(steps: int, mode: str, cache: Path) -> list[str]:
    sets = ["model.d_model=32", "model.n_layers=2", "model.n_heads=4", "model.dropout=0.0", "data.seq_len=32",
            "tokenizer.vocab_size=400", "tokenizer.max_train_mb=0.1", f"train.max_steps={steps}",
            "train.batch_size=8", "eval.batch_size=8", "eval.batches=1", "train.save_every=2", "train.log_every=1",
            f"train.eval_every={max(steps // 2, 1)}", f"train.distributed={mode}", "train.precision=fp32",
            "train.threads=1", "schedule.warmup_steps=1", "log.progress=false", "log.plot=false",
            "log.tensorboard=false", "eval.sample_prompt=null", f"data.cache_dir={cache}"]
    return [w for s in sets for w in ("--set", s)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def two_nodes(script: Path, args: list[str], env: dict, timeout: float) -> tuple[list[int] | None, str]:
    """Two torchrun agents of 2 processes each on 127.0.0.1 (c10d), --max-restarts 3: (exit codes, output);
    (None, output) when they have not ended within `timeout` seconds (each agent's session is then killed)."""
    port = free_port()
    agents = [subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=2", f"--node-rank={node}",
         "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id=bench-{port}",
         "--max-restarts=3", str(script), *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=env, start_new_session=True) for node in (0, 1)]
    deadline = time.monotonic() + timeout
    try:
        outputs = [agent.communicate(timeout=max(deadline - time.monotonic(), 1))[0] for agent in agents]
    except subprocess.TimeoutExpired:
        for agent in agents:  # the agent and its workers: one session each
            with contextlib.suppress(ProcessLookupError):
                os.killpg(agent.pid, signal.SIGKILL)
        return None, "\n".join(agent.communicate()[0] for agent in agents)
    return [agent.returncode for agent in agents], "\n".join(outputs)


def final_state(run: Path, steps: int) -> dict:
    from tfkit.checkpoints.weights import load_model

    return load_model(run / "checkpoints" / f"step-{steps}")[0].state_dict()


def kills(args, out: Path, script: Path, env: dict) -> list[str]:
    import torch

    sets = recipe_sets(args.steps, args.mode, out / "cache")
    started = time.perf_counter()
    codes, said = two_nodes(script, ["pretrain", "gpt-tiny", "--run-dir", str(out / "reference"), *sets], env,
                            args.run_timeout)
    if codes != [0, 0]:
        raise SystemExit(f"the uninterrupted run failed: {said[-3000:]}")
    lines = [f"uninterrupted 2 x 2 run: {time.perf_counter() - started:.0f} s",
             "| kill | rank | as update begins | restarted from | final weights byte-identical | seconds |",
             "|---:|---:|---:|---|---|---:|"]
    reference, draw, same = final_state(out / "reference", args.steps), random.Random(args.seed), 0
    for n in range(args.kills):
        rank, step = draw.randrange(4), draw.randint(1, args.steps - 1)
        run = out / f"kill-{n}"
        started = time.perf_counter()
        codes, said = two_nodes(script, ["pretrain", "gpt-tiny", "--run-dir", str(run), *sets],
                                {**env, "TFKIT_HOOK_KILL": f"{rank}:{step}", "TFKIT_HOOK_KILL_MARK": str(out / f"killed-{n}")},
                                args.run_timeout)
        seconds = time.perf_counter() - started
        if not (out / f"killed-{n}").exists():  # the hook runs at window starts: log_every=1 makes every step one
            raise SystemExit(f"kill {n + 1}: rank {rank} was not killed at step {step}")
        if codes is None:
            lines.append(f"| {n + 1} | {rank} | {step + 1} | - | hung: killed after {args.run_timeout:.0f} s | "
                         f"{seconds:.0f} |")
            (out / f"kill-{n}.log").write_text(said)
            continue
        found = re.search(r"resuming\S*?(step-\d+),itsnewestcompletecheckpoint", "".join(said.split()))  # rich wraps
        resumed = found.group(1) if found else "the start (no checkpoint yet)"
        if codes != [0, 0]:
            lines.append(f"| {n + 1} | {rank} | {step + 1} | - | run failed: exit {codes} | {seconds:.0f} |")
            (out / f"kill-{n}.log").write_text(said)
            continue
        ours = final_state(run, args.steps)
        equal = ours.keys() == reference.keys() and all(torch.equal(ours[k], reference[k]) for k in ours)
        same += equal
        lines.append(f"| {n + 1} | {rank} | {step + 1} | {resumed} | {'yes' if equal else 'NO'} | {seconds:.0f} |")
    lines.append(f"byte-identical at {same} of {args.kills} kill points")
    return lines


def update_ids(prefix: Path, updates: int) -> list[list[list[int]]]:
    """Each update's rows of input ids over every rank, sorted (the last record of each batch index)."""
    rows: dict[tuple[str, int], list] = {}
    for file in sorted(prefix.parent.glob(prefix.name + ".rank*")):
        for line in file.read_text().splitlines():
            record = json.loads(line)
            rows[(file.name, record["first"])] = record["rows"]
    return [sorted(r for (_, f), rs in rows.items() if f == update for r in rs) for update in range(updates)]


def resume(args, out: Path, script: Path, env: dict) -> list[str]:
    import torch

    from tfkit.checkpoints.run_record import read_metrics

    steps, sets = args.steps, recipe_sets(args.steps, args.mode, out / "cache")

    def launch(procs: int, run: Path, tag: str, stop: int | None, resume_: bool) -> subprocess.CompletedProcess:
        cmd = ["pretrain", "gpt-tiny", "--run-dir", str(run), *sets] + (["--resume", "auto"] if resume_ else [])
        launcher = ([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={procs}"]
                    if procs > 1 else [sys.executable])
        return subprocess.run([*launcher, str(script), *cmd], capture_output=True, text=True, timeout=900,
                              env={**env, "TFKIT_HOOK_IDS": str(out / f"ids-{tag}"), "TFKIT_HOOK_STOP": str(stop or "")})

    done = launch(4, out / "reference", "reference", None, False)
    if done.returncode:
        raise SystemExit(f"the uninterrupted run failed: {done.stderr[-3000:]}")
    reference_ids, ids = update_ids(out / "ids-reference", steps), []
    stops = [steps // 3, 2 * steps // 3, None]
    for (procs, stop), first in zip(zip((4, 2, 1), stops), (0, steps // 3, 2 * steps // 3)):
        done = launch(procs, out / "run", f"x{procs}", stop, procs < 4)
        if (done.returncode == 0) != (stop is None):
            raise SystemExit(f"the {procs}-process part ended with {done.returncode}: {done.stderr[-3000:]}")
        ids += update_ids(out / f"ids-x{procs}", steps)[first:stop or steps]
    same = sum(a == b for a, b in zip(ids, reference_ids))
    ours, theirs = read_metrics(out / "run" / "metrics.jsonl"), read_metrics(out / "reference" / "metrics.jsonl")
    losses = lambda rows: {(r["step"], k): r[k] for r in rows for k in ("loss", "val_loss") if k in r}  # noqa: E731
    a, b = losses(ours), losses(theirs)
    loss_diff = max(abs(a[k] - b[k]) for k in b) if a.keys() == b.keys() else float("nan")
    wa, wb = final_state(out / "run", steps), final_state(out / "reference", steps)
    weight_diff = max((wa[k] - wb[k]).abs().max().item() for k in wb)
    return [f"4 -> 2 -> 1 processes (stopped by SIGUSR1 after updates {stops[0]} and {stops[1]} of {steps}), "
            f"{args.mode}, fp32:",
            f"- updates whose token ids equal the uninterrupted 4-process run's: {same} of {steps} "
            f"({len(reference_ids[0])} rows each)",
            f"- largest difference of a logged loss (train and validation, {len(b)} values): {loss_diff:.3g}",
            f"- largest difference of a final weight: {weight_diff:.3g}",
            f"- final weights byte-identical: {'yes' if all(torch.equal(wa[k], wb[k]) for k in wb) else 'no'}"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=("kills", "resume", "all"), default="all")
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--run-timeout", type=float, default=420, help="seconds a 2-node run may take (kills)")
    parser.add_argument("--mode", choices=("ddp", "fsdp"), default="fsdp")
    parser.add_argument("--seed", type=int, default=46)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    out = args.out or Path(tempfile.mkdtemp(prefix="tfkit-elastic-"))
    out.mkdir(parents=True, exist_ok=True)
    script = HOOKED_TFKIT
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for name, section in (("kills", kills), ("resume", resume)):
        if args.only in (name, "all"):
            started = time.perf_counter()
            sub = out / name
            sub.mkdir(exist_ok=True)
            lines = section(args, sub, script, env)
            print("\n".join(lines) + f"\n({name}: {time.perf_counter() - started:.0f} s; {sub})\n", flush=True)


if __name__ == "__main__":
    main()
