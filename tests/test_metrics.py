"""evaluation/metrics.py against scikit-learn and SciPy as oracles (test extra only; tfkit never imports them)."""

import math

import numpy as np
import pytest
import torch

from tfkit.evaluation.metrics import (accuracy, average_ranks, classification_scores, macro_f1, matthews_corrcoef,
                                      pearson, regression_scores, spearman)

sklearn_metrics = pytest.importorskip("sklearn.metrics")
stats = pytest.importorskip("scipy.stats")  # installed with scikit-learn


def class_cases():
    """(predictions, labels): random sets of 2-6 classes, some classes only predicted or only true."""
    rng = np.random.default_rng(0)
    for case in range(40):
        n, k = int(rng.integers(1, 60)), int(rng.integers(2, 7))
        labels = rng.integers(0, k, n)
        predictions = np.where(rng.random(n) < 0.6, labels, rng.integers(0, k + 1, n))  # k: never a label
        yield predictions, labels
    yield np.array([1, 1, 1]), np.array([0, 1, 2])  # one prediction for everything
    yield np.array([0, 1, 2]), np.array([2, 2, 2])  # one label
    yield np.array([3, 3]), np.array([3, 3])  # one class, all right
    yield np.array(["pos", "neg", "neg"]), np.array(["pos", "pos", "neg"])  # string labels


@pytest.mark.filterwarnings("ignore:A single label was found")  # scikit-learn's note on the one-class case
@pytest.mark.parametrize("predictions, labels", list(class_cases()))
def test_classification_metrics_equal_scikit_learn(predictions, labels):
    assert accuracy(predictions, labels) == pytest.approx(sklearn_metrics.accuracy_score(labels, predictions))
    expected_f1 = sklearn_metrics.f1_score(labels, predictions, average="macro", zero_division=0)
    assert macro_f1(predictions, labels) == pytest.approx(expected_f1, abs=1e-12)
    expected_mcc = sklearn_metrics.matthews_corrcoef(labels, predictions)
    assert matthews_corrcoef(predictions, labels) == pytest.approx(expected_mcc, abs=1e-12)


def regression_cases():
    rng = np.random.default_rng(1)
    for case in range(30):
        n = int(rng.integers(2, 50))
        targets = rng.normal(size=n)
        if case % 3 == 0:  # STS-B targets come in steps of 0.2: many ties
            targets = np.round(rng.uniform(0, 5, n) * 5) / 5
        predictions = targets + rng.normal(scale=float(rng.uniform(0.1, 3)), size=n)
        if case % 4 == 0:
            predictions = np.round(predictions)  # ties in the predictions too
        yield predictions, targets
    yield np.array([1.0, 2.0, 3.0]), np.array([3.0, 2.0, 1.0])  # exactly -1
    yield np.array([1.0, 2.0, 2.0, 5.0]), np.array([0.5, 0.5, 0.5, 1.0])


@pytest.mark.parametrize("predictions, targets", list(regression_cases()))
def test_correlations_equal_scipy(predictions, targets):
    assert pearson(predictions, targets) == pytest.approx(stats.pearsonr(predictions, targets)[0], abs=1e-12)
    assert spearman(predictions, targets) == pytest.approx(stats.spearmanr(predictions, targets)[0], abs=1e-12)


def test_average_ranks_share_ties_as_scipy_rankdata():
    values = np.array([3.0, 1.0, 3.0, 2.0, 3.0, 1.0])
    np.testing.assert_array_equal(average_ranks(values), stats.rankdata(values))


def test_undefined_correlation_is_nan_not_a_score():
    constant = np.ones(5)
    assert math.isnan(pearson(constant, np.arange(5.0)))
    assert math.isnan(spearman(np.arange(5.0), constant))


def test_tensors_and_lists_score_like_arrays():
    labels, predictions = [0, 1, 1, 0, 2], torch.tensor([0, 1, 0, 0, 2])
    assert classification_scores(predictions, labels) == classification_scores(predictions.numpy(), np.array(labels))
    scores = regression_scores(torch.tensor([0.1, 0.4, 0.35, 0.8]), [0.0, 0.5, 0.3, 0.9])
    assert set(scores) == {"pearson", "spearman"} and scores["spearman"] == pytest.approx(1.0)


def test_mismatched_or_empty_inputs_are_refused():
    with pytest.raises(ValueError, match="3 predictions but 2 labels"):
        accuracy([1, 2, 3], [1, 2])
    with pytest.raises(ValueError, match="no examples"):
        macro_f1([], [])
