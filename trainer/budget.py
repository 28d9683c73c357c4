"""`train.max_time`: train for the minutes a user gives, not for a step count guessed in advance.

A user with three minutes wants the best model three minutes can make, and a fixed `max_steps` is a guess
about this machine's speed: too many and the run is cut before its learning rate decays, too few and the
time is wasted. So the budget sets the *horizon*: the step the run ends at, re-estimated after every
window of updates from the time the updates so far took (periodic validations and checkpoints included,
at their share), minus what the end of the run needs (the final validation and checkpoint, as long as
the last ones took). The schedule decays over that horizon, so the learning rate reaches its floor when
the time is up and the last checkpoint is written inside the budget. `train.max_steps` stays a cap.

A budget covers training proper: from the untrained baseline validation to the last checkpoint and the
final validation, periodic validations and checkpoints included. Preparing the tokenizer, the token
cache and the model before it, and the end-of-run sample, plot and report after it, come on top (seconds,
or minutes for a large corpus tokenized the first time); the run report shows both.

Time-limited runs are not reproducible step for step (the horizon depends on the machine), which is why
the budget is opt-in; the steps that fit are recorded in the run report and metrics.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Iterator
from typing import NamedTuple

from ..errors import ConfigError

_PART = re.compile(r"(\d+(?:\.\d+)?)\s*(h|m|s)")
MARGIN = 0.02  # of the budget, kept free for what the estimate cannot see (the report, closing files)
FIRST_WINDOW = 3  # updates timed before the first estimate of the pace
WINDOW_SHARE = 0.05  # a window of updates lasts at most about this share of the budget
VALIDATIONS = 8  # validations at evenly spaced points of the steps that fit (besides train.eval_every's)
# What a plan (trainer/plan.py, trainer/finetune_plan.py) predicts a budget holds, from the measured pace:
EVAL_COST = 1 / 3  # a validation batch (forward only) costs about a third of a training micro-batch


class Validation(NamedTuple):
    """What a run's evaluations cost a plan, in training rows: `fixed` per run (the VALIDATIONS + 1 a budget
    always makes), `per_update` for each update the run makes (one validation per train.eval_every updates)."""

    fixed: float
    per_update: float

    @classmethod
    def of(cls, each: float, eval_every: int) -> Validation:
        """The cost of a run whose every validation costs `each` training rows."""
        return cls(fixed=(VALIDATIONS + 1) * each, per_update=each / eval_every)

    def updates(self, budget_updates: float, batch: int) -> int:
        """The updates of `batch` rows that fit when `budget_updates` would fit with no evaluation at all."""
        return int((budget_updates - self.fixed / batch) / (1 + self.per_update / batch))

    def needs(self, updates: int, batch: int) -> float:
        """The budget, in updates, that `updates` and their evaluations take."""
        return updates * (1 + self.per_update / batch) + self.fixed / batch


def planned_budget(recipe, budget: float | None) -> float:
    """The seconds a plan is made for: `budget` if given, else the recipe's train.max_time (one line if neither)."""
    if budget is not None:
        return budget
    if recipe.train.max_time is None:
        raise ConfigError("train.max_time: a plan is made for a time budget: give one (e.g. 10m)")
    return parse_duration(recipe.train.max_time)


def cpu_share(paces: list, device: str) -> float:
    """CPU seconds per wall second over measured updates (trainer.pace.Pace): what a CPU run will get of
    the measured CPU time; 1.0 on a GPU."""
    cpu, wall = sum(p.seconds for p in paces), sum(p.wall for p in paces)
    return cpu / wall if device == "cpu" and cpu > 0 and wall > 0 else 1.0


def update_seconds(pace, share: float) -> float:
    """Wall seconds per update the run will see, from a measured pace and the CPU share: a run's update costs what
    the fixed batch's did (benchmarks/RESULTS.md, "Planning a run"); its validations are counted apart (EVAL_COST)."""
    return pace.seconds / share


def parse_duration(value: str | int | float, key: str = "train.max_time") -> float:
    """Seconds in `90`, `90s`, `3m`, `1h30m` or `1.5h`; a clear error naming `key` otherwise."""
    if isinstance(value, bool):
        raise ConfigError(f"{key}: got {value!r}, expected a duration such as 90s, 3m or 1h30m")
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        text = str(value).strip().lower().replace(" ", "")
        parts = _PART.findall(text)
        if not parts or "".join(n + u for n, u in parts) != text:
            raise ConfigError(f"{key}: got {value!r}, expected a duration such as 90s, 3m or 1h30m")
        seconds = sum(float(n) * {"h": 3600, "m": 60, "s": 1}[u] for n, u in parts)
    if not 0 < seconds < 1e8:
        raise ConfigError(f"{key}: got {value!r}, expected a positive duration such as 90s, 3m or 1h30m")
    return seconds


class TimeBudget:
    """The horizon of a time-limited run, from the pace of its updates (see the module docstring)."""

    def __init__(self, seconds: float, spent_before: float = 0.0, clock=time.perf_counter):
        self.seconds = seconds
        self.spent_before = spent_before  # seconds a resumed run had already spent
        self.clock = clock
        self.started = clock()
        self.first_step: int | None = None  # the step the pace is measured from
        self.paced_from = self.started
        self.ending: dict[str, float] = {}  # "validation" / "checkpoint" -> seconds the last one took
        self.validated = 0  # the last of the VALIDATIONS points validated at (0: none yet)

    def spent(self) -> float:
        return self.spent_before + self.clock() - self.started

    def start(self, step: int) -> None:
        """The loop begins at `step`: the pace is measured from here (not from the data preparation)."""
        self.first_step, self.paced_from = step, self.clock()

    def next_validation(self, horizon: int) -> int:
        """The step of the next evenly spaced validation point, at the horizon known now."""
        return -(-(self.validated + 1) * horizon // VALIDATIONS)  # ceil: the first step at or past the point

    def validation_due(self, step: int, horizon: int) -> bool:
        """Whether `step` has reached the next of VALIDATIONS evenly spaced points of the steps that fit (the
        horizon's final validation is the run's own). A fixed `train.eval_every` tuned for one machine
        validates a 90 s run never or constantly; these points scale with the budget, so `keep_best` has
        something to choose from. The points move with the horizon as the pace is learnt."""
        point = VALIDATIONS * step // max(horizon, 1)
        due = self.validated < point < VALIDATIONS
        self.validated = max(self.validated, point)
        return due

    def took(self, what: str, seconds: float) -> None:
        """A validation or checkpoint took `seconds`: the end of the run will need about as long."""
        self.ending[what] = seconds

    @contextlib.contextmanager
    def timing(self, what: str) -> Iterator[None]:
        """`took` for the validation or checkpoint inside, timed on the budget's own clock: every time the
        budget counts comes from one clock, the one a test replaces with a fake."""
        started = self.clock()
        yield
        self.took(what, self.clock() - started)

    def window_cap(self, step: int) -> int:
        """The most updates the loop may run before it next asks for the horizon: a few until the pace is
        known (on a slow machine one default window of 50 updates could outlast the whole budget), then
        about WINDOW_SHARE of the budget's worth."""
        done = step - (self.first_step if self.first_step is not None else step)
        if done <= 0:
            return FIRST_WINDOW
        pace = (self.clock() - self.paced_from) / done
        return max(1, int(WINDOW_SHARE * self.seconds / max(pace, 1e-9)))

    def horizon(self, step: int, cap: int) -> int:
        """The step to end at: the updates that still fit at the pace so far, after the end's needs; `cap`
        (train.max_steps) until a first update has been timed."""
        done = step - (self.first_step if self.first_step is not None else step)
        if done <= 0:
            return cap
        pace = (self.clock() - self.paced_from) / done  # seconds per update, pauses included
        left = self.seconds * (1 - MARGIN) - self.spent() - sum(self.ending.values())
        return max(step, min(cap, step + int(left / pace)))


def fmt_seconds(seconds: float) -> str:
    return f"{seconds / 3600:.3g} h" if seconds >= 7200 else f"{seconds / 60:.3g} min" if seconds >= 120 \
        else f"{seconds:.3g} s"
