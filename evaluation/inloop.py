"""`eval.tasks` and `eval.probe` scored inside a training run: the `Downstream` the trainer is handed
(trainer/downstream.py says why it is handed one rather than importing this).

Three moments, so that a bad input costs a second and never a training:
- `build_downstream(recipe)`, before the run folder is claimed: every task file read and checked whole
  (file and line), built-in tasks made, lm-evaluation-harness tasks loaded from its cache only, the probe's
  labelled file read with its columns;
- `prepare(cfg, tokenizer, out)`, once the run's tokenizer and model shape are known, before the first
  update: every item encoded once. An item longer than the model's context (max_seq_len) is scored as
  `tfkit eval --task` and lm-evaluation-harness score it, cut from the left, and the start block says how
  many; a choice longer than the whole context cannot be scored and is refused, with the count;
- `score(model, info, precision)` at each validation it is due: the live weights in eval mode under the
  run's autocast, through the same `ContinuationScorer` and `task_metrics` as `tfkit eval --task` (and the
  same `Probe` as `tfkit eval --probe`), so a checkpoint's in-loop row equals the offline score exactly.

Under torchrun the items are split across processes in whole batches (`ContinuationScorer.score`'s
`part`), each score placed in a zero tensor and the tensors summed: every rank then holds every score, each
bit for bit what one process computes, and the metrics equal a one-process run's.
"""

from __future__ import annotations

import torch
from torch import nn

from ..errors import DataError
from ..models.config import ModelConfig
from ..progress import Transcript
from ..tokenization.train import TfkitTokenizer
from ..trainer.distributed import DistInfo, all_reduce_sum
from ..trainer.task_names import LM_EVAL, PREFIX, probe_name, task_name
from ..trainer.optim import autocast_context
from ..trainer.recipe import Recipe
from .builtin_tasks import load_task
from .loglikelihood import ContinuationScorer, Group, fits
from .probe import Probe, ProbeData, ProbeSpec, read_probe
from .task_file import Task
from .task_scores import task_groups, task_metrics

KEPT = ("acc", "acc_norm", "perplexity")  # the metrics a row carries (their standard errors stay offline)


def build_downstream(recipe: Recipe) -> InLoopScores | None:
    """The recipe's tasks and probe, read and checked now; None when it names neither."""
    e = recipe.eval
    if not e.tasks and not e.probe:
        return None
    tasks = []
    for spec in e.tasks:
        if spec.startswith(LM_EVAL):
            from .lm_eval_tasks import lm_eval_task

            task = lm_eval_task(spec.removeprefix(LM_EVAL), e.task_limit)
        else:
            task = load_task(spec, e.task_limit)
        tasks.append((task_name(spec), task))
    probe = read_probe(ProbeSpec.of(e.probe)) if e.probe else None
    return InLoopScores(tasks, probe, e.task_batch_size, probe_name(e.probe) if e.probe else None)


class InLoopScores:
    """Tasks and a probe, scored on a training model's live weights (see the module doc)."""

    def __init__(self, tasks: list[tuple[str, Task]], probe: ProbeData | None, batch_size: int,
                 probe_label: str | None = None) -> None:
        self.tasks, self.probe_data, self.batch_size = tasks, probe, batch_size
        self.probe_label = probe_label or "probe"
        self.names = tuple(name for name, _ in tasks) + ((self.probe_label,) if probe else ())
        self.groups: list[list[Group]] = []
        self.probe: Probe | None = None
        self.tokenizer: TfkitTokenizer | None = None

    def prepare(self, cfg: ModelConfig, tokenizer: TfkitTokenizer, out: Transcript | None) -> None:
        if self.tasks and cfg.arch != "gpt":
            raise DataError(f"eval.tasks: tasks are scored by a causal model's log-likelihoods, and this run trains "
                            f"a {cfg.arch} model (an encoder gets a downstream score from eval.probe)")
        self.tokenizer, self.groups = tokenizer, []
        for name, task in self.tasks:
            groups = task_groups(tokenizer, task)
            longest = [max(len(c) for c in g.continuations) for g in groups]
            unscorable = sum(n > cfg.max_seq_len for n in longest)
            if unscorable:
                raise DataError(f"eval.tasks: {name}: {unscorable:,} of {len(groups):,} items have a choice longer "
                                f"than the model's context (model.max_seq_len={cfg.max_seq_len} tokens), which cannot "
                                "be scored; shorten them or drop those items")
            cut = sum(not fits(g, cfg.max_seq_len) for g in groups)
            self.groups.append(groups)
            if out is not None:
                kind = task.kind.replace("_", " ")
                note = (f"; {cut:,} longer than model.max_seq_len={cfg.max_seq_len} tokens, scored cut from the left "
                        "as lm-evaluation-harness cuts them") if cut else ""
                out.print(f"eval: task {name} ({kind}, {len(groups):,} items){note}", highlight=False, markup=False)
        if self.probe_data is not None:
            self.probe = Probe(self.probe_data, tokenizer, cfg.arch, cfg.max_seq_len, cfg.type_vocab_size)
            if out is not None:
                d = self.probe_data
                out.print(f"eval: probe {self.probe_label}: a linear probe on mean-pooled features of "
                          f"{d.spec.data}, fitted on {len(d.train):,} rows, accuracy on {len(d.valid):,} held-out "
                          f"rows ({len(d.labels)} classes)", highlight=False, markup=False)

    def score(self, model: nn.Module, info: DistInfo, precision: str) -> dict[str, float]:
        device = next(model.parameters()).device
        autocast = lambda: autocast_context(precision, device)  # noqa: E731 - as task_scores.load_scorer's
        was_training = model.training
        model.eval()
        row: dict[str, float] = {}
        try:
            if self.tasks:
                scorer = ContinuationScorer(model, self.tokenizer, self.batch_size, autocast=autocast)
                for (name, task), groups in zip(self.tasks, self.groups):
                    scores = gather(scorer.score(groups, (info.rank, info.world_size)), groups, info)
                    metrics = task_metrics(task, scores)
                    row.update({f"{PREFIX}{name}/{k}": v for k, v in metrics.items() if k in KEPT})
            if self.probe is not None:
                row[f"{PREFIX}{self.probe_label}/acc"] = self.probe.score(model, info, autocast)
        finally:
            model.train(was_training)
        return row


def gather(mine: list, groups: list[Group], info: DistInfo) -> list[list[tuple[float, bool]]]:
    """Every process's share of the scores (None where another process scored the group) as the full list on
    every process: each (log-likelihood, greedy) in its own slot of a zero tensor, the tensors summed."""
    if not info.enabled:
        return mine
    width = max(len(g.continuations) for g in groups)
    slots = torch.zeros(len(groups), width, 2, dtype=torch.float64)  # (items, choices, [loglik, greedy])
    for i, scores in enumerate(mine):
        for n, (loglik, greedy) in enumerate(scores or ()):
            slots[i, n, 0], slots[i, n, 1] = loglik, float(greedy)
    total = all_reduce_sum(slots, info).cpu().tolist()
    return [[(total[i][n][0], total[i][n][1] > 0.5) for n in range(len(g.continuations))]
            for i, g in enumerate(groups)]
