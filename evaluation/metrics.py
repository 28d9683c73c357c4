"""Downstream scores of a fine-tuned model: accuracy, macro-F1, Matthews correlation, Pearson, Spearman.

Small pure functions of our own (numpy), so a score means what it means in scikit-learn and SciPy
(tests/test_metrics.py checks them against both as oracles) without either being a dependency:

- `accuracy`: the share of predictions equal to the label.
- `macro_f1`: F1 = 2TP / (2TP + FP + FN) of each class, averaged with equal weight over the classes that
  occur in the labels or the predictions (scikit-learn's `average="macro"`); a class never predicted and
  never true is not a class of this evaluation, one only predicted or only true scores 0.
- `matthews_corrcoef`: CoLA's metric, the multiclass form (Gorodkin 2004) scikit-learn computes from the
  confusion matrix; 0 when it is undefined (every label or every prediction one class), as scikit-learn.
- `pearson`, `spearman`: STS-B's metrics; Spearman is Pearson on average ranks, so ties share a rank.
  Both are NaN when undefined (constant predictions or targets), as SciPy: a model that predicts one value
  for everything has no correlation to report, and 0 would pass for a real score.

Inputs are sequences, numpy arrays or torch tensors of the same length (class ids for classification,
floats for regression); a length mismatch or nothing to score is a ValueError (a caller's bug).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def _arrays(predictions: Any, labels: Any) -> tuple[np.ndarray, np.ndarray]:
    """Both inputs as 1-D numpy arrays of one length (torch tensors are brought to the host first)."""
    out = []
    for values in (predictions, labels):
        if hasattr(values, "detach"):  # a torch tensor
            values = values.detach().cpu().numpy()
        out.append(np.asarray(values).reshape(-1))
    if len(out[0]) != len(out[1]):
        raise ValueError(f"{len(out[0])} predictions but {len(out[1])} labels")
    if not len(out[0]):
        raise ValueError("no examples to score")
    return out[0], out[1]


def accuracy(predictions: Any, labels: Any) -> float:
    pred, true = _arrays(predictions, labels)
    return float(np.mean(pred == true))


def _confusion(pred: np.ndarray, true: np.ndarray) -> np.ndarray:
    """(C, C) counts, rows the true class, columns the predicted one, over the classes that occur."""
    classes, codes = np.unique(np.concatenate([true, pred]), return_inverse=True)
    true_code, pred_code = codes[: len(true)], codes[len(true):]
    matrix = np.zeros((len(classes), len(classes)), dtype=np.int64)
    np.add.at(matrix, (true_code, pred_code), 1)
    return matrix


def macro_f1(predictions: Any, labels: Any) -> float:
    matrix = _confusion(*_arrays(predictions, labels)).astype(np.float64)
    tp = np.diag(matrix)
    fp, fn = matrix.sum(axis=0) - tp, matrix.sum(axis=1) - tp
    denominator = 2 * tp + fp + fn  # > 0: every class here is predicted or true at least once
    return float(np.mean(2 * tp / denominator))


def matthews_corrcoef(predictions: Any, labels: Any) -> float:
    matrix = _confusion(*_arrays(predictions, labels)).astype(np.float64)
    true_counts, pred_counts = matrix.sum(axis=1), matrix.sum(axis=0)  # (C,) each
    total, correct = matrix.sum(), np.trace(matrix)
    covariance = correct * total - pred_counts @ true_counts
    spread = (total**2 - pred_counts @ pred_counts) * (total**2 - true_counts @ true_counts)
    return float(covariance / math.sqrt(spread)) if spread > 0 else 0.0


def pearson(predictions: Any, targets: Any) -> float:
    pred, true = (a.astype(np.float64) for a in _arrays(predictions, targets))
    pred, true = pred - pred.mean(), true - true.mean()
    spread = math.sqrt(float(pred @ pred) * float(true @ true))
    if spread == 0.0:
        return float("nan")
    return float(np.clip(pred @ true / spread, -1.0, 1.0))  # rounding can step just past 1


def average_ranks(values: np.ndarray) -> np.ndarray:
    """Ranks 1..n of `values`, tied values sharing the mean of the ranks they span (SciPy's `rankdata`)."""
    order = np.argsort(values, kind="stable")
    sorted_values = values[order]
    starts = np.flatnonzero(np.r_[True, sorted_values[1:] != sorted_values[:-1]])  # first index of each run
    ends = np.r_[starts[1:], len(values)]
    run_rank = (starts + ends + 1) / 2.0  # mean of ranks starts+1 .. ends
    ranks = np.empty(len(values), dtype=np.float64)
    ranks[order] = np.repeat(run_rank, ends - starts)
    return ranks


def spearman(predictions: Any, targets: Any) -> float:
    pred, true = _arrays(predictions, targets)
    return pearson(average_ranks(pred), average_ranks(true))


def classification_scores(predictions: Any, labels: Any) -> dict[str, float]:
    """What `tfkit eval --data` reports for a classifier: accuracy, macro-F1, Matthews correlation."""
    return {"accuracy": accuracy(predictions, labels), "macro_f1": macro_f1(predictions, labels),
            "matthews": matthews_corrcoef(predictions, labels)}


def regression_scores(predictions: Any, targets: Any) -> dict[str, float]:
    """What `tfkit eval --data` reports for a regressor: Pearson and Spearman correlation."""
    return {"pearson": pearson(predictions, targets), "spearman": spearman(predictions, targets)}


def task_scores(task: str, predictions: Any, targets: Any) -> dict[str, float]:
    """The scores of a `classification` or `regression` head (a fine-tuning run's validation)."""
    return (regression_scores if task == "regression" else classification_scores)(predictions, targets)
