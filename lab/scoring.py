"""Scores of the lab's checkpoints: every checkpoint on the same tokens of every eval text, cached.

`evaluate` (evaluation/evaluate.py) is run with one fixed seed, the lab's token cache and the eval batch
settings of the recipe that trained the checkpoint, so two checkpoints with the same tokenizer are
scored on identical batches (the `data_fingerprint` of each score says so). Each checkpoint's scores go
to scores/NAME-seed-S.json as soon as they exist: a resumed lab scores only what is missing."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import ConfigError
from ..files import write_atomic
from ..jsonfile import read_json
from ..trainer.recipe import Recipe

if TYPE_CHECKING:
    from .engine import Lab
    from .plan import Job

KEPT = ("loss", "bits_per_byte", "byte_coverage", "token_accuracy", "tokens", "seq_len", "data_fingerprint", "params")


def eval_label(text: str) -> str:
    """A short column name for an eval text: `stdlib:docs:valid` -> docs-valid, a file -> its stem."""
    if text.startswith("stdlib:"):
        return "-".join(text.split(":")[1:])
    return Path(text).stem or text


def labels(lab: Lab) -> dict[str, tuple[str, int]]:
    """label -> (eval text, length factor): each eval text, and with the lengths probe each text scored
    at `factor` times the training length (`docs-valid@2x`)."""
    out = {label: (text, 1) for label, text in lab.evals.items()}
    for factor in lab.spec.probes.get("lengths") or []:
        out.update({f"{label}@{factor}x": (text, factor) for label, text in lab.evals.items()})
    return out


def scores_file(lab: Lab, job: Job) -> Path:
    safe = re.sub(r"[^\w.+%-]", "_", job.name)
    return lab.folder / "scores" / f"{safe}-seed-{job.seed}.json"


def score_checkpoint(checkpoint: Path, text: str, recipe: Recipe, factor: int, cache_dir: Path) -> dict:
    from ..evaluation.evaluate import evaluate

    result = evaluate(checkpoint, text, batch_size=recipe.eval.batch_size or recipe.train.batch_size,
                      max_batches=recipe.eval.batches, seq_len=recipe.data.seq_len * factor, seed=0,
                      cache_dir=cache_dir, show_progress=False)
    return {k: result[k] for k in KEPT}


def _read_scores(path: Path) -> dict:
    """The scores saved for a checkpoint: {eval label: {metric: value}}; a damaged file is one line."""
    have = read_json(path, ConfigError)
    if not all(isinstance(v, dict) for v in have.values()):
        raise ConfigError(f"{path}: damaged, expected an object of eval labels to scores; remove it and continue "
                          "the lab to score that checkpoint again")
    return have


def score_job(lab: Lab, job: Job, checkpoint: Path, recipe: Recipe) -> tuple[dict, bool]:
    """({label: metrics}, whether anything was computed now) for one checkpoint."""
    path = scores_file(lab, job)
    have = _read_scores(path) if path.is_file() else {}
    missing = {k: v for k, v in labels(lab).items() if k not in have}
    for label, (text, factor) in missing.items():
        have[label] = score_checkpoint(checkpoint, text, recipe, factor, lab.folder / "data")
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(have, indent=2) + "\n")
    return have, bool(missing)


def read_curves(lab: Lab) -> dict:
    """{name: {seed: [[step, val_loss], ...]}} of every training's metrics.jsonl."""
    from ..trainer.metrics import read_metrics

    out: dict = {}
    for job in lab.jobs:
        path = lab.folder / job.folder / "metrics.jsonl"
        if job.kind != "convert" and path.is_file():
            rows = [[r["step"], r["val_loss"]] for r in read_metrics(path) if "val_loss" in r]
            out.setdefault(job.name, {})[str(job.seed)] = rows
    return out


def pick_best(lab: Lab, rows: dict) -> dict:
    """Under `sweep`: add each variant's row as a copy of its best run's (lowest mean of the lab's metric
    over seeds on the first eval text), so verdicts compare each variant at its best setting; returns
    {"key", "values", "best": {variant: run}} ({} without a sweep). Every variant is chosen on the same
    text the same way, so the choice favours none of them."""
    from .plan import sweep_runs

    if not lab.spec.sweep:
        return {}
    label, metric = next(iter(lab.evals)), lab.spec.metric

    def mean_score(run: str) -> float:
        values = [s[metric] for s in rows[run]["scores"][label].values()]
        return sum(values) / len(values)

    best = {variant: min(runs, key=mean_score) for variant, runs in sweep_runs(lab.spec).items()}
    for variant, run in best.items():
        rows[variant] = {"kind": "best", "best_of": run, "scores": rows[run]["scores"]}
    ((key, values),) = lab.spec.sweep.items()
    return {"key": key, "values": values, "best": best}
