"""In-loop downstream scores (`eval.tasks`): what scoring two tasks at every validation costs a training run.

The same run twice, interleaved in one process: gpt-tiny as shipped (300 updates, a validation every 100, so
four validations counting the untrained baseline and the last), once plain and once with `eval.tasks:
[stdlib:docs-cloze, stdlib:docs-choice]` cut to 200 items each (`eval.task_limit`), scored at every validation.
Each is timed from the first validation to the report (`Trainer.train` + `Trainer.finish`: updates,
validations, checkpoints); the tokenizer and token cache, shared by both, are built before the clock starts.
The ratio is plain / with tasks (a cost: > 1 would mean the tasks are free); the goal is an overhead of at
most 10% of the wall time on the CPU. On a GPU (`--suite gpu`) the run is gpt2-small as shipped (bf16,
compiled) at B=16 x 1024, 1,000 updates with a validation every 500, the two tasks at 500 items each, and
the goal an overhead of at most 3%.
"""

from __future__ import annotations

import contextlib
import io
import tempfile
from pathlib import Path

from tfkit.evaluation.inloop import build_downstream
from tfkit.trainer.distributed import init_distributed
from tfkit.trainer.recipe import load_recipe
from tfkit.trainer.run import Trainer

from .common import Context, Goal, Row

GOAL = Goal("overhead <= 10% of wall time", 1 / 1.10)
GPU_GOAL = Goal("overhead <= 3% of wall time", 1 / 1.03)
TASKS = "eval.tasks=[stdlib:docs-cloze, stdlib:docs-choice]"


def timed_run(ctx: Context, folder: Path, recipe_name: str, name: str, sets: list[str]) -> float:
    """Seconds from the first validation to the report of run `name` (its output swallowed)."""
    recipe = load_recipe(recipe_name, sets)
    downstream = build_downstream(recipe)
    dist = init_distributed(ctx.device.type)
    with contextlib.redirect_stdout(io.StringIO()), Trainer(recipe, dist, None, downstream) as run:
        run.build(folder / name)
        started = ctx.timer()
        run.train()
        run.finish()
        return ctx.timer() - started


def run(ctx: Context) -> list[Row]:
    gpu = ctx.device.type == "cuda"
    steps, items, every = (4, 8, 2) if ctx.quick else (1000, 500, 500) if gpu else (300, 200, 100)
    name = "gpt2-small" if gpu else "gpt-tiny"
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        common = [f"train.max_steps={steps}", f"train.eval_every={every}", f"train.save_every={every}",
                  "eval.sample_prompt=null", "log.progress=false", "log.plot=false", "log.tensorboard=false",
                  f"data.cache_dir={folder / 'cache'}", f"train.device={ctx.device.type}"]
        if gpu:  # the shipped recipe but for the batch (one GPU's 16 x 1024, no accumulation) and the text
            common += ["train.batch_size=16", "train.grad_accum=1", "tokenizer.max_train_mb=20"]
        if ctx.quick:  # a model and data small enough for seconds
            common += ["model.d_model=32", "model.n_heads=2", "model.n_layers=1", "train.batch_size=4",
                       "data.seq_len=32", "eval.batches=1", "tokenizer.vocab_size=400", "tokenizer.max_train_mb=0.05",
                       "data.train=stdlib:docs:valid", "data.valid=stdlib:docs:valid"]
        ctx.log("inloop: the shared tokenizer and token cache")
        timed_run(ctx, folder, name, "warm", [*common, "train.max_steps=1"])  # trains the tokenizer, fills the cache
        common.append(f"tokenizer.path={folder / 'warm' / 'tokenizer'}")
        ctx.log(f"inloop: {name}, {steps} updates, plain")
        plain = timed_run(ctx, folder, name, "plain", common)
        ctx.log(f"inloop: {name}, {steps} updates, two tasks of {items} items at every validation")
        tasks = timed_run(ctx, folder, name, "tasks", [*common, TASKS, f"eval.task_limit={items}"])
    validations = steps // every + 1
    return [Row("inloop", f"{name} {steps} updates, 2 tasks x {items} items at each of {validations} validations "
                          "vs no tasks", "s", tasks, plain, higher_is_better=False, goal=GPU_GOAL if gpu else GOAL,
                note=f"overhead {100 * (tasks / plain - 1):+.1f}%")]
