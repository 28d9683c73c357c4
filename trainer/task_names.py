"""The names of in-loop downstream scores (trainer/downstream.py), read by recipe checks and the trainer alike.

Row keys are `task/NAME/METRIC` (`task/docs-cloze/acc`, `task/probe-topics/acc`): TensorBoard and W&B group
them by the slash, and `eval.best_by: task:NAME` reads `task/NAME/acc`.
"""

from __future__ import annotations

from pathlib import Path

PREFIX = "task/"  # metrics.jsonl keys: task/NAME/METRIC
BUILTIN_TASKS = ("stdlib:docs-cloze", "stdlib:docs-choice")  # evaluation/builtin_tasks.py makes them
LM_EVAL = "lm-eval:"  # eval.tasks entries of lm-evaluation-harness (its cache must hold their data)
BEST_BY_LOSS = "val_loss"


def task_name(spec: str) -> str:
    """The name a task's rows carry: `stdlib:docs-cloze` -> docs-cloze, `lm-eval:arc_easy` -> arc_easy, a
    file -> its stem (`data/copa.jsonl` -> copa)."""
    if spec.startswith("stdlib:"):
        return spec.removeprefix("stdlib:")
    if spec.startswith(LM_EVAL):
        return spec.removeprefix(LM_EVAL)
    return Path(spec).name.removesuffix(".jsonl")


def probe_data(probe: dict | str | None) -> str | None:
    """The labelled data of `eval.probe` (a mapping's `data`, or the string itself)."""
    if isinstance(probe, dict):
        data = probe.get("data")
        return data if isinstance(data, str) else None
    return probe


def probe_name(probe: dict | str) -> str:
    """`probe-topics` for stdlib:topics, `probe-STEM` for a file."""
    data = probe_data(probe) or "probe"
    stem = data.split(":")[1] if data.startswith("stdlib:") else Path(data).name.split(".")[0]
    return f"probe-{stem}"


def score_names(tasks: list[str], probe: dict | str | None) -> list[str]:
    return [task_name(t) for t in tasks] + ([probe_name(probe)] if probe else [])


def best_key(best_by: str) -> str | None:
    """The row key `eval.best_by` keeps the best of: None for the validation loss, `task/NAME/acc` for
    `task:NAME` (`task:NAME/METRIC` for another of the task's metrics, e.g. acc_norm)."""
    if best_by == BEST_BY_LOSS:
        return None
    name, _, metric = best_by.removeprefix("task:").partition("/")
    return f"{PREFIX}{name}/{metric or 'acc'}"
