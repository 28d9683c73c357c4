"""Did each run train? The gates a comparison must pass before its verdict says anything about a design.

A run that ends at the loss of a unigram model of its training text has learned token frequencies and
nothing else: post-norm with and without warmup and sinusoidal positions once all ended at 6.795 nats on
docs-valid where the unigram model scores 6.790, and their differences were reported as findings. So every
training (from scratch, or uptraining) of every seed is checked, on the tokens its score was taken on
(the first eval text, the batches `evaluate` scores) against two figures:
- unigram: the cross-entropy of those tokens under the unigram distribution of the run's training tokens
  (add-one smoothed over the tokenizer's vocabulary);
- step 0: the loss of the weights the run started from: a training from scratch, its seed's initial
  weights rebuilt as the trainer builds them; an uptraining, the checkpoint it continued (its source row).
An MLM model is gated on the metric its claims are judged on: its loss on [MASK]ed positions only
(scoring.MASKED: every chosen position replaced by [MASK]), against the unigram figure of those positions. Under
the common 80/10/10 corruption a tenth of the targets stand in the input, and a BERT that copies them passed the
gate on the mixed loss while its masked positions stayed at the unigram loss. A run did not learn when its loss
is not below the unigram figure by MIN_GAIN; it diverged when its loss
is not finite or, trained from scratch, above its step-0 loss by more than MIN_GAIN (a run whose weights
never moved, lr 0, ends at its step-0 loss: it did not learn). A comparison involving such a run, or
a conversion or uptraining of one, reads "not tested: <variant> did not train" with the figures.

A training the trainer stopped (`TrainingDiverged`: train.max_bad_steps non-finite updates in a row) leaves
no final checkpoint. The lab records the trainer's message in the run folder (DIVERGED_FILE) instead of
stopping: the run's scores are not finite, its gate reads "diverged" with that message, and a lab whose
claim is that a run fails (`trains`/`fails`) still gets its verdict."""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import re
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from ..errors import ConfigError
from ..files import write_atomic
from ..jsonfile import read_json
from ..layout import TOKENIZER_FILES
from ..tokenization.batches import IGNORE_INDEX

if TYPE_CHECKING:
    from ..trainer.recipe import Recipe
    from .jobs import Lab
    from .plan import Job

MIN_GAIN = 0.05  # nats per token below the unigram figure a run must reach to count as having learned
DIVERGED_FILE = "diverged.json"  # in a run folder: the trainer stopped it on non-finite updates


def record_divergence(run_dir: Path, message: str) -> None:
    """Keep the trainer's reason in the run folder: the lab goes on, and a continued lab does not retrain it."""
    write_atomic(run_dir / DIVERGED_FILE, json.dumps({"message": message}) + "\n")


def divergence(run_dir: Path) -> str:
    """The trainer's message for a training it stopped on non-finite updates, or "" (module doc)."""
    path = run_dir / DIVERGED_FILE
    return str(read_json(path, ConfigError, expect=dict).get("message", "diverged")) if path.is_file() else ""


def diverged_scores(message: str) -> dict:
    """The scores of a run with no final checkpoint: not finite, with the reason."""
    return {"loss": math.nan, "bits_per_byte": math.nan, "masked_loss": math.nan, "error": math.nan, "diverged": message}


def gate(loss: float, unigram: float, step0: float | None, from_scratch: bool) -> str:
    """trained | did not learn | diverged, for one run and seed (module doc)."""
    if not math.isfinite(loss) or (from_scratch and step0 is not None and loss > step0 + MIN_GAIN):
        return "diverged"
    return "did not learn" if loss > unigram - MIN_GAIN else "trained"


def unigram_loss(train_tokens: np.ndarray, labels: np.ndarray, vocab_size: int) -> float:
    """Mean -log p(label) under the add-one smoothed unigram distribution of `train_tokens`, in nats."""
    size = max(vocab_size, int(labels.max()) + 1, int(train_tokens.max()) + 1 if len(train_tokens) else 0)
    counts = np.bincount(train_tokens.astype(np.int64), minlength=size) + 1.0
    log_p = np.log(counts) - math.log(counts.sum())
    return float(-log_p[labels].mean())


def scored_labels(checkpoint: Path, text: str, recipe: Recipe, cache_dir: Path,
                  masking: dict | None = None, batches: int | None = None) -> np.ndarray:
    """The target ids `scoring.score_checkpoint` scores for `checkpoint` on `text`: the same batches, in
    the same order, all of the text or its first `batches` (an MLM model's under `masking`: its masked-position
    score's)."""
    from ..checkpoints.record import CheckpointRecord
    from ..evaluation.evaluate import eval_batches
    from ..tokenization.train import load_tokenizer

    objective = CheckpointRecord.read(checkpoint).objective or "clm"
    rows, _ = eval_batches(load_tokenizer(checkpoint), text, objective, seq_len=recipe.data.seq_len,
                           batch_size=recipe.eval.batch_size or recipe.train.batch_size, stride=None, seed=0,
                           cache_dir=cache_dir, show_progress=False, masking=masking)
    out = []
    for batch in itertools.islice(rows, batches):
        labels = batch["labels"]  # (B, T), IGNORE_INDEX where nothing is scored
        out.append(labels[labels != IGNORE_INDEX].numpy())
    return np.concatenate(out)


def unigram_figure(checkpoint: Path, text: str, recipe: Recipe, cache_dir: Path, masking: dict | None = None,
                   batches: int | None = None) -> float:
    """The unigram cross-entropy of the tokens `checkpoint` is scored on, from its training text."""
    from ..tokenization.shards import prepare_tokens
    from ..tokenization.train import load_tokenizer

    tokenizer = load_tokenizer(checkpoint)
    train = prepare_tokens(recipe.data.train, tokenizer, cache_dir, text_field=recipe.data.text_field,
                           show_progress=False)
    return unigram_loss(np.asarray(train.tokens), scored_labels(checkpoint, text, recipe, cache_dir, masking, batches),
                        tokenizer.vocab_size)


def initial_loss(checkpoint: Path, seed: int, text: str, recipe: Recipe, cache_dir: Path,
                 batches: int | None = None) -> float:
    """The loss of the initial weights of a run from scratch (the trainer seeds `train.seed`, then builds
    the model), scored exactly as its final checkpoint is: written to a scratch folder, then evaluated."""
    from ..checkpoints.record import CheckpointRecord
    from ..checkpoints.weights import save_model
    from ..models import build_model
    from .scoring import score_checkpoint

    record = CheckpointRecord.read(checkpoint)
    torch.manual_seed(seed)
    model = build_model(record.model)
    with tempfile.TemporaryDirectory(prefix="step-0-", dir=cache_dir.parent) as tmp:  # the lab folder
        save_model(model, Path(tmp), record)
        for name in TOKENIZER_FILES:
            if (checkpoint / name).is_file():
                (Path(tmp) / name).write_bytes((checkpoint / name).read_bytes())
        scores = score_checkpoint(Path(tmp), text, recipe, 1, cache_dir, batches=batches)
        return scores.get("masked_loss", scores["loss"])  # an MLM model's gate reads its masked positions


def _cached(lab: Lab, job: Job, key: str, compute) -> float:
    """One figure of one job, kept in gates/NAME-seed-S.json so a continued lab does not redo it."""
    safe = re.sub(r"[^\w.+%-]", "_", job.name)
    path = lab.folder / "gates" / f"{safe}-seed-{job.seed}.json"
    have = read_json(path, ConfigError, expect=dict) if path.is_file() else {}  # damaged: one line, not a traceback
    if key not in have:
        have[key] = compute()
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(have, indent=2) + "\n")
    return have[key]


def check_runs(lab: Lab, rows: dict, sweep: dict) -> dict:
    """{"label", "min_gain", "runs": {name: {"kind", "source", "seeds": {seed: {loss, unigram, step0,
    status}}}}} for every job of the lab; conversions carry only their source (they are not trained), and
    so does a swept variant (its source is its best run). A downstream fine-tuning's gate is its Matthews
    correlation on the task's held-out labels instead (downstream.task_gate)."""
    from .downstream import task_gate
    from .jobs import checkpoint_of, scoring_recipe

    from .scoring import MASKED, covers, scored_batches

    label = next(iter(lab.evals))
    text, unigrams, runs, metrics = lab.evals[label], {}, {}, set()
    for job in lab.jobs:
        entry = runs.setdefault(job.name, {"kind": job.kind, "source": job.source, "seeds": {}})
        if job.kind == "convert":
            continue
        message = divergence(lab.folder / job.folder)
        if message:  # stopped by the trainer: nothing to hold against the unigram and step-0 figures
            entry["seeds"][str(job.seed)] = {"loss": math.nan, "unigram": None, "step0": None, "status": "diverged",
                                             "why": message}
            continue
        if job.kind == "finetune":  # judged on its task's labels: better than chance (downstream.py)
            (task,) = rows[job.name]["scores"].values()
            entry["seeds"][str(job.seed)] = task_gate(task[str(job.seed)])
            continue
        checkpoint, recipe = checkpoint_of(lab, job), scoring_recipe(lab, job)
        masked = recipe.objective.name == "mlm"  # gated on [MASK]ed positions only: no copying the visible 10%
        metric, suffix = ("masked_loss", "_masked") if masked else ("loss", "")
        metrics.add(metric)
        material = (checkpoint / "tokenizer.json").read_bytes() if (checkpoint / "tokenizer.json").is_file() else b""
        key = json.dumps([hashlib.sha256(material).hexdigest(), recipe.data.train, recipe.data.seq_len,
                          recipe.eval.batch_size or recipe.train.batch_size, masked])
        batches = scored_batches(lab, recipe)  # the key says what was read: a figure of other rows is computed again
        if key not in unigrams:
            unigrams[key] = _cached(lab, job, f"unigram{suffix}/{covers(batches)}", lambda: unigram_figure(
                checkpoint, text, recipe, lab.folder / "data", MASKED if masked else None, batches))
        loss = rows[job.name]["scores"][label][str(job.seed)][metric]
        if job.kind == "train":
            step0 = _cached(lab, job, f"step0{suffix}/{covers(batches)}", lambda: initial_loss(
                checkpoint, job.seed, text, recipe, lab.folder / "data", batches))
        else:
            step0 = rows[job.source]["scores"][label][str(job.seed)][metric]
        entry["seeds"][str(job.seed)] = {"loss": loss, "unigram": unigrams[key], "step0": step0,
                                         "status": gate(loss, unigrams[key], step0, job.kind == "train")}
    for variant, run in sweep.get("best", {}).items():
        runs[variant] = {"kind": "best", "source": run, "seeds": {}}
    return {"label": label, "min_gain": MIN_GAIN, "runs": runs, "metric": "masked_loss" if metrics == {"masked_loss"}
            else "loss" if metrics <= {"loss"} else "loss (masked_loss for the MLM runs)"}
