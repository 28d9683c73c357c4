"""Scores of the lab's checkpoints: every checkpoint on the whole of every eval text, cached.

`evaluate` (evaluation/evaluate.py) is run with one fixed seed, the lab's token cache and the eval batch
size of the recipe that trained the checkpoint, over all of the text, so two checkpoints with the same tokenizer
are scored on identical batches (the `data_fingerprint` of each score says so) and two with different
tokenizers on the same text. A text is not cut to a number of batches: a text runs in document order, its
first batches are one corner of it (the first 10 of stdlib:code:valid scored 0.4 bits per byte below all of it),
and a batch of one tokenizer's tokens holds other text than a batch of another's (a --quick lab, a test of the
engine with no verdict, reads the first eval.batches batches: `scored_batches`). Each checkpoint's scores go
to scores/NAME-seed-S.json as soon as they exist: a resumed lab scores only what is missing.

A checkpoint is scored under the packed layout it trained with (`evaluate` reads its document mask and
restarted positions from config.json). With `whole_documents`, every eval text is also scored document by
document (column LABEL@whole): each document from its own start, never after another document's tail, in
windows of data.seq_len tokens that advance by half a window (evaluate's sliding windows, so every token
past a document's first window keeps half a window of its own document as context).

With `probes: {lengths: [...]}`, column LABEL@Nx holds the degradation past the training length at rows of
N x data.seq_len tokens (lengths.py), not an overall loss. With `own_masking`, an MLM checkpoint is also
scored under the masking it trained with (column LABEL@own: its own mask_prob, mask_replace and whole-word
setting, drawn with the same fixed seed), beside the common one every checkpoint is scored under (the
recipe's defaults, 15% with 80/10/10 unless the spec's `set` changes them): a model trained at 40% or with
[MASK] only is then seen on its own task too, not only on the one the reference trained for."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from ..errors import ConfigError
from ..files import write_atomic
from ..jsonfile import read_json
from ..trainer.recipe import Recipe
from .plan import LM_KINDS
from .spec import sweep_runs

if TYPE_CHECKING:
    from .jobs import Lab
    from .plan import Job

KEPT = ("loss", "bits_per_byte", "byte_coverage", "token_accuracy", "tokens", "seq_len", "data_fingerprint", "params")


def eval_label(text: str) -> str:
    """A short column name for an eval text: `stdlib:docs:valid` -> docs-valid, a file -> its stem."""
    if text.startswith("stdlib:"):
        return "-".join(text.split(":")[1:])
    return Path(text).stem or text


WHOLE = "@whole"  # the suffix of a whole-document column
OWN = "@own"  # the suffix of a column scored under each checkpoint's own masking


class Column(NamedTuple):
    """How one column of the table is scored: `text` at `factor` x the training length (factor > 1: the
    degradation past it), document by document (`whole`), or under the checkpoint's own masking (`own`)."""
    text: str
    factor: int = 1
    whole: bool = False
    own: bool = False


def labels(lab: Lab) -> dict[str, Column]:
    """label -> Column: each eval text, with the lengths probe each text at `factor` times the training
    length (`docs-valid@2x`), with `whole_documents` each text document by document (`docs-valid@whole`),
    with `own_masking` each text under each checkpoint's own masking (`docs-valid@own`)."""
    out = {label: Column(text) for label, text in lab.evals.items()}
    for factor in lab.spec.probes.get("lengths") or []:
        out.update({f"{label}@{factor}x": Column(text, factor) for label, text in lab.evals.items()})
    if lab.spec.whole_documents:
        out.update({f"{label}{WHOLE}": Column(text, whole=True) for label, text in lab.evals.items()})
    if lab.spec.own_masking:
        out.update({f"{label}{OWN}": Column(text, own=True) for label, text in lab.evals.items()})
    return out


def is_degradation(label: str) -> bool:
    """Whether a column holds a degradation past the training length (LABEL@Nx), not a loss."""
    return re.fullmatch(r".*@\d+x", label) is not None


def scores_file(lab: Lab, job: Job) -> Path:
    safe = re.sub(r"[^\w.+%-]", "_", job.name)
    return lab.folder / "scores" / f"{safe}-seed-{job.seed}.json"


def own_masking(recipe: Recipe) -> dict:
    """The MLM masking `recipe` trains with, as `EvalRequest.masking` takes it."""
    o = recipe.objective
    return {"mask_prob": o.mask_prob, "mask_replace": list(o.mask_replace), "whole_word": o.whole_word_mask}


def scored_batches(lab: Lab, recipe: Recipe) -> int | None:
    """How much of each eval text is scored: all of it (None), or in a --quick lab (a test of the engine, which
    gives no verdict) the first eval.batches batches, so that checking every spec stays fast."""
    return recipe.eval.batches if lab.options.quick else None


def covers(batches: int | None) -> str:
    """What a score or gate figure read of its text, kept with it: a continued lab redoes one that differs."""
    return "all" if batches is None else f"first {batches} batches"


def score_checkpoint(checkpoint: Path, text: str, recipe: Recipe, factor: int, cache_dir: Path,
                     whole: bool = False, own: bool = False, batches: int | None = None) -> dict:
    """The kept metrics of `checkpoint` on `text` (all of it, or its first `batches` batches): packed blocks of
    data.seq_len tokens (under the checkpoint's own masking with `own`), the degradation past the training
    length at `factor` > 1, or with `whole` document by document (module doc)."""
    from ..evaluation.evaluate import EvalRequest, evaluate
    from .lengths import past_training_length

    batch_size, seq_len = recipe.eval.batch_size or recipe.train.batch_size, recipe.data.seq_len * factor
    if factor > 1:
        return past_training_length(checkpoint, text, recipe.data.seq_len, factor, batch_size, recipe.eval.batches,
                                    cache_dir)
    if whole:
        cut = None if batches is None else batches * batch_size * seq_len  # tokens: windows are not batches
        request = EvalRequest(batch_size=batch_size, seq_len=seq_len, stride=max(1, seq_len // 2), cache_dir=cache_dir,
                              show_progress=False, max_tokens=cut)
    else:
        request = EvalRequest(batch_size=batch_size, seq_len=seq_len, cache_dir=cache_dir, show_progress=False,
                              max_batches=batches, masking=own_masking(recipe) if own else None)
    result = evaluate(checkpoint, text, request)
    out = {k: result[k] for k in KEPT} | {"covers": covers(batches)} | ({"masking": own_masking(recipe)} if own else {})
    if recipe.objective.name == "mlm" and not (whole or own):
        out.update(masked_scores(checkpoint, text, request))
    return out


# The positions an MLM model cannot solve by copying its input: every chosen position (the common 15%) replaced by
# [MASK]. Under 80/10/10 a tenth of the targets are visible in the input, and a model that copies them scores a
# loss the unigram gate accepts while it predicts masked tokens no better than token frequencies (docs/lab.md).
MASKED = {"mask_prob": 0.15, "mask_replace": [1.0, 0.0, 0.0], "whole_word": False}


def masked_scores(checkpoint: Path, text: str, request) -> dict:
    """{masked_loss, masked_tokens}: the loss on [MASK]ed positions only (MASKED), the same batches otherwise."""
    from dataclasses import replace

    from ..evaluation.evaluate import evaluate

    result = evaluate(checkpoint, text, replace(request, masking=MASKED))
    return {"masked_loss": result["loss"], "masked_tokens": result["tokens"]}


def has_masked(recipe: Recipe, column: Column, scores: dict) -> bool:
    """Whether a cached score has what this column needs: an MLM model's plain column its masked-position loss."""
    plain = column.factor == 1 and not (column.whole or column.own)
    return not (recipe.objective.name == "mlm" and plain) or "masked_loss" in scores


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
    # a degradation column written before it split rows at the training length held an overall loss: redone
    batches = scored_batches(lab, recipe)
    missing = {k: v for k, v in labels(lab).items() if k not in have or (v.factor > 1 and "past_loss" not in have[k])
               or not has_masked(recipe, v, have[k])  # a score written before masked_loss existed: redone
               or (v.factor == 1 and have[k].get("covers") != covers(batches))}  # of other rows (first ones): redone
    for label, column in missing.items():
        have[label] = score_checkpoint(checkpoint, column.text, recipe, column.factor, lab.folder / "data",
                                       column.whole, column.own, batches)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(have, indent=2) + "\n")
    return have, bool(missing)


def read_curves(lab: Lab) -> dict:
    """{name: {seed: [[step, val_loss], ...]}} of every training's metrics.jsonl."""
    from ..checkpoints.run_record import read_metrics

    out: dict = {}
    for job in lab.jobs:
        path = lab.folder / job.folder / "metrics.jsonl"
        if job.kind in LM_KINDS and path.is_file():
            rows = [[r["step"], r["val_loss"]] for r in read_metrics(path) if "val_loss" in r]
            out.setdefault(job.name, {})[str(job.seed)] = rows
    return out


def sweep_label(lab: Lab) -> str:
    """The eval text a sweep picks on: the spec's `sweep_on`, else the second eval text (the first, the lab's own
    held-out text, is the one verdicts are read on by default), else the only one (and the report says so)."""
    labels = list(lab.evals)
    return lab.spec.sweep_on or (labels[1] if len(labels) > 1 else labels[0])


def pick_best(lab: Lab, rows: dict) -> dict:
    """Under `sweep`: add each variant's row as a copy of its best run's (lowest mean of the lab's metric over
    seeds on the selection text, `sweep_label`), so verdicts compare each variant at its best setting; returns
    {"key", "values", "best": {variant: run}, "on": the selection text, "edges": {variant: where}} ({} without a
    sweep). Every variant is chosen the same way on a text the verdicts are not read on (unless the lab has only
    one), so the choice favours none of them and the verdict is not read on the noise it was picked on; a best
    value at the end of a numeric grid is named in `edges` (a better one may lie beyond it)."""
    if not lab.spec.sweep:
        return {}
    label, metric = sweep_label(lab), lab.spec.metric
    ((key, values),) = lab.spec.sweep.items()

    def mean_score(run: str) -> float:
        values = [s[metric] for s in rows[run]["scores"][label].values()]
        mean = sum(values) / len(values)
        return mean if math.isfinite(mean) else math.inf  # a run that diverged is nobody's best

    best, edges = {}, {}
    for variant, runs in sweep_runs(lab.spec).items():
        names = list(runs)  # in the order of `values`
        best[variant] = min(names, key=mean_score)
        value = values[names.index(best[variant])]
        if all(isinstance(v, (int, float)) for v in values) and value in (min(values), max(values)):
            edges[variant] = "smallest" if value == min(values) else "largest"
    for variant, run in best.items():
        rows[variant] = {"kind": "best", "best_of": run, "scores": rows[run]["scores"]}
    return {"key": key, "values": values, "best": best, "on": label, "edges": edges}


def sweep_warnings(results: dict) -> list[str]:
    """What a reader must know about a sweep's choice: a best value at the edge of its grid, and a selection text
    that is also the text a verdict is read on."""
    sweep = results.get("sweep") or {}
    if not sweep:
        return []
    out = [f"{variant}'s best {sweep['key']} is the grid's {where} value ({sweep['best'][variant]}): a better value "
           "may lie beyond the grid, so its verdicts are for this grid" for variant, where in sweep.get("edges", {}).items()]
    if "on" in sweep and len(results["evals"]) == 1:
        out.append(f"the sweep picked each variant's best {sweep['key']} on {sweep['on']}, the only eval text, which its "
                   "verdicts are read on too: the choice and the verdict share that text's noise")
    return out


def first_batch(checkpoint: Path, text: str, recipe: Recipe, cache_dir: Path) -> dict:
    """The first evaluation batch of `text` for `checkpoint`: the tokens every score starts with, with the
    doc_ids / position_ids of the layout it trained with (a document-masked checkpoint)."""
    from ..checkpoints.record import CheckpointRecord
    from ..evaluation.evaluate import eval_batches, trained_layout
    from ..tokenization.train import load_tokenizer

    record = CheckpointRecord.read(checkpoint)
    batches, _ = eval_batches(load_tokenizer(checkpoint), text, record.objective or "clm",
                              seq_len=recipe.data.seq_len, batch_size=recipe.eval.batch_size or recipe.train.batch_size,
                              stride=None, seed=0, cache_dir=cache_dir, show_progress=False, **trained_layout(record))
    return next(iter(batches))
