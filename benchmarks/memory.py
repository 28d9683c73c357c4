"""Where a multi-process run's memory goes: the peak resident memory of every process, phase by phase.

    python -m benchmarks.memory --procs 2 --mode fsdp                      # the 307M GPT, one update, save, resume
    python -m benchmarks.memory --procs 4 --mode fsdp --d-model 256 --layers 4   # a smaller model

Runs `torchrun --standalone --nproc-per-node N -m benchmarks.memory --worker ...`: each process trains the
gpt-tiny recipe widened to `--d-model` x `--layers` (d_model 1024 x 24 layers is a 307M-parameter GPT) for one
update of one sequence per process and writes its final checkpoint, then a second start resumes it and
trains one more update. Each process marks the phases of its run (setup: tokenizer and data; build: model,
wrapping, optimizer; the first forward, backward and optimizer step; each checkpoint save; a resume's load)
and records the peak resident memory of each (VmHWM, reset at every mark through /proc/self/clear_refs),
so the largest row is the process's peak. The table shows each phase's peak, the largest over the ranks,
rank 0 apart (it alone gathered checkpoints before), and the save and load wall times.

To compare with an earlier commit in the same session, run the same command with that commit's package
first on PYTHONPATH (the hooks patch names both have: `Trainer._build_model`, `LossModule.forward`,
`step._optimizer_step`, `Checkpointer.save`, `Checkpointer.restore`, `run.load_source_weights`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PHASES = ("setup", "build", "first forward", "backward", "optimizer step", "save", "load", "other")


def _status_mib(key: str = "VmHWM") -> float:
    """This process's peak resident memory since the last reset (VmHWM), or its resident memory now (VmRSS),
    in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS (Linux >= 4.0)


class Phases:
    """Contiguous phases of one process: `mark(name)` ends the phase in progress (its peak and seconds
    recorded, the peak counter reset) and starts `name`."""

    def __init__(self) -> None:
        self.rows: list[dict] = []
        self.current, self.since = "setup", time.perf_counter()
        _reset_peak()

    def mark(self, name: str) -> None:
        now = time.perf_counter()
        self.rows.append({"phase": self.current, "peak_mib": _status_mib(), "end_mib": _status_mib("VmRSS"),
                          "seconds": now - self.since})
        _reset_peak()
        self.current, self.since = name, now


def _install(phases: Phases) -> None:
    """Mark the phases from inside tfkit's own trainer (wrappers around the functions that do each)."""
    import torch

    from tfkit.trainer import checkpointer, objectives, run, step

    def around(owner, name, before: str, after: str = "other", first_only: bool = False):
        original, seen = getattr(owner, name), []

        def wrapped(*args, **kwargs):
            if first_only and seen:
                return original(*args, **kwargs)
            seen.append(1)
            phases.mark(before)
            try:
                return original(*args, **kwargs)
            finally:
                phases.mark(after)
        setattr(owner, name, wrapped)

    around(run.Trainer, "_build_model", "build")
    around(run, "load_source_weights", "load", "build")  # inside build: a resume's weights (single-file form)
    around(checkpointer.Checkpointer, "restore", "load")
    around(checkpointer.Checkpointer, "save", "save")
    forward = objectives.LossModule.forward

    def first_forward(self, batch):
        if not self.training or getattr(phases, "trained", False):
            return forward(self, batch)
        phases.mark("first forward")
        out = forward(self, batch)
        phases.mark("backward")
        phases.trained = True
        return out
    objectives.LossModule.forward = first_forward
    backward = torch.Tensor.backward

    def marked_backward(self, *args, **kwargs):
        backward(self, *args, **kwargs)
        if phases.current == "backward":
            phases.mark("optimizer step")
    torch.Tensor.backward = marked_backward
    around(step, "_optimizer_step", "optimizer step", first_only=True)


def worker(args: argparse.Namespace) -> None:
    phases = Phases()
    _install(phases)
    from tfkit.trainer.recipe import load_recipe
    from tfkit.trainer.run import pretrain

    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    sets = [f"model.d_model={args.d_model}", f"model.n_layers={args.layers}", f"model.n_heads={args.d_model // 64}",
            f"train.max_steps={args.steps}", f"train.batch_size={world}", "train.grad_accum=1",
            f"train.distributed={args.mode}", "train.precision=fp32", "train.threads=1", "train.save_every=1000",
            "eval.batches=1", f"eval.batch_size={world}", "eval.sample_prompt=null", "log.progress=false",
            "log.plot=false", "log.tensorboard=false", "tokenizer.max_train_mb=1", "schedule.warmup_steps=1",
            f"data.cache_dir={args.out / 'cache'}"]
    pretrain(load_recipe("gpt-tiny", sets + args.set), run_dir=args.out / "run", resume=args.resume)
    phases.mark("other")
    tag = "resume" if args.resume else "fresh"
    (args.out / f"{tag}-rank{rank}.json").write_text(json.dumps(phases.rows))


def _table(out: Path, procs: int) -> str:
    lines = ["| phase | rank 0 peak | largest peak of any rank | rank 0 at its end | seconds (rank 0) |",
             "|---|---:|---:|---:|---:|"]
    for tag in ("fresh", "resume"):
        ranks = [json.loads((out / f"{tag}-rank{r}.json").read_text()) for r in range(procs)]
        for phase in PHASES:
            rows = [[row for row in rank if row["phase"] == phase] for rank in ranks]
            if not rows[0]:
                continue
            peaks = [max(row["peak_mib"] for row in rank) for rank in rows if rank]
            seconds = sum(row["seconds"] for row in rows[0])
            lines.append(f"| {tag}: {phase} | {peaks[0]:,.0f} MiB | {max(peaks):,.0f} MiB | "
                         f"{rows[0][-1]['end_mib']:,.0f} MiB | {seconds:.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument("--mode", choices=("ddp", "fsdp"), default="fsdp")
    parser.add_argument("--d-model", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--set", action="append", default=[], help="more recipe overrides KEY=VALUE")
    parser.add_argument("--out", type=Path, default=None, help="folder for the run and the per-rank JSON")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--resume", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args)
    out = args.out or Path(tempfile.mkdtemp(prefix="tfkit-memory-"))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    base = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={args.procs}",
            "-m", "benchmarks.memory", "--worker", "--mode", args.mode, "--d-model", str(args.d_model),
            "--layers", str(args.layers), "--out", str(out)] + [f"--set={s}" for s in args.set]
    started = time.perf_counter()
    subprocess.run(base + ["--steps", str(args.steps)], check=True, env=env)
    subprocess.run(base + ["--steps", str(args.steps + 1), "--resume", "auto"], check=True, env=env)
    print(f"{args.procs} processes, {args.mode}, gpt d_model {args.d_model} x {args.layers} layers "
          f"({time.perf_counter() - started:.0f} s in all; {out})")
    print(_table(out, args.procs))


if __name__ == "__main__":
    main()
