"""Learning-rate schedules as pure functions of the optimizer step.

`step` counts optimizer updates from 0: `lr_at(0, ...)` is the rate of the first update. Warmup rises
linearly and reaches the peak at step `warmup - 1`, so no update is wasted at lr = 0. Pure functions make
the schedule testable to exact values and make resume trivially exact: the rate depends on nothing but
the step.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .recipe import ScheduleSection


def warmup_factor(step: int, warmup: int) -> float:
    """Linear warmup: (step + 1) / warmup during the first `warmup` steps, then 1."""
    return min(1.0, (step + 1) / warmup) if warmup > 0 else 1.0


def constant(step: int, *, peak: float, warmup: int) -> float:
    return peak * warmup_factor(step, warmup)


def linear(step: int, *, peak: float, warmup: int, max_steps: int, min_lr: float) -> float:
    """BERT: warmup, then straight down to `min_lr` at `max_steps`."""
    if step < warmup:
        return peak * warmup_factor(step, warmup)
    progress = min(1.0, (step - warmup) / max(1, max_steps - warmup))
    return peak - (peak - min_lr) * progress


def cosine(step: int, *, peak: float, warmup: int, max_steps: int, min_lr: float) -> float:
    """GPT-2/3: warmup, then half a cosine from `peak` to `min_lr` at `max_steps`."""
    if step < warmup:
        return peak * warmup_factor(step, warmup)
    progress = min(1.0, (step - warmup) / max(1, max_steps - warmup))
    return min_lr + 0.5 * (peak - min_lr) * (1.0 + math.cos(math.pi * progress))


def noam(step: int, *, scale: float, warmup: int, d_model: int) -> float:
    """The original Transformer: scale * d_model^-0.5 * min(n^-0.5, n * warmup^-1.5), n = step + 1.

    `scale` is `optim.lr` used as a multiplier (1.0 reproduces the paper)."""
    n = step + 1
    return scale * d_model**-0.5 * min(n**-0.5, n * warmup**-1.5)


def wsd(step: int, *, peak: float, warmup: int, max_steps: int, min_lr: float, decay_fraction: float) -> float:
    """Warmup-stable-decay: warmup, hold the peak, then decay linearly over the last `decay_fraction`."""
    decay_start = max_steps - round(decay_fraction * max_steps)
    if step < warmup:
        return peak * warmup_factor(step, warmup)
    if step < decay_start:
        return peak
    progress = min(1.0, (step - decay_start) / max(1, max_steps - decay_start))
    return peak - (peak - min_lr) * progress


def lr_at(step: int, schedule: "ScheduleSection", peak: float, max_steps: int, d_model: int) -> float:
    """The learning rate of update `step` under a recipe's `schedule` section."""
    name, warmup, min_lr = schedule.name, schedule.warmup_steps, schedule.min_lr
    if name == "constant":
        return constant(step, peak=peak, warmup=warmup)
    if name == "linear":
        return linear(step, peak=peak, warmup=warmup, max_steps=max_steps, min_lr=min_lr)
    if name == "cosine":
        return cosine(step, peak=peak, warmup=warmup, max_steps=max_steps, min_lr=min_lr)
    if name == "noam":
        return noam(step, scale=peak, warmup=warmup, d_model=d_model)
    if name == "wsd":
        return wsd(step, peak=peak, warmup=warmup, max_steps=max_steps, min_lr=min_lr,
                   decay_fraction=schedule.decay_fraction)
    raise ValueError(f"unknown schedule {name!r}")  # recipe validation rejects this first
