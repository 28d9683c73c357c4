"""Fine-tuned checkpoints on labelled data: `score_classifier` (`tfkit eval CKPT --data labelled.csv`) and
`predict` (`tfkit predict`).

A classifier reads text as its fine-tuning run did: the columns, truncation and windows its config.json
records (`task`), at the length it trained at (`train_seq_len`), laid out for its family
(tokenization/task_batches.py), a long text's window logits averaged. Labels are the checkpoint's
(`head.id2label`): a label in the data that the checkpoint has no class for is one line naming the row.
Predictions stream: the texts are read, scored and written `CHUNK` at a time, so a file larger than memory
is labelled, and the output is published whole at the end (files.atomic_file): an interrupted run leaves
no half file, and an existing file is replaced only with `--force`.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

import torch
from torch import Tensor

from ..checkpoints.folders import read_checkpoint
from ..checkpoints.record import CheckpointRecord, TaskRecord
from ..checkpoints.weights import load_classifier as load_classifier_model
from ..errors import ConfigError, DataError
from ..files import atomic_file, write_problem
from ..models.heads import HeadConfig, SequenceClassifier, classifier_inputs, head_loss, pool_windows, predictions
from ..progress import progress_bar
from ..tokenization.labelled import Columns, Examples, read_examples, read_texts
from ..tokenization.task_batches import task_dataset
from ..tokenization.train import TfkitTokenizer, load_tokenizer
from .evaluate import check_batch_size
from .metrics import task_scores

CHUNK = 256  # texts read, scored and written at a time
OUT_KINDS = (".jsonl", ".csv")


@dataclass
class Classifier:
    folder: Path
    model: SequenceClassifier
    tokenizer: TfkitTokenizer
    record: CheckpointRecord  # config.json

    @property
    def head(self) -> HeadConfig:
        return self.model.head_config

    @property
    def task(self) -> TaskRecord:
        """How the fine-tuning run read its rows (the defaults for a classifier that recorded none: an import)."""
        return self.record.task or TaskRecord()

    @property
    def columns(self) -> Columns:
        return Columns(self.task.text, self.task.text_pair, self.task.label)


def load_classifier(path: str | Path, device: torch.device) -> Classifier:
    def read(folder: Path) -> Classifier:
        model, _ = load_classifier_model(folder, device)
        return Classifier(folder, model, load_tokenizer(folder), CheckpointRecord.read(folder))

    return read_checkpoint(path, read, best=True)[1]


@torch.no_grad()
def logits(clf: Classifier, texts: list[str], pairs: list[str] | None, batch_size: int) -> Tensor:
    """(E, N) logits of `texts` (and their second texts), windows pooled, in fp32 on the host."""
    cfg = clf.model.config
    examples = Examples("", texts, pairs, [0] * len(texts))
    dataset = task_dataset(examples, clf.tokenizer, cfg.arch, max_len=clf.record.train_seq_len or cfg.max_seq_len,
                           seed=0, regression=False, truncation=clf.task.truncation, stride=clf.task.stride,
                           type_vocab_size=cfg.type_vocab_size, packed=True)
    device, rows = next(clf.model.parameters()).device, []
    for batch in dataset.every_example(batch_size):
        batch = {k: v.to(device) for k, v in batch.items()}
        rows.append(clf.model(**classifier_inputs(batch)).float().cpu())  # (B, N), packed rows' logits per example
    return pool_windows(torch.cat(rows), dataset.owners, len(texts))  # (E, N)


def _targets(clf: Classifier, data: str) -> tuple[Examples, Tensor]:
    """The labelled examples of `data` and their targets as the checkpoint's class ids (or floats)."""
    examples, first_at = read_examples(data, clf.columns, clf.head.task, clf.task.header)
    if clf.head.task == "regression":
        return examples, torch.tensor(examples.targets, dtype=torch.float32)
    label2id = {name: i for i, name in enumerate(clf.head.labels)}
    for name, where in first_at.items():
        if name not in label2id:
            raise DataError(f"{where}: label {name!r} is not a class of {clf.folder} (its classes: "
                            f"{', '.join(clf.head.labels)})")
    return examples, torch.tensor([label2id[name] for name in examples.targets])


def score_classifier(path: str | Path, data: str, *, batch_size: int, device: torch.device) -> dict:
    """One row of `tfkit eval --data`: accuracy, macro-F1 and Matthews correlation (or Pearson and Spearman)
    of the classifier at `path` on every labelled example of `data`."""
    check_batch_size(batch_size)
    clf = load_classifier(path, device)
    examples, targets = _targets(clf, data)
    pooled = logits(clf, examples.texts, examples.pairs, batch_size)  # (E, N)
    scores = task_scores(clf.head.task, predictions(pooled, clf.head.task), targets)
    return {"checkpoint": str(clf.folder), "arch": clf.model.config.arch, "task": clf.head.task,
            "step": clf.record.step, "examples": len(examples), "skipped": examples.skipped,
            "loss": float(head_loss(pooled, targets, clf.head.task)), **scores}


def check_out(out: Path, force: bool) -> None:
    """`out` names a .jsonl or .csv file we may write; an existing one is replaced only with `force`."""
    names = ("out", "force")
    if not out.name.lower().endswith(OUT_KINDS):
        raise ConfigError(f"out {out}: expected a {' or '.join(OUT_KINDS)} file", params=names)
    if out.is_dir():
        raise ConfigError(f"out {out}: is a folder, expected a file such as {out / 'preds.jsonl'}", params=names)
    if out.exists() and not force:
        raise ConfigError(f"out {out}: the file exists; pass force to replace it", params=names)
    problem = write_problem(out)
    if problem:
        raise ConfigError(f"out {out}: {problem}", params=names)


def _chunks(rows: Iterator[tuple[str, str, str | None]]) -> Iterator[list[tuple[str, str, str | None]]]:
    while chunk := list(islice(rows, CHUNK)):
        yield chunk


def _records(clf: Classifier, chunk: list, pooled: Tensor) -> Iterator[dict]:
    """One output record per input row: where it is, the label and each class's probability (or the value)."""
    if clf.head.task == "regression":
        for (where, _, _), value in zip(chunk, pooled.squeeze(-1).tolist()):
            yield {"row": where, "prediction": value}
        return
    probs = pooled.softmax(dim=-1)  # (E, N)
    for (where, _, _), p, k in zip(chunk, probs.tolist(), probs.argmax(dim=-1).tolist()):
        yield {"row": where, "label": clf.head.labels[k], **{f"p_{name}": q for name, q in zip(clf.head.labels, p)}}


def predict(path: str | Path, data: str, out: Path, *, batch_size: int, device: torch.device, force: bool,
            progress: bool) -> int:
    """Write one prediction per row of `data` to `out` (JSON lines, or CSV with a header); the row count."""
    check_out(out, force)
    check_batch_size(batch_size)
    clf = load_classifier(path, device)
    bar = progress_bar(unit="row", desc=f"predict {clf.folder.name}", enabled=progress, leave=False)
    count = 0
    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(out) as tmp, tmp.open("w", encoding="utf-8", newline="") as file:
        writer = None
        for chunk in _chunks(read_texts(data, clf.columns, clf.task.header)):
            pairs = None if clf.columns.text_pair is None else [pair for _, _, pair in chunk]
            for record in _records(clf, chunk, logits(clf, [text for _, text, _ in chunk], pairs, batch_size)):
                if out.name.lower().endswith(".csv"):
                    writer = writer or _csv_writer(file, record)
                    writer.writerow(record)
                else:
                    file.write(json.dumps(record, ensure_ascii=False) + "\n")
            count += len(chunk)
            bar.update(len(chunk))
        bar.close()
        if not count:  # raised before the file is published: an existing one stays as it was
            raise DataError(f"{data}: no rows to label")
    return count


def _csv_writer(file: io.TextIOBase, first: dict) -> csv.DictWriter:
    writer = csv.DictWriter(file, fieldnames=list(first))
    writer.writeheader()
    return writer
