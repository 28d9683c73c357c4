"""lm-evaluation-harness tasks as tfkit tasks (`eval.tasks: [lm-eval:NAME]`), read from its cache only.

A training run must not stop at its first validation because a download failed, nor wait on the network
between updates: so the task's documents are loaded once, before training, with the Hugging Face hub and
datasets offline, and a task whose data the user's cache does not hold is refused then, in one line. Only
multiple-choice tasks (ARC, HellaSwag, PIQA, SciQ, COPA, ...) are taken: each document becomes an `Item` of
its zero-shot context (`doc_to_text`), its choices (`doc_to_choice`) and the gold index (`doc_to_target`),
scored as `tfkit eval --task` scores a task file (lm-eval's default `target_delimiter`, one space).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from ..errors import ConfigError, DataError
from .task_file import MULTIPLE_CHOICE, Item, Task

OFFLINE = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}


def go_offline() -> None:
    """The hub and datasets offline for this process: the environment for modules not imported yet, their
    constants for those already imported (they read the environment once, at import)."""
    os.environ.update(OFFLINE)
    for module, names in (("huggingface_hub.constants", ("HF_HUB_OFFLINE",)),
                          ("datasets.config", ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))):
        if module in sys.modules:
            for name in names:
                if hasattr(sys.modules[module], name):
                    setattr(sys.modules[module], name, True)


def lm_eval_task(name: str, limit: int | None = None) -> Task:
    """The documents of lm-eval task `name` as a multiple-choice Task (its first `limit` when given)."""
    go_offline()
    try:
        from lm_eval.tasks import TaskManager, get_task_dict
    except ImportError:
        raise ConfigError(f"eval.tasks: lm-eval:{name} needs lm-evaluation-harness (pip install "
                          "\"tfkit[lm-eval]\")") from None
    try:
        task = get_task_dict([name], TaskManager())[name]
        docs = list(task.eval_docs)
    except Exception as exc:  # noqa: BLE001 - the harness raises anything from KeyError to ConnectionError
        first = (str(exc).splitlines() or [type(exc).__name__])[0][:200]
        raise DataError(f"eval.tasks: lm-eval:{name} is not available offline ({first}); run it once with "
                        "lm-evaluation-harness online to fill the cache, or drop it") from None
    if getattr(task, "OUTPUT_TYPE", None) != MULTIPLE_CHOICE:
        raise DataError(f"eval.tasks: lm-eval:{name} is a {getattr(task, 'OUTPUT_TYPE', 'unknown')} task; the "
                        "training loop scores multiple-choice tasks")
    items = []
    for doc in docs[:limit]:
        choices = [str(c) for c in task.doc_to_choice(doc)]
        target = task.doc_to_target(doc)
        gold = choices.index(target) if isinstance(target, str) else int(target)
        items.append(Item(str(task.doc_to_text(doc)), tuple(choices), gold))
    if not items:
        raise DataError(f"eval.tasks: lm-eval:{name} has no documents to score")
    return Task(Path(name), MULTIPLE_CHOICE, tuple(items))
