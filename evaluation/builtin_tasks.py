"""Tasks that need no download, made from the held-out half of the built-in corpus (`stdlib:docs:valid`), and
`load_task`: a task as a recipe's `eval.tasks` or `tfkit eval --task` names it (a built-in name or a file).

A GPT trained on `stdlib:docs:train` never saw these docstrings (stdlib:docs splits by file), so the
quickstart shows a task score that rises as the model learns English as the standard library writes it:

- `stdlib:docs-cloze` (LAMBADA's shape): every sentence of a held-out docstring that ends in a word of
  three letters or more; the context is the docstring up to that word (its last CONTEXT_CHARS characters,
  cut at a space), the word is what greedy decoding must give exactly;
- `stdlib:docs-choice` (HellaSwag's shape): every sentence of 8 to 30 words, cut in half; the first
  half is the context, the choices are its own second half and those of three other sentences, drawn and
  placed with a fixed seed.

Both are the same items on every run and machine for one Python version (the corpus is; the draws use
`random.Random(SEED)`), and are tasks as `task_file.read_task` returns them, so `tfkit eval CKPT --task
stdlib:docs-cloze` scores exactly what the training loop scored.
"""

from __future__ import annotations

import random
import re
from functools import lru_cache
from pathlib import Path

from ..errors import DataError
from ..tokenization.stdlib_corpus import stdlib_documents
from .task_file import CLOZE, MULTIPLE_CHOICE, Item, Task, read_task

CONTEXT_CHARS = 400  # a cloze context's longest reach back into its docstring
SEED = 0
CHOICES = 4
MAX_WORDS = 30  # the longest sentence a choice item is made of
SENTENCE = re.compile(r"[^.!?]*[.!?](?=\s|$)")  # up to a full stop followed by a space or the end


def _sentences() -> list[tuple[str, str]]:
    """(the docstring up to the sentence, the sentence) for every sentence of every held-out docstring."""
    out = []
    for doc in stdlib_documents("stdlib:docs:valid"):
        flat = " ".join(doc.split())  # docstrings wrap lines: one space between words
        for match in SENTENCE.finditer(flat):
            out.append((flat[:match.start()].strip(), match.group().strip()))
    return out


@lru_cache(maxsize=None)
def _cloze() -> tuple[Item, ...]:
    items = []
    for before, sentence in _sentences():
        words = sentence.rstrip(".!?").split()
        if len(words) < 6 or not (words[-1].isalpha() and len(words[-1]) >= 3):
            continue
        context = f"{before} {' '.join(words[:-1])}".strip()
        if len(context) > CONTEXT_CHARS:  # keep the last characters, from a word's start
            context = context[-CONTEXT_CHARS:].split(" ", 1)[-1]
        items.append(Item(context, (words[-1],), 0))
    return tuple(items)


@lru_cache(maxsize=None)
def _choice() -> tuple[Item, ...]:
    halves = []
    for _, sentence in _sentences():
        words = sentence.split()
        if 8 <= len(words) <= MAX_WORDS:  # a choice short enough for a small model's context
            cut = len(words) // 2
            halves.append((" ".join(words[:cut]), " ".join(words[cut:])))
    draw, items = random.Random(SEED), []
    for k, (context, ending) in enumerate(halves):
        others = draw.sample([j for j in range(len(halves)) if j != k], CHOICES - 1)
        choices = [halves[j][1] for j in others]
        gold = draw.randrange(CHOICES)
        choices.insert(gold, ending)
        items.append(Item(context, tuple(choices), gold))
    return tuple(items)


BUILTIN = {"stdlib:docs-cloze": (CLOZE, _cloze), "stdlib:docs-choice": (MULTIPLE_CHOICE, _choice)}


def load_task(spec: str | Path, limit: int | None = None) -> Task:
    """The task `spec` names: a built-in (BUILTIN) or a task file (read and checked whole); its first `limit`
    items when given."""
    text = str(spec)
    if text in BUILTIN:
        kind, make = BUILTIN[text]
        task = Task(Path(text), kind, make())
    elif text.startswith("stdlib:"):
        raise DataError(f"task {text}: no such built-in task (expected one of {', '.join(BUILTIN)}, or a task file)",
                        params=("task",))
    else:
        task = read_task(spec)
    return task if limit is None else Task(task.path, task.kind, task.items[:limit])
