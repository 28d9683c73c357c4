"""Does `tfkit plan` pick the right size? The planned shape against half and twice its size at equal time.

    python -m experiments.plan_ladder --corpus stdlib:docs --budget 300 [--recipe quickstart] [--json OUT]
    python -m experiments.plan_ladder --shapes 64x1,128x2 --budget 80    # a ladder given by hand (d_model x layers)
    python -m experiments.plan_ladder --quick                             # seconds: checks that it runs

Every run trains the same recipe (default `quickstart`, its tokenizer trained once per corpus and shared, so
every size reads the same tokens) for the same budget of *CPU time of one thread* (`train.threads: 1`, the
time budget's clock replaced by `time.process_time`): on a 2-core machine shared with other jobs, wall time
would measure the neighbours, and a run that met a busy minute would lose for nothing. The planned shape is
what `plan_recipe` chooses for that budget on this machine (its own measurement, on the same clock); the
ladder is that shape at half and twice its parameters (`scaled_shape`: whole parameters, embeddings included;
the depth following the plan's own dial), every size at the plan's batch and the learning rate the plan
gives its width and that batch. Each run is scored by its final validation loss (the same batches
for every size) and bits per byte (the validation tokens' bytes, from the tokenizer). Runs go one at a time.
The latest results are in benchmarks/RESULTS.md ("Planning a run"), beside the memory and speed predictions.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import sys
import time
from pathlib import Path

from tfkit.trainer import run as run_module
from tfkit.trainer.budget import TimeBudget
from tfkit.trainer.recipe import load_recipe
from tfkit.trainer.resources import count_parameters
from tfkit.trainer.sizing import Shape, scaled_lr


def cpu_budget() -> None:
    """train.max_time counts CPU time of this process (one thread), not wall time (module doc)."""
    run_module.TimeBudget = functools.partial(TimeBudget, clock=time.process_time)


def base_overrides(corpus: str, tokenizer: Path | None, cache: Path, seconds: float) -> list[str]:
    sets = [f"data.train={corpus}", "data.valid=null" if not corpus.startswith("stdlib:docs") else
            "data.valid=stdlib:docs:valid", f"data.cache_dir={cache}", f"train.max_time={seconds:g}s",
            "train.max_steps=1000000", "train.threads=1", "train.precision=fp32", "eval.batches=40",
            "eval.sample_prompt=null", "log.tensorboard=false", "log.plot=false", "log.progress=false",
            "train.save_every=1000000", "train.keep_last=1"]
    if tokenizer is not None:
        sets.append(f"tokenizer.path={tokenizer}")
    return sets


def shape_sets(shape: Shape, lr: float) -> list[str]:
    """The shape's model keys and the learning rate the plan gives its width (sizing.scaled_lr)."""
    return ["model.size=null", f"model.d_model={shape.d_model}", f"model.n_layers={shape.n_layers}",
            f"model.n_heads={shape.n_heads}", f"optim.lr={scaled_lr(lr, shape.d_model):.4g}"]


def scaled_shape(recipe, shape: Shape, factor: float) -> Shape:
    """The dial's shape (any width, in steps of 16) nearest `factor` times the parameters of `shape`, counted
    whole (embeddings included: at these sizes they are most of a model) at the recipe's vocabulary."""
    import dataclasses

    vocab = recipe.model.vocab_size or recipe.tokenizer.vocab_size

    def params(s: Shape) -> int:
        return count_parameters(dataclasses.replace(recipe.model, size=None, **s.keys()).config(vocab))

    target = params(shape) * factor
    return min((Shape.of(d) for d in range(16, 8 * shape.d_model, 16) if d % Shape.of(d).n_heads == 0),
               key=lambda s: abs(math.log(params(s) / target)))


def bytes_per_token(corpus: str, tokenizer_dir: Path) -> float:
    """UTF-8 bytes per token of `corpus` under the runs' tokenizer: the validation loss in bits per byte is the
    loss / ln 2 / this (the corpus's average; every size of a corpus is scored on the same batches)."""
    from tfkit.tokenization.corpus import iter_documents
    from tfkit.tokenization.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(tokenizer_dir)
    n_bytes = n_tokens = 0
    for text in iter_documents(corpus):
        n_bytes += len(text.encode("utf-8"))
        n_tokens += len(tokenizer.encode(text))
    return n_bytes / max(n_tokens, 1)


def run_one(recipe_name: str, sets: list[str], out: Path) -> dict:
    from tfkit.trainer.run import pretrain

    recipe = load_recipe(recipe_name, sets)
    started = time.process_time()
    result = pretrain(recipe, run_dir=out)
    return {"run_dir": str(out), "val_loss": result.final.loss, "steps": result.state.step,
            "tokens": result.state.tokens, "cpu_seconds": time.process_time() - started}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipe", default="quickstart")
    parser.add_argument("--corpus", default="stdlib:docs:train")
    parser.add_argument("--budget", type=float, default=300.0, help="CPU seconds of one thread per run")
    parser.add_argument("--shapes", default=None, help="d_model x layers, comma-separated (default: the plan's ladder)")
    parser.add_argument("--out", type=Path, default=Path("runs/plan-ladder"))
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    if args.quick:
        args.budget, args.out = 6.0, args.out.with_name(args.out.name + "-quick")
        args.shapes = args.shapes or "64x1,96x2"  # a plan needs 100 updates: more than a quick check's seconds
    cpu_budget()
    import torch

    torch.set_num_threads(1)
    cache = args.out / "cache"
    tag = args.corpus.replace(":", "-").replace("/", "-")
    base = base_overrides(args.corpus, None, cache, args.budget)
    rows = []
    first = None
    lr, batch_sets = load_recipe(args.recipe).optim.lr, []
    if args.shapes:
        shapes = [Shape.of(*map(int, s.split("x"))) for s in args.shapes.split(",")]
        planned = None
    else:
        from tfkit.trainer.plan import plan_recipe

        recipe = load_recipe(args.recipe, base + ["model.size=auto"])
        plan = plan_recipe(recipe, device="cpu", cpu_budget=True)
        print(plan.text(), file=sys.stderr)
        planned = plan.shape
        shapes = [scaled_shape(recipe, planned, 0.5), planned, scaled_shape(recipe, planned, 2.0)]
        batch = plan.recipe.train.batch_size  # every size at the plan's batch, and its lr for that batch
        lr *= (batch / recipe.train.batch_size) ** 0.5
        batch_sets = [f"train.batch_size={batch}"]
    for shape in shapes:
        out = args.out / f"{tag}-{args.budget:g}s-d{shape.d_model}x{shape.n_layers}"
        sets = base + batch_sets + shape_sets(shape, lr)
        if first is not None:
            sets.append(f"tokenizer.path={first / 'tokenizer'}")
        row = {"shape": f"d{shape.d_model} x {shape.n_layers} ({shape.n_heads} heads)",
               "planned": shape == planned, **run_one(args.recipe, sets, out)}
        first = first or out
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    valid = "stdlib:docs:valid" if args.corpus.startswith("stdlib:docs") else args.corpus
    per_token = bytes_per_token(valid, first / "tokenizer")  # the same tokenizer for every size
    for row in rows:
        row["bits_per_byte"] = row["val_loss"] / math.log(2) / per_token
        print(f"| {args.corpus} | {args.budget:g} | {row['shape']}{' (planned)' if row['planned'] else ''} | "
              f"{row['steps']:,} | {row['tokens']:,} | {row['val_loss']:.4f} | {row['bits_per_byte']:.4f} |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
