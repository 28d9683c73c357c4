"""Does tfkit's pretraining pay downstream? A BERT planned by `tfkit plan` for 15 minutes of one CPU thread
(`model.size: auto`, `train.max_time: 15m`) and pretrained on AG News' unlabelled training texts, against the
same shape from random init, where labels are few; and the whole path from raw text to a classifier against
HuggingFace's at equal CPU time.

    python -m experiments.finetune_pretraining [--data CSV] [--threads N] [--json OUT]   # about 55 minutes
    python -m experiments.finetune_pretraining --quick   # seconds: made-up topics, tiny sizes; checks it runs

Run from the repository root (it shares the fine-tuning benchmark's helpers: benchmarks/finetune.py,
finetune_hf.py, finetune_setup.py). The data is AG News' test file (`--data`, default
`../shared/data/ag_news_test.csv`: class index, title, description), split in file order into 6,000 items to
train on and the last 1,600 to score; nothing is downloaded. Everything is fp32 on one thread (`--threads`).
The latest results are in experiments/RESULTS.md ("Does pretraining pay").

The size is the plan's, not a fixed one, because that is what a user with a CPU and a quarter of an hour
gets from `model.size: auto` (issue 49: "pretraining pays within a CPU budget a user would spend"); the
random-init control has the pretrained checkpoint's whole architecture (`same_shape`). Pretraining pays where
labels are few, not where a topic classifier trains well from scratch: with the 6,000 labelled training items
a randomly initialised bert-tiny reaches 85% in 374 updates and a few CPU minutes of MLM on the same 6,000
texts gave it nothing (experiments/RESULTS.md). So the question is asked in the few-label regime, fairly for
both starting points:
- `few_labels` items, an equal share of each class, drawn per seed from the training items but the last
  `val_items`, which are held back to choose the fine-tuning rate and never scored;
- each start (pretrained, random init with the same tokenizer) fine-tuned at every rate of `few_lrs` for
  `few_epochs` epochs, on the same items in the same order per seed;
- each start at its own best rate (the best mean accuracy on the held-back items over the seeds), scored
  on the scored items; the goal: pretrained above random on every seed.
Beside it, the same comparison with every training label at one rate (no goal: where pretraining does not
pay), and the row that needs that run's accuracies: the whole tfkit path (tokenizer, `pretrain`, `finetune`)
against HF's (a `tokenizers` WordPiece, run_mlm's loop for the same CPU seconds as `tfkit pretrain` took,
run_glue's loop with the same fine-tuning hyperparameters), scored on the same labels.
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from benchmarks import finetune_hf as hf
from benchmarks.common import Context, Goal, Row, machine, table, write_json
from benchmarks.finetune import (DROPOUT, Env, bundled, final_accuracy, finetune_recipe, run_recipe, scratch_env,
                                 spread, tfkit_finetune)
from benchmarks.finetune_setup import Item, Split, check_data, read_items, synthetic_items, write_csv, write_split

from tfkit.trainer.resources import count_parameters

if TYPE_CHECKING:  # transformers is imported where used
    from transformers import BertConfig

PRETRAIN_GOAL = Goal("> random init, every seed", 1.0)
DATA = Path("../shared/data/ag_news_test.csv")


@dataclass(frozen=True)
class Sizes:
    """How much of everything a run does (FULL: about 55 minutes on one thread; QUICK: seconds)."""

    n_train: int  # items of the split to train on (the first ones of the file)
    n_test: int  # items scored (the last ones)
    seeds: tuple[int, ...]
    pretrain_time: str  # train.max_time of the planned pretraining (model.size: auto): the plan's budget
    vocab_size: int  # its tokenizer (and HF's)
    tiny: hf.Hyper  # fine-tuning bert-tiny (pretrained or not, either path) on every training label
    few_labels: int  # labelled items per seed for the goal, an equal share per class
    val_items: int  # the last training items, held back to choose each start's rate, never labelled for training
    few_lrs: tuple[float, ...]  # the rates each start is fine-tuned at on few labels
    few_epochs: int


FULL = Sizes(6000, 1600, (1, 2, 3), "15m", 4096, hf.Hyper(lr=2e-3, steps=374, warmup=37), 500, 400,
             (5e-4, 1e-3, 2e-3), 10)
QUICK = Sizes(256, 64, (1,), "4s", 200, hf.Hyper(lr=2e-3, steps=6, warmup=1), 32, 16, (2e-3,), 2)


@dataclass(frozen=True)
class Pretrained:
    """The planned pretraining's run folder and what it cost and chose."""

    run_dir: Path
    cpu_s: float  # the command's CPU seconds: plan, tokenizer training and token caching included
    updates: int
    shape: str  # e.g. "d_model 160, 2 layers, 5 heads, 1.29M parameters"


def pretrain_planned(env: Env, split: Split, sizes: Sizes) -> Pretrained:
    """`tfkit pretrain bert-tiny` with `model.size: auto` for `sizes.pretrain_time` on the training texts (its
    own WordPiece tokenizer, MLM, fp32, one thread): the plan measures this machine and chooses the shape,
    batch, rate and updates, as it does for a user."""
    recipe = bundled("bert-tiny")
    recipe["model"]["size"] = "auto"
    recipe["tokenizer"]["vocab_size"] = sizes.vocab_size
    recipe["data"].update(train=str(split.corpus), valid=None)
    recipe["train"].update(max_time=sizes.pretrain_time, log_every=100, eval_every=10**6, save_every=10**6,
                           keep_last=1, precision="fp32", device="cpu", threads=env.threads)
    recipe["log"].update(tensorboard=False, plot=False, progress=False)
    if env.ctx.quick:  # a few kB of text: its held-out share is a couple of rows
        recipe["eval"].update(batches=1, batch_size=2)
    env.ctx.log(f"pretraining: tfkit pretrain bert-tiny, model.size auto for {sizes.pretrain_time}")
    run_dir, seconds = run_recipe(env, "pretrain", "bert-planned", recipe)
    record = checkpoint_record(run_dir)
    cfg = record.model
    shape = (f"d_model {cfg.d_model}, {cfg.n_layers} layers, {cfg.n_heads} heads, "
             f"{count_parameters(cfg) / 1e6:.2f}M parameters")
    return Pretrained(run_dir, seconds, int(record.step), shape)


def checkpoint_record(run_dir: Path):
    """The `CheckpointRecord` of a run folder's final checkpoint (its model config and steps)."""
    from tfkit.checkpoints.folders import resolve_checkpoint
    from tfkit.checkpoints.record import CheckpointRecord

    return CheckpointRecord.read(resolve_checkpoint(run_dir))


def same_shape(run_dir: Path) -> dict:
    """The model keys that rebuild the pretrained checkpoint's architecture from random init: every field of its
    `ModelConfig` but the ones the fine-tuning recipe or its tokenizer sets (vocabulary, padding id, dropout,
    length)."""
    keys = checkpoint_record(run_dir).model.to_dict()
    for set_elsewhere in ("vocab_size", "pad_token_id", "dropout", "attn_dropout", "max_seq_len"):
        keys.pop(set_elsewhere)
    return {"size": None, **keys}


def hf_config(run_dir: Path, vocab_size: int) -> BertConfig:
    """The `BertConfig` of the architecture tfkit pretrained (its checkpoint's config.json), HF's vocabulary."""
    import transformers as tr

    cfg = checkpoint_record(run_dir).model
    return tr.BertConfig(vocab_size=vocab_size, hidden_size=cfg.d_model, num_hidden_layers=cfg.n_layers,
                         num_attention_heads=cfg.n_heads, intermediate_size=cfg.ffn_dim, hidden_act=cfg.activation,
                         max_position_embeddings=cfg.max_seq_len, type_vocab_size=cfg.type_vocab_size,
                         layer_norm_eps=cfg.norm_eps, hidden_dropout_prob=cfg.dropout,
                         attention_probs_dropout_prob=cfg.attn_dropout, pad_token_id=0)


def hf_path(env: Env, split: Split, sizes: Sizes, run_dir: Path, budget_s: float) -> tuple[list[float], dict]:
    """HF's raw text -> classifier (see the module doc): the accuracy of each seed and what it cost."""
    ctx, tiny = env.ctx, sizes.tiny
    ctx.log(f"pretraining: HF path, tokenizer + run_mlm loop for {budget_s:.0f} CPU s")
    start = time.process_time()
    tokenizer = hf.train_wordpiece(split.texts(), sizes.vocab_size)
    blocks = hf.group_texts(tokenizer, split.texts(), tiny.max_len)
    prepared = time.process_time() - start
    recipe = bundled("bert-tiny")
    optim = recipe["optim"]
    mlm_hyper = hf.Hyper(lr=float(optim["lr"]), steps=0, warmup=0, beta2=float(optim["beta2"]),
                         weight_decay=float(optim["weight_decay"]), grad_clip=float(optim["grad_clip"]))
    mlm, steps, seconds = hf.pretrain_mlm(hf_config(run_dir, len(tokenizer)), tokenizer, blocks, mlm_hyper,
                                          budget_s - prepared, seed=1337,
                                          mask_prob=float(recipe["objective"]["mask_prob"]))
    train_features = hf.encode(tokenizer, split.train, tiny.max_len)
    test_features = hf.encode(tokenizer, split.test, tiny.max_len)
    accuracies, tuning = [], 0.0
    for seed in sizes.seeds:
        ctx.log(f"pretraining: HF path, run_glue loop, seed {seed}")
        start = time.process_time()
        model = hf.classifier(mlm, 4, seed, dropout=DROPOUT)
        hf.finetune(model, tokenizer, train_features, hf.labels_of(split.train), tiny, seed)
        accuracies.append(hf.accuracy(model, tokenizer, test_features, hf.labels_of(split.test), tiny.eval_batch))
        ctx.log(f"pretraining: HF path, seed {seed}: {100 * accuracies[-1]:.2f}")
        tuning += time.process_time() - start
    return accuracies, {"pretrain_cpu_s": prepared + seconds, "mlm_updates": steps,
                        "finetune_cpu_s": tuning / len(sizes.seeds)}


def few_label_sets(split: Split, sizes: Sizes, seed: int) -> list[Item]:
    """`sizes.few_labels` training items, an equal share per class, drawn with `seed` from the training
    items that are not held back (the last `sizes.val_items`), in a seeded order."""
    rng, pool = random.Random(seed), split.train[:-sizes.val_items]
    by_class: dict[str, list[Item]] = {}
    for item in pool:
        by_class.setdefault(item[0], []).append(item)
    share = sizes.few_labels // len(by_class)
    chosen = [item for label in sorted(by_class) for item in rng.sample(by_class[label], share)]
    rng.shuffle(chosen)
    return chosen


def start_recipe(env: Env, split: Split, train_csv: Path, hyper: hf.Hyper, seed: int, planned: Pretrained,
                 pretrained: bool) -> dict:
    """The fine-tuning recipe of one start: from the pretrained checkpoint, or its architecture from random init
    reading text with its tokenizer."""
    if pretrained:
        return finetune_recipe(env, split, train_csv, hyper, seed, init_from=planned.run_dir, pooling="mean")
    recipe = finetune_recipe(env, split, train_csv, hyper, seed, init_from=None,
                             tokenizer=planned.run_dir / "tokenizer", pooling="mean")
    recipe["model"].update(same_shape(planned.run_dir))
    return recipe


def few_label_row(env: Env, split: Split, sizes: Sizes, planned: Pretrained) -> Row:
    """The goal (module doc): pretrained against random init on few labels, each at its own best rate."""
    from tfkit.evaluation.classify import score_classifier

    held_back = write_csv(split.folder / "held-back.csv", split.train[-sizes.val_items:])
    steps = max(1, sizes.few_epochs * sizes.few_labels // sizes.tiny.batch_size)
    starts = ("pretrained", "random")
    scores: dict[tuple[str, float], list[tuple[float, float]]] = {}  # (start, lr) -> [(held back, scored)] per seed
    for seed in sizes.seeds:
        train_csv = write_csv(split.folder / f"few-{seed}.csv", few_label_sets(split, sizes, seed))
        for start in starts:
            for lr in sizes.few_lrs:
                hyper = hf.Hyper(lr=lr, steps=steps, warmup=max(1, steps // 10), batch_size=sizes.tiny.batch_size)
                recipe = start_recipe(env, split, train_csv, hyper, seed, planned, start == "pretrained")
                recipe["data"]["valid"] = str(held_back)
                folder, _ = run_recipe(env, "finetune", f"few-{start}-{lr:g}-{seed}", recipe)
                held = final_accuracy(folder)
                scored = score_classifier(folder, str(split.test_csv), batch_size=hyper.eval_batch,
                                          device=torch.device("cpu"))["accuracy"]
                shutil.rmtree(folder, ignore_errors=True)
                scores.setdefault((start, lr), []).append((held, scored))
                env.ctx.log(f"pretraining: {sizes.few_labels} labels, {start}, lr {lr:g}, seed {seed}: held back "
                            f"{100 * held:.2f}, scored {100 * scored:.2f}")
    best = {start: max(sizes.few_lrs, key=lambda lr: statistics.mean(h for h, _ in scores[start, lr]))
            for start in starts}
    pre, rand = ([s for _, s in scores[start, best[start]]] for start in ("pretrained", "random"))
    gaps = "/".join(f"{100 * (p - r):+.1f}" for p, r in zip(pre, rand))
    every = "; ".join(f"{start} lr {lr:g}: {spread([s for _, s in scores[start, lr]])}"
                      for start in starts for lr in sizes.few_lrs)
    return Row("pretraining", f"accuracy on {sizes.few_labels} labels (an equal share per class, drawn per seed), "
                           f"a BERT planned for {sizes.pretrain_time} ({planned.shape}, "
                           f"{planned.updates:,} MLM updates on the {len(split.train):,} training texts) vs its "
                           f"shape from random init, each at its best rate of {list(sizes.few_lrs)} on "
                           f"{sizes.val_items} held-back items, {sizes.few_epochs} epochs "
                           f"({steps} updates), {len(split.test):,} scored", "acc %",
               100 * statistics.mean(pre), 100 * statistics.mean(rand), goal=PRETRAIN_GOAL,
               paired=min(p / r for p, r in zip(pre, rand)),
               note=f"best lr pretrained {best['pretrained']:g}, random {best['random']:g}; pretrained {spread(pre)}, "
                    f"random {spread(rand)}; gap per seed {gaps} points; ratio = worst seed; every rate: {every}",
               extra={"pretrained": pre, "random": rand, "best_lr": best,
                      "every": {f"{start}|{lr:g}": scores[start, lr] for start, lr in scores}})


def pretraining_rows(env: Env, split: Split, sizes: Sizes) -> list[Row]:
    """tfkit's planned BERT against its shape from random init (few labels: the goal; every label: no goal),
    and tfkit's raw-text path against HF's."""
    planned = pretrain_planned(env, split, sizes)
    rows = [few_label_row(env, split, sizes, planned)]
    tiny, runs = sizes.tiny, {"pretrained": [], "random": []}
    tuning = 0.0
    for seed in sizes.seeds:
        for kind in ("pretrained", "random"):
            env.ctx.log(f"pretraining: every label, {kind}, seed {seed}")
            recipe = start_recipe(env, split, split.train_csv, tiny, seed, planned, kind == "pretrained")
            accuracy, seconds = tfkit_finetune(env, f"tiny-{kind}-{seed}", recipe)
            env.ctx.log(f"pretraining: every label, {kind}, seed {seed}: {100 * accuracy:.2f}")
            runs[kind].append(accuracy)
            tuning += seconds if kind == "pretrained" else 0.0
    budget = min(planned.cpu_s, 2.0) if env.ctx.quick else planned.cpu_s  # --quick: only the HF loop's pace matters
    theirs, cost = hf_path(env, split, sizes, planned.run_dir, budget)
    pre, rand = runs["pretrained"], runs["random"]
    gaps = "/".join(f"{100 * (p - r):+.1f}" for p, r in zip(pre, rand))
    shape = (f"a BERT planned for {sizes.pretrain_time} ({planned.shape}), {planned.updates:,} MLM updates on the "
             f"{len(split.train):,} training texts ({planned.cpu_s:.0f} CPU s, plan and tokenizer included)")
    tuned = (f"fine-tuned {tiny.steps} updates of {tiny.batch_size}, lr {tiny.lr:g}, {len(split.test):,} scored, "
             f"seeds {list(sizes.seeds)}")
    return rows + [
        Row("pretraining", f"accuracy on all {len(split.train):,} labels, {shape}, vs the same architecture from "
                           f"random init; {tuned}", "acc %", 100 * statistics.mean(pre), 100 * statistics.mean(rand),
            paired=min(p / r for p, r in zip(pre, rand)),
            note=f"pretrained {spread(pre)}, random {spread(rand)}; gap per seed {gaps} points; ratio = worst seed",
            extra={"pretrained": pre, "random": rand, "pretrain_cpu_s": planned.cpu_s}),
        Row("pretraining", f"accuracy from raw text: tfkit (pretrain: tokenizer + MLM, then finetune) vs HF "
                           f"(tokenizers WordPiece + run_mlm loop for the same CPU seconds, then run_glue loop); "
                           f"{tuned}", "acc %",
            100 * statistics.mean(pre), 100 * statistics.mean(theirs),
            note=(f"tfkit {spread(pre)}, HF {spread(theirs)}; pretraining CPU tfkit {planned.cpu_s:.0f} s "
                  f"({planned.updates} updates), HF {cost['pretrain_cpu_s']:.0f} s ({cost['mlm_updates']} "
                  f"updates); a fine-tuning {tuning / len(sizes.seeds):.0f} s vs {cost['finetune_cpu_s']:.0f} s; "
                  "tfkit pools the mean, HF's [CLS] pooler"),
            extra={"tfkit": pre, "hf": theirs, "tfkit_pretrain_cpu_s": planned.cpu_s, **cost}),
    ]


def run(ctx: Context) -> list[Row]:
    """The rows of the module doc at FULL sizes on `ctx.finetune_data`, or QUICK ones on made-up topics."""
    sizes = QUICK if ctx.quick else FULL
    with scratch_env(ctx, "tfkit-experiment-pretraining-") as env:
        items = synthetic_items(sizes.n_train + sizes.n_test) if ctx.quick else read_items(ctx.finetune_data)
        split = write_split(items, env.work / "data", sizes.n_train, sizes.n_test,
                            "made-up topics" if ctx.quick else "AG News")
        return pretraining_rows(env, split, sizes)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.finetune_pretraining",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="made-up topics, tiny sizes: seconds; not a result")
    parser.add_argument("--data", type=Path, default=DATA,
                        help=f"AG News' test CSV (label, title, description), split 6,000 to train on and 1,600 to "
                             f"score (default {DATA})")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads for torch (default 1)")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows as JSON to this file")
    args = parser.parse_args(argv)
    if not args.quick:
        problem = check_data(args.data, FULL.n_train, FULL.n_test)
        if problem:
            parser.error(f"--data: {problem}")
    torch.set_num_threads(args.threads)
    ctx = Context("cpu", args.quick, False, torch.device("cpu"), clock="cpu", finetune_data=args.data)
    rows = run(ctx)
    info = {**machine(), "torch_threads": torch.get_num_threads()}
    print(f"# does pretraining pay{' (quick: not a result)' if args.quick else ''}: {info['cpu']} x{info['cores']}, "
          f"torch {info['torch']}, transformers {info.get('transformers', '-')}, "
          f"{time.perf_counter() - ctx.started:.0f} s")
    print(table(rows))
    if args.json:
        write_json(args.json, {"quick": args.quick, "machine": info, "rows": [r.to_dict() for r in rows]})
        print(f"# wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
