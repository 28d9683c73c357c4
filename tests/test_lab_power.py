"""What an inconclusive line could have shown and what a family of lines shows together, against scipy as the
oracle: one-sided p-values, the seeds that would decide a comparison at its spread, the least-squares slope of a
ladder's trend, and Holm's step-down rule, whose family-wise error a simulation of claims without any effect
checks (each line alone gives a word 5% of the time; Holm keeps one in at most 5% of whole labs)."""

import math

import numpy as np
import pytest
from scipy import stats

from tfkit.lab.expect import Expectation
from tfkit.lab.family import apply_holm
from tfkit.lab.power import family_p, power_note, word_ps
from tfkit.lab.stats import above_p, below_p, half_width, holm, paired_interval, seeds_needed, slope_interval
from tfkit.lab.verdict import decide
from tfkit.lab.verdict_line import Verdict


def test_one_sided_p_values_are_scipys_and_match_the_interval():
    rng = np.random.default_rng(3)
    for _ in range(200):
        deltas = list(rng.normal(rng.normal(0, 0.05), 0.04, int(rng.integers(3, 8))))
        iv = paired_interval(deltas)
        for bound in (-0.02, 0.0, 0.03):
            assert below_p(iv, bound) == pytest.approx(stats.ttest_1samp(deltas, bound, alternative="less").pvalue,
                                                       rel=1e-9, abs=1e-12)
            assert above_p(iv, bound) == pytest.approx(
                stats.ttest_1samp(deltas, bound, alternative="greater").pvalue, rel=1e-9, abs=1e-12)
        exp = Expectation(source="s", better="a", than="b", margin=0.01)
        word = decide(exp, iv)
        ps = word_ps(exp, iv)
        assert (ps["holds"] < 0.025) == (word == "holds") and (ps["reversed"] < 0.025) == (word == "reversed")
        p = family_p(exp, iv, word)
        assert (p < 0.05) == (word != "inconclusive")  # the line's word and its p tell the same story


def test_tost_p_is_the_larger_of_its_two_tests():
    deltas = [0.01, -0.005, 0.012, 0.002]
    iv = paired_interval(deltas)
    exp = Expectation(source="s", same=("a", "b"), tol=0.03)
    lower = stats.ttest_1samp(deltas, -0.03, alternative="greater").pvalue
    upper = stats.ttest_1samp(deltas, 0.03, alternative="less").pvalue
    assert word_ps(exp, iv)["holds"] == pytest.approx(max(lower, upper))
    assert decide(exp, iv) == "holds" and family_p(exp, iv, "holds") == pytest.approx(2 * max(lower, upper))


@pytest.mark.parametrize("sd, gap", [(0.084, 0.038), (0.021, 0.02), (0.5, 0.1), (0.01, 0.3)])
def test_seeds_needed_is_the_fewest_whose_interval_is_narrow_enough(sd, gap):
    n = seeds_needed(sd, gap)
    assert half_width(sd, n) < gap
    assert n == 2 or half_width(sd, n - 1) >= gap
    assert half_width(sd, n) == pytest.approx(stats.t.ppf(0.975, n - 1) * sd / math.sqrt(n))


def test_no_number_of_seeds_decides_a_mean_on_the_bound():
    assert seeds_needed(0.1, 0.0) is None and seeds_needed(0.1, -0.2) is None
    assert seeds_needed(10.0, 1e-4) is None  # past MAX_SEEDS: said as "more than"


def test_an_inconclusive_line_says_how_many_seeds_would_decide_it():
    """The record's RMSNorm = LayerNorm line: Δ +0.012, interval [-0.196, +0.22] at 3 seeds."""
    deltas = [0.012 - 0.0837, 0.012, 0.012 + 0.0837]
    iv = paired_interval(deltas)
    exp = Expectation(source="s", same=("rmsnorm", "layernorm"), tol=0.05)
    assert decide(exp, iv) == "inconclusive"
    note = power_note(exp, iv)
    assert note["word"] == "holds" and note["seeds"] == seeds_needed(iv.sd, 0.05 - 0.012)
    assert 15 < note["seeds"] < 40
    assert note["detectable"] == pytest.approx(0.05 + half_width(iv.sd, 3))
    assert f"about {note['seeds']} seeds would make it holds" in note["text"]
    inside = power_note(Expectation(source="s", better="a", than="b", margin=0.05), paired_interval([0.01, -0.02, 0.0]))
    assert inside["seeds"] is None and "inside ±0.05" in inside["text"]


def test_the_slope_and_its_interval_are_scipys():
    rng = np.random.default_rng(4)
    xs = [float(x) for x in np.repeat([16.0, 17.0, 18.0], 3)]
    ys = [0.3 - 0.1 * (x - 16) + float(rng.normal(0, 0.05)) for x in xs]
    fit, s = stats.linregress(xs, ys), slope_interval(xs, ys)
    half = stats.t.ppf(0.975, len(xs) - 2) * fit.stderr
    assert s.slope == pytest.approx(fit.slope) and s.intercept == pytest.approx(fit.intercept)
    assert (s.lo, s.hi) == (pytest.approx(fit.slope - half), pytest.approx(fit.slope + half))
    assert slope_interval([1.0, 1.0], [0.2, 0.3]).lo is None  # one rung: no slope to speak of


def test_holm_is_the_step_down_rule():
    # Holm (1979): sorted p 0.01, 0.02, 0.03, 0.04 with m = 4 -> 0.04, 0.06, 0.06, 0.06
    assert holm([0.03, 0.01, 0.04, 0.02]) == pytest.approx([0.06, 0.04, 0.06, 0.06])
    assert holm([0.5, 0.001]) == pytest.approx([0.5, 0.002])
    assert holm([]) == []


def test_holm_keeps_a_word_in_at_most_five_percent_of_labs_without_effects():
    """Ten comparisons, no real effect in any: each line alone gives a word 5% of the time, so about 40% of labs
    carry at least one; after Holm at most 5% do. The second figure fails without the adjustment."""
    rng = np.random.default_rng(5)
    exp = Expectation(source="s", better="a", than="b", margin=0.0)
    raw = kept = 0
    trials = 1500
    for _ in range(trials):
        verdicts = []
        for _ in range(10):
            iv = paired_interval(list(rng.normal(0, 0.05, 3)))
            word = decide(exp, iv)
            verdicts.append(Verdict("c", "t", word, 3, iv.mean, iv.lo, iv.hi, "s", p=family_p(exp, iv, word)))
        family = apply_holm(verdicts)
        raw += any(v.status != "inconclusive" for v in verdicts)
        kept += family["kept"] > 0
    assert raw / trials > 0.3
    assert kept / trials < 0.065
