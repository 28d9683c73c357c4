"""Does the plan predict what a run does? Predicted peak memory and tokens/s against real `pretrain` runs.

    python -m benchmarks.plan [--updates 40] [--json OUT]      # every configuration, one at a time
    python -m benchmarks.plan --quick                          # seconds: one tiny configuration

For each configuration (a bundled recipe and --set keys) two fresh processes run, one after the other, on
one thread:
- the prediction: `estimate_memory` of the recipe (trainer/memory.py) and tokens/s from the plan's own
  measurement (`measure_pace`: updates to a floor of 1 s of CPU time of the process, their median), what
  `tfkit plan` prints;
- the run: `pretrain` of the same recipe for `--updates` updates after one to warm up (tokenizer and token
  cache made once per recipe by a run not recorded, then shared by its runs, two validation batches), its tokens/s in CPU time of the process from
  the start of each update to the start of the next (data loading and logging included; on a loaded 2-core
  host wall time measures the neighbours), and its peak memory: the process's peak resident set (VmHWM)
  less its resident set just before `pretrain` (the interpreter, torch and tfkit, which are not the run's).
The rows go to stdout as a Markdown table (benchmarks/RESULTS.md, "Planning a run").
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path

BASE = ["log.tensorboard=false", "log.plot=false", "log.progress=false", "eval.sample_prompt=null",
        "eval.batches=2", "train.eval_every=100000", "train.save_every=100000", "train.threads=1",
        "train.precision=fp32", "train.device=cpu", "model.size=tiny",  # quickstart's own size is planned
        "train.max_time=null"]  # a time budget validates at 8 spaced points: of 41 updates, every 5th (not update time)
CONFIGS = {  # name: (recipe, --set items)
    "gpt d64x1 b16": ("quickstart", ["model.d_model=64", "model.n_layers=1", "model.n_heads=2"]),
    "gpt d128x2 b16": ("quickstart", []),
    "gpt d256x4 b16 seq256": ("quickstart", ["model.d_model=256", "model.n_layers=4", "model.n_heads=4",
                                             "data.seq_len=256"]),
    "gpt d192x3 b32/2 accum": ("quickstart", ["model.d_model=192", "model.n_layers=3", "model.n_heads=6",
                                              "train.batch_size=32", "train.grad_accum=2"]),
    "gpt d256x4 b16 act-ckpt": ("quickstart", ["model.d_model=256", "model.n_layers=4", "model.n_heads=4",
                                               "train.activation_checkpointing=true"]),
    "bert d128x2 b32 mlm": ("bert-tiny", []),
    "bert d256x4 b32 mlm": ("bert-tiny", ["model.d_model=256", "model.n_layers=4", "model.n_heads=4"]),
    "transformer d128x2 b32 seq2seq": ("transformer-tiny", []),
}
QUICK = ("gpt d64x1 b16",)  # CI checks the benchmark runs; the families are tests/test_plan_memory.py's


def rss(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(field)


def predict(recipe_name: str, sets: list[str]) -> dict:
    import torch

    from tfkit.trainer.fits import layout_of
    from tfkit.trainer.memory import estimate_memory
    from tfkit.trainer.pace import measure_pace
    from tfkit.trainer.recipe import load_recipe

    torch.set_num_threads(1)
    recipe = load_recipe(recipe_name, sets)
    cfg = recipe.model.config(recipe.tokenizer.vocab_size)
    t = recipe.train
    memory = estimate_memory(cfg, layout_of(recipe, t.grad_accum, t.batch_size, 1, "cpu"))
    pace = measure_pace(recipe, cfg, torch.device("cpu"))
    return {"memory": memory.peak, "tokens_per_s": pace.tokens / pace.seconds}  # as the plan does


def measure(recipe_name: str, sets: list[str], updates: int, out: str) -> dict:
    import torch

    from tfkit.trainer import loop as loop_module
    from tfkit.trainer import run as run_module
    from tfkit.trainer.recipe import load_recipe

    torch.set_num_threads(1)
    entries: list[float] = []  # CPU time at each update's start: one update is the time to the next one's
    step = loop_module.train_step

    def timed(*args, **kwargs):
        entries.append(time.process_time())
        return step(*args, **kwargs)

    loop_module.train_step = timed
    recipe = load_recipe(recipe_name, sets + [f"train.max_steps={updates + 1}", "train.log_every=100000"])
    before = rss("VmRSS")
    result = run_module.pretrain(recipe, run_dir=out)
    gaps = [b - a for a, b in zip(entries[1:], entries[2:])]  # the first update warms up, as in measure_pace
    per_update = result.state.tokens / result.state.step
    speed = per_update * len(gaps) / sum(gaps) if gaps else math.nan  # the warm-up run times none
    return {"memory": rss("VmHWM") - before, "tokens_per_s": speed}


def child(args: argparse.Namespace) -> int:
    recipe_name, sets = json.loads(args.child)
    row = predict(recipe_name, sets) if args.out is None else measure(recipe_name, sets, args.updates, args.out)
    print("RESULT " + json.dumps(row))
    return 0


def run_child(recipe_name: str, sets: list[str], updates: int, out: Path | None) -> dict:
    cmd = [sys.executable, "-m", "benchmarks.plan", "--child", json.dumps([recipe_name, sets]),
           "--updates", str(updates)] + (["--out", str(out)] if out else [])
    proc = subprocess.run(cmd, capture_output=True, text=True, env={"OMP_NUM_THREADS": "1", **_env()})
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode or not lines:
        raise SystemExit(f"{cmd}: {proc.stderr[-2000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def _env() -> dict:
    import os

    return dict(os.environ)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--updates", type=int, default=40)
    parser.add_argument("--work", type=Path, default=Path("runs/bench-plan"))
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child(args)
    names = QUICK if args.quick else tuple(CONFIGS)
    updates = 4 if args.quick else args.updates
    rows = []
    print("| configuration | predicted peak | measured peak | error | predicted tokens/s | measured tokens/s | error |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name in names:
        recipe_name, extra = CONFIGS[name]
        work = args.work / name.replace(" ", "-").replace("/", "-")
        sets = BASE + extra + [f"data.cache_dir={args.work / ('cache-' + recipe_name)}"]
        warmup = args.work / f"warmup-{recipe_name}"
        if not warmup.exists():  # a first run trains the tokenizer and fills the cache: its peak is theirs
            run_child(recipe_name, sets, 1, warmup)
        sets.append(f"tokenizer.path={next((warmup / 'checkpoints').iterdir())}")  # its tokenizer files
        measured = run_child(recipe_name, sets, updates, work)
        predicted = run_child(recipe_name, sets, updates, None)
        row = {"name": name, "predicted": predicted, "measured": measured}
        rows.append(row)
        mem = predicted["memory"] / measured["memory"] - 1
        speed = predicted["tokens_per_s"] / measured["tokens_per_s"] - 1
        print(f"| {name} | {predicted['memory'] / 2**20:.0f} MiB | {measured['memory'] / 2**20:.0f} MiB | "
              f"{mem:+.0%} | {predicted['tokens_per_s']:,.0f} | {measured['tokens_per_s']:,.0f} | {speed:+.0%} |",
              flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
