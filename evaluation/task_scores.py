"""`tfkit eval --task FILE`: a causal checkpoint's score on a downstream task, lm-evaluation-harness's way.

Multiple choice: the choice with the highest log-likelihood is the model's answer (`acc`), or the highest
log-likelihood per UTF-8 byte of the choice (`acc_norm`, which stops long answers losing for their
length; lm-eval counts characters, the same number for ASCII text). Cloze (LAMBADA): an item is right
when greedy decoding gives its last word exactly (`acc`); `perplexity` is exp of the mean negative
log-likelihood of those words. Each accuracy comes with its standard error, the sample standard
deviation over the items / sqrt(items), as lm-eval reports it.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import torch

from ..checkpoints.folders import read_checkpoint
from ..checkpoints.record import CheckpointRecord
from ..checkpoints.weights import load_with_tokenizer
from ..errors import ConfigError
from ..runtime import check_precision, pick_device
from ..trainer.optim import autocast_context
from .evaluate import check_batch_size, checkpoint_precision
from ..tokenization.train import TfkitTokenizer
from .loglikelihood import ContinuationScorer, Group, encode_pair
from .task_file import CLOZE, Task


def mean_and_stderr(values: list[float]) -> tuple[float, float]:
    """(mean, standard error of the mean), with the sample (n - 1) standard deviation; 0 for one value."""
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, 0.0
    variance = sum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, math.sqrt(variance / n)


def argmax(values: list[float]) -> int:
    """The first index of the largest value (numpy's tie rule, which lm-eval's argmax follows)."""
    return max(range(len(values)), key=lambda i: (values[i], -i))


def task_metrics(task: Task, scores: list[list[tuple[float, bool]]]) -> dict:
    """The task's metrics from (log-likelihood, greedy) per item and continuation (module docstring)."""
    if task.kind == CLOZE:
        acc, acc_stderr = mean_and_stderr([float(s[0][1]) for s in scores])
        nll = -sum(s[0][0] for s in scores) / len(scores)
        return {"acc": acc, "acc_stderr": acc_stderr, "perplexity": math.exp(min(nll, 700.0))}
    right, right_norm = [], []
    for item, item_scores in zip(task.items, scores):
        logprobs = [s[0] for s in item_scores]
        per_byte = [lp / len(choice.encode("utf-8")) for lp, choice in zip(logprobs, item.choices)]
        right.append(float(argmax(logprobs) == item.gold))
        right_norm.append(float(argmax(per_byte) == item.gold))
    acc, acc_stderr = mean_and_stderr(right)
    acc_norm, acc_norm_stderr = mean_and_stderr(right_norm)
    return {"acc": acc, "acc_stderr": acc_stderr, "acc_norm": acc_norm, "acc_norm_stderr": acc_norm_stderr}


def task_groups(tokenizer: TfkitTokenizer, task: Task) -> list[Group]:
    """Every item's context and continuations as token ids (lm-eval's split: the context's ids do not depend on
    the choice)."""
    groups, prefix = [], tokenizer.document_prefix()
    for item in task.items:
        pairs = [encode_pair(tokenizer, item.context, c, prefix) for c in item.continuations]
        groups.append(Group(pairs[0][0], [ids for _, ids in pairs]))
    return groups


def load_scorer(path: str | Path, *, batch_size: int = 8, device: str | torch.device = "cpu",
                dtype: str = "fp32") -> tuple[ContinuationScorer, dict]:
    """The scorer of a causal checkpoint (folder or run folder) and what a results row says about it; dtype
    `auto` scores in the precision the checkpoint trained in."""
    check_precision(dtype, allow_auto=True)
    check_batch_size(batch_size)
    device = pick_device(device) if isinstance(device, str) else device
    folder, (model, cfg, tokenizer) = read_checkpoint(path, lambda f: load_with_tokenizer(f, device=device))
    if cfg.arch != "gpt":
        raise ConfigError(f"{folder}: task scoring works on causal (GPT) checkpoints by log-likelihood; this one is "
                          f"arch {cfg.arch}")
    precision = checkpoint_precision(folder, CheckpointRecord.read(folder), dtype)
    model.eval()
    scorer = ContinuationScorer(model, tokenizer, batch_size, autocast=lambda: autocast_context(precision, device))
    return scorer, {"checkpoint": str(folder), "arch": cfg.arch, "params": model.num_params(), "dtype": precision}


def score_task(path: str | Path, task: Task, *, batch_size: int = 8, device: str | torch.device = "cpu",
               dtype: str = "fp32") -> dict:
    """One results row: the checkpoint, the task, its metrics and items scored per second."""
    scorer, row = load_scorer(path, batch_size=batch_size, device=device, dtype=dtype)
    started = time.perf_counter()
    scores = scorer.score(task_groups(scorer.tokenizer, task))
    seconds = time.perf_counter() - started
    return {**row, "task": task.name, "kind": task.kind, "items": len(task.items), **task_metrics(task, scores),
            "items_per_sec": len(task.items) / seconds if seconds else None}

