"""What MLM does with the tokens it selects: the `objective.mask_replace` split, checked without torch.

BERT (Devlin et al., 2019) replaces 80% of the selected tokens by [MASK], 10% by a random token and leaves
10% unchanged, so the model cannot learn that only [MASK] positions matter. The split is a recipe key so
that a lab can compare it ([1, 0, 0]: always [MASK]; [0, 0, 1]: inputs untouched, labels still set). It
lives apart from `masking.py` because recipes are validated by commands that must not import torch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

MASK_REPLACE = (0.8, 0.1, 0.1)  # BERT's split of the selected tokens: [MASK], a random token, unchanged


def mask_replace_problem(replace: Sequence[float], key: str = "objective.mask_replace") -> str | None:
    """None when `replace` is three finite non-negative numbers summing to 1 (within 1e-6), else one line
    naming the key, the value and what was expected."""
    values = list(replace) if isinstance(replace, (list, tuple)) else [replace]
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
    if len(values) == 3 and numbers and all(math.isfinite(v) and v >= 0 for v in values) \
            and abs(sum(values) - 1.0) <= 1e-6:
        return None
    return (f"{key}: got {values}, expected three non-negative numbers summing to 1: the shares of the selected "
            "tokens that become [MASK], a random token and stay unchanged (BERT: [0.8, 0.1, 0.1])")
