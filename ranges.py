"""The meaningful values of float keys (recipes, model configs), checked one way everywhere.

`if lr <= 0` lets NaN through (every comparison with NaN is False) and an infinite lr passes any lower
bound; both then show up only later, as a crash in the optimizer or a diverged run. Every float check of
a recipe therefore goes through an `Interval`, whose `contains` rejects NaN and +-inf outright.
"""

from __future__ import annotations

import functools
import math
import typing
from dataclasses import dataclass
from typing import Any

# A dataclass's field types, evaluated once per class: with postponed annotations every call of
# typing.get_type_hints compiles and evaluates each annotation string again (about 1 ms a class).
hints = functools.cache(typing.get_type_hints)


@dataclass(frozen=True)
class Interval:
    """The meaningful values of a float key: from `low` to `high`, each end included or not; never NaN or
    +-inf (module doc)."""

    low: float
    high: float = math.inf
    low_inclusive: bool = True
    high_inclusive: bool = False

    def contains(self, value: float) -> bool:
        above = self.low <= value if self.low_inclusive else self.low < value
        below = value <= self.high if self.high_inclusive else value < self.high
        return math.isfinite(value) and above and below

    def __str__(self) -> str:
        """What the error message says was expected, e.g. "a positive finite number", "0 <= value < 1"."""
        if self.high == math.inf:
            if self.low == 0 and not self.low_inclusive:
                return "a positive finite number"
            return f"a finite number {'>=' if self.low_inclusive else '>'} {self.low:g}"
        low, high = ("<=" if self.low_inclusive else "<"), ("<=" if self.high_inclusive else "<")
        return f"{self.low:g} {low} value {high} {self.high:g}"


POSITIVE = Interval(0.0, low_inclusive=False)  # learning rates, epsilons, scales
NON_NEGATIVE = Interval(0.0)  # weight decay, the lr floor
FRACTION = Interval(0.0, 1.0)  # [0, 1): dropouts, betas, label smoothing
OPEN_FRACTION = Interval(0.0, 1.0, low_inclusive=False)  # (0, 1): a share that must leave something either side
UP_TO_ONE = Interval(0.0, 1.0, low_inclusive=False, high_inclusive=True)  # (0, 1]

# A peak learning rate that trains (a warning outside it, not an error: a lab may probe divergence on purpose).
# AdamW peaks run from 1e-4 (BERT-base) to 3e-3 (the tiny recipes), Muon's about 0.02; above 0.1 both diverge,
# and `optim.lr=30` (3e-3 mistyped, or a percentage) trains to NaN with nothing said.
USUAL_PEAK_LR = Interval(0.0, 0.1, low_inclusive=False, high_inclusive=True)


def float_problems(section: Any, prefix: str, **intervals: Interval) -> list[str]:
    """One line per named key of `section` outside its interval. None is skipped: the type check lets it
    through only for `float | None` keys, whose message then says "or null"."""
    types = hints(type(section))
    out = []
    for name, interval in intervals.items():
        value = getattr(section, name)
        if value is not None and not interval.contains(value):
            null = " or null" if type(None) in typing.get_args(types[name]) else ""
            out.append(f"{prefix}.{name}: got {value}, expected {interval}{null}")
    return out
