"""The paired t interval the lab's verdicts are read from, without scipy.

A lab compares variants on per-seed differences d_i (seed i of every variant saw the same batches). The
95% interval of their mean is mean ± t(0.975, n-1) · sd / √n, with Student's t quantile for n-1 degrees
of freedom: at 2 seeds that quantile is 12.71, not 2, which is why two seeds cannot support a verdict.
The quantile is computed here from the regularized incomplete beta function (the t distribution's CDF),
to double precision; the tests check it against scipy.stats, which tfkit does not depend on at runtime.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

LEVEL = 0.95  # the interval printed on every verdict line, and the one every verdict is read from


def _beta_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (modified Lentz), converging for
    x < (a + 1) / (a + b + 2)."""
    tiny, c, d = 1e-300, 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    result = d
    for m in range(1, 500):
        for numerator in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                          -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            result *= c * d
        if abs(c * d - 1.0) < 1e-15:
            break
    return result


def incomplete_beta(a: float, b: float, x: float) -> float:
    """I_x(a, b), the regularized incomplete beta function, for a, b > 0 and 0 <= x <= 1."""
    if x <= 0.0 or x >= 1.0:
        return 0.0 if x <= 0.0 else 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _beta_fraction(a, b, x) / a
    return 1.0 - math.exp(log_front) * _beta_fraction(b, a, 1.0 - x) / b


def t_cdf(t: float, df: int) -> float:
    """P(T <= t) for Student's t with `df` degrees of freedom."""
    tail = 0.5 * incomplete_beta(df / 2.0, 0.5, df / (df + t * t))  # P(T > |t|)
    return 1.0 - tail if t > 0 else tail


@functools.cache  # a pure function of (p, df), asked again for every line of every verdict table
def t_quantile(p: float, df: int) -> float:
    """The t with P(T <= t) = p, for 0 < p < 1 and df >= 1: bisection on the CDF to machine precision."""
    if not 0.0 < p < 1.0 or df < 1:
        raise ValueError(f"t_quantile: needs 0 < p < 1 and df >= 1, got p={p}, df={df}")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if mid in (lo, hi):
            break
        lo, hi = (mid, hi) if t_cdf(mid, df) < p else (lo, mid)
    return 0.5 * (lo + hi)


@dataclass(frozen=True)
class Interval:
    """The mean of paired differences and its two-sided `LEVEL` t interval (None below 2 values)."""
    mean: float
    sd: float
    n: int
    lo: float | None
    hi: float | None


def mean_sd(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (n - 1 in the denominator; 0.0 for one value)."""
    n = len(values)
    mean = sum(values) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else 0.0
    return mean, sd


def paired_interval(deltas: list[float], level: float = LEVEL) -> Interval:
    """mean ± t((1 + level) / 2, n - 1) · sd / √n over the per-seed differences."""
    mean, sd = mean_sd(deltas)
    n = len(deltas)
    if n < 2:
        return Interval(mean, sd, n, None, None)
    half = t_quantile((1.0 + level) / 2.0, n - 1) * sd / math.sqrt(n)
    return Interval(mean, sd, n, mean - half, mean + half)


def standard_error(iv: Interval) -> float:
    return iv.sd / math.sqrt(iv.n)


def below_p(iv: Interval, bound: float) -> float:
    """The one-sided p-value of "the mean lies below `bound`" (H0: mean >= bound), from the paired t statistic:
    p < (1 - LEVEL) / 2 exactly when the interval's upper end lies below `bound`. Zero spread: 0 or 1."""
    se = standard_error(iv)
    if se == 0.0:
        return 0.0 if iv.mean < bound else 1.0
    return t_cdf((iv.mean - bound) / se, iv.n - 1)


def above_p(iv: Interval, bound: float) -> float:
    """The one-sided p-value of "the mean lies above `bound`" (H0: mean <= bound); `below_p` mirrored."""
    se = standard_error(iv)
    if se == 0.0:
        return 0.0 if iv.mean > bound else 1.0
    return 1.0 - t_cdf((iv.mean - bound) / se, iv.n - 1)


def half_width(sd: float, n: int, level: float = LEVEL) -> float:
    """t((1 + level) / 2, n - 1) · sd / √n: how far the interval of n paired differences of spread `sd`
    reaches either side of their mean."""
    return t_quantile((1.0 + level) / 2.0, n - 1) * sd / math.sqrt(n)


MAX_SEEDS = 1000  # past this "seeds needed" is said as "more than 1000"


def seeds_needed(sd: float, gap: float) -> int | None:
    """The fewest seeds (n >= 2) whose interval half-width at spread `sd` is below `gap` (the distance from the
    observed mean to the bound a verdict needs); None when no number of seeds gets there (gap <= 0) or it
    takes more than MAX_SEEDS."""
    if gap <= 0.0:
        return None
    if sd == 0.0:
        return 2
    if half_width(sd, MAX_SEEDS) >= gap:
        return None
    lo, hi = 1, MAX_SEEDS  # half_width falls as n grows: the first n in (lo, hi] below the gap
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if half_width(sd, mid) >= gap else (lo, mid)
    return max(hi, 2)


@dataclass(frozen=True)
class Slope:
    """An ordinary least-squares line y = a + slope · x and the `LEVEL` t interval of its slope (n - 2
    degrees of freedom; None below 3 points)."""
    slope: float
    intercept: float
    n: int
    lo: float | None
    hi: float | None


def slope_interval(xs: list[float], ys: list[float], level: float = LEVEL) -> Slope:
    """The least-squares slope of ys on xs with its t interval: the trend of a paired difference along a
    ladder (x = log2 of the parameters or steps of each rung, one point per rung and seed)."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0.0:
        return Slope(0.0, my, n, None, None)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    intercept = my - slope * mx
    if n < 3:
        return Slope(slope, intercept, n, None, None)
    residual = sum((y - intercept - slope * x) ** 2 for x, y in zip(xs, ys))
    half = t_quantile((1.0 + level) / 2.0, n - 2) * math.sqrt(residual / (n - 2) / sxx)
    return Slope(slope, intercept, n, slope - half, slope + half)


def holm(ps: list[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the order given: the i-th smallest p times (m - i + 1), made
    non-decreasing, capped at 1. A claim keeps its word family-wise where its adjusted p stays below the level
    its own test used (Holm, 1979: the family-wise error rate is then at most that level, whatever the tests'
    dependence)."""
    m = len(ps)
    order = sorted(range(m), key=lambda i: ps[i])
    adjusted, running = [0.0] * m, 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * ps[i]))
        adjusted[i] = running
    return adjusted
