"""Downstream scores in the training loop (`eval.tasks`, `eval.probe`): the trainer's half.

A falling loss does not say that a model gets better at anything a user wants: tfkit's lab saw a BERT whose
MLM loss fell while it learnt to copy the visible tokens, and a short pretraining that hurt the fine-tuned
score. So a run can score tasks at its validations, on the live weights, and log them beside the loss.

Why the trainer takes the scorer as an argument instead of importing it: the task files, the log-likelihood
scorer, the lm-evaluation-harness bridge and the probe's labelled data belong to `evaluation/`, which sits
above `trainer/` (tests/test_layering.py). Moving them down would put task formats and an optional
third-party harness under the training loop; instead the command (`tfkit pretrain`, the lab) builds a
`Downstream` from the recipe with `evaluation.inloop.build_downstream` and hands it in, as `tfkit finetune`
hands in its `scorer`. The trainer owns only what it must decide itself: when the scores are due, the
names of their metrics.jsonl keys, and which one `train.keep_best` keeps (`eval.best_by`). A recipe with
`eval.tasks` run without one is refused in one line (`check_downstream`).

Row keys are `task/NAME/METRIC` (`task/docs-cloze/acc`, `task/probe-topics/acc`): TensorBoard and W&B
group them by the slash, and `eval.best_by: task:NAME` reads `task/NAME/acc`.
"""

from __future__ import annotations

import copy
import math
from typing import TYPE_CHECKING, Protocol

import torch
import torch.distributed as dist

from torch import nn

from ..errors import ConfigError
from .task_names import best_key

if TYPE_CHECKING:
    from ..models.config import ModelConfig
    from ..progress import Transcript
    from ..tokenization.train import TfkitTokenizer
    from .distributed import DistInfo
    from .recipe import Recipe


class Downstream(Protocol):
    """What the command hands the trainer (evaluation/inloop.py): tasks read and checked before the run."""

    names: tuple[str, ...]  # the tasks' names, in row order

    def prepare(self, cfg: ModelConfig, tokenizer: TfkitTokenizer, out: Transcript | None) -> None:
        """Encode every item with the run's tokenizer; refuse what this model cannot score, before training."""

    def score(self, model: nn.Module, info: DistInfo, precision: str) -> dict[str, float]:
        """`task/NAME/METRIC` -> value on `model`'s live weights; a collective: every rank calls it."""


def criterion(row: dict, best_by: str, loss_criterion: float) -> float:
    """What keep_best minimises: the run's own criterion, or minus the task score (nan when the row has none:
    a validation at which eval.task_every scored no task)."""
    key = best_key(best_by)
    if key is None:
        return loss_criterion
    value = row.get(key)
    return -value if isinstance(value, (int, float)) and math.isfinite(value) else math.nan


def due(step: int, task_every: int | None, last: bool) -> bool:
    """Whether this validation scores the tasks: every one (task_every null), or those at multiples of
    eval.task_every, the untrained baseline (step 0) and the run's last validation."""
    return task_every is None or step == 0 or last or step % task_every == 0


def check_downstream(recipe: Recipe, downstream: Downstream | None) -> None:
    """A recipe with eval.tasks / eval.probe runs only with the Downstream its command builds."""
    if (recipe.eval.tasks or recipe.eval.probe) and downstream is None:
        raise ConfigError("eval.tasks: downstream scores need the scorer `tfkit pretrain` builds "
                          "(evaluation.inloop.build_downstream(recipe), passed as pretrain(..., downstream=...))")


@torch.no_grad()
def rank0_weights(model: nn.Module, info: DistInfo, replica: nn.Module | None = None) -> nn.Module:
    """A copy of `model` holding rank 0's weights on every rank (`replica`, made on the first call, refilled on
    the next). DDP's replicas can part in the last bits over a run (each rank applies the all-reduced gradient
    itself), and the checkpoint is rank 0's: scoring each rank's share of the items on its own replica would
    give a score that is no one checkpoint's. The training weights are never touched."""
    if replica is None:
        replica = copy.deepcopy(model).eval().requires_grad_(False)
    for mine, source in zip(replica.state_dict().values(), model.state_dict().values()):
        mine.copy_(source)
        dist.broadcast(mine, src=0)  # rank 0's values everywhere (tied tensors twice: harmless)
    return replica
