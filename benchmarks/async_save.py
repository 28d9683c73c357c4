"""The pause a sharded checkpoint puts into training, written in place and with `train.async_save`.

    python -m benchmarks.async_save [--quick] [--saves 4] [--steps 5] [--json PATH]

The goal (issue 46, item 5; the GPU checklist): with `train.async_save`, training waits at most 1 s per
checkpoint of gpt2-small. Sharded checkpoints are written by runs of several processes, and a lent machine has
one GPU, where two NCCL ranks cannot share the device; but what a checkpoint costs the loop is each rank's
own: its shards staged and written (`torch.distributed.checkpoint`), with a metadata exchange that is a
no-op in a group of one. So one process joins a process group of one (nccl on a GPU, gloo on a CPU), shards
the model with FSDP2 over it as the trainer does, steps AdamW once so its state exists, and then saves as
`trainer/checkpointer.py` does: `checkpoints.training.ShardedSave.start`, finished at the next save (async)
or at once (in place), with `--steps` training updates between saves. The pause is the time from the save's
call to the next update: staging (a copy into host memory) and, with async_save, any wait for the previous
checkpoint still being written. Both modes run in this process, interleaved, on the same model.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

from tfkit.checkpoints import sharded
from tfkit.checkpoints.training import ShardedSave
from tfkit.models import build_model
from tfkit.trainer.objectives import LossModule
from tfkit.trainer.optim import autocast_context
from tfkit.trainer.parallel import shard_blocks_and_root
from tfkit.trainer.pace import synthetic_batch
from tfkit.trainer.recipe import load_recipe

GOAL_SECONDS = 1.0  # the longest pause per checkpoint with train.async_save (issue 46, item 5)


def join_group_of_one(device: torch.device, folder: Path):
    """This process as rank 0 of 1 (the training's backend), and the async writes' own gloo group."""
    store = dist.FileStore(str(folder / "store"), 1)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", store=store, rank=0, world_size=1)
    return dist.new_group(backend="gloo")


def build(recipe_name: str, device: torch.device, batch: int):
    """The recipe's model sharded with FSDP2 (blocks, then the root), its AdamW stepped once, and an update."""
    recipe = load_recipe(recipe_name)
    cfg = recipe.model.config(recipe.model.vocab_size or recipe.tokenizer.vocab_size)
    model = build_model(cfg).to(device)
    shard_blocks_and_root(model)
    module = LossModule(model, recipe.objective)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")
    data = {k: v.to(device) for k, v in synthetic_batch(cfg, recipe.objective.name, batch,
                                                          recipe.data.seq_len).items()}
    precision = "bf16" if device.type == "cuda" else "fp32"

    def update() -> None:
        with autocast_context(precision, device):
            loss_sum, _, count = module(data)
        (loss_sum / count).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    update()
    return model, optimizer, update, sum(p.numel() for p in model.parameters())


def pauses(model, optimizer, update, folder: Path, saves: int, steps: int, async_group, device) -> list[float]:
    """Seconds the loop waited at each of `saves` checkpoints, `steps` updates apart (the module doc)."""
    pending: ShardedSave | None = None
    out = []
    for k in range(saves):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        started = time.perf_counter()
        if pending is not None:
            pending.finish()
        tensors, _ = sharded.optimizer_state(model, optimizer)
        state = {sharded.MODEL: sharded.model_state(model), sharded.OPTIMIZER: {"state": tensors}}
        pending = ShardedSave.start(folder / f"step-{k}", state, lambda f: None, lambda f: f, async_group)
        if async_group is None:
            pending.finish()
            pending = None
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        out.append(time.perf_counter() - started)
        for _ in range(steps):
            update()
    if pending is not None:
        pending.finish()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.async_save", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="gpt-tiny on this machine (CI); else gpt2-small")
    parser.add_argument("--saves", type=int, default=4, help="checkpoints per mode (default 4)")
    parser.add_argument("--steps", type=int, default=5, help="updates between checkpoints (default 5)")
    parser.add_argument("--json", type=Path, default=None, help="write the rows here as well")
    args = parser.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    recipe, batch = ("gpt-tiny", 4) if args.quick else ("gpt2-small", 16)
    with tempfile.TemporaryDirectory(prefix="tfkit-async-save-") as tmp:
        work = Path(tmp)
        async_group = join_group_of_one(device, work)
        try:
            model, optimizer, update, params = build(recipe, device, batch)
            seconds = {"in place": [], "async_save": []}
            for r in range(2):  # interleaved: a slow spell of the machine falls on both modes
                for mode, group in (("in place", None), ("async_save", async_group)):
                    seconds[mode] += pauses(model, optimizer, update, work / f"{mode}-{r}", args.saves, args.steps,
                                            group, device)
        finally:
            dist.destroy_process_group()
    rows = [{"case": f"{recipe} ({params / 1e6:.1f}M parameters, AdamW) on {device.type}, {mode}",
             "unit": "s per checkpoint", "median": statistics.median(v), "max": max(v), "checkpoints": len(v),
             "goal": f"<= {GOAL_SECONDS:g} s" if mode == "async_save" else None,
             "passed": max(v) <= GOAL_SECONDS if mode == "async_save" else None} for mode, v in seconds.items()]
    print("| case | median s | longest s | checkpoints | goal |")
    print("| --- | ---: | ---: | ---: | --- |")
    for row in rows:
        verdict = "" if row["goal"] is None else f"{row['goal']}: {'met' if row['passed'] else 'MISS'}"
        print(f"| {row['case']} | {row['median']:.3f} | {row['max']:.3f} | {row['checkpoints']} | {verdict} |")
    if args.json is not None:
        args.json.write_text(json.dumps({"device": device.type, "quick": args.quick, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
