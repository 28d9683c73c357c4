"""A downstream task as a JSON-lines file (`tfkit eval --task FILE`), read and checked whole before scoring.

Two kinds, told apart by the first record, in the conventions of lm-evaluation-harness:

- multiple choice: `{"context": "The cat sat on the", "choices": ["mat", "moon"], "gold": 0}`. Each choice is
  scored as the continuation `" " + choice` of the context (lm-eval's default `target_delimiter`), so
  HellaSwag, ARC, PIQA, COPA and SciQ all fit once their fields are renamed;
- cloze (LAMBADA): `{"text": "... she handed him the key"}`: the text's last word is the continuation of
  everything before it, and an item counts as right when greedy decoding gives exactly that word.

Every problem is one DataError naming the file, the line and the field, before any model is loaded: a
task that fails on its 900th item must not cost the minutes spent scoring the first 899. The file is read
by the JSON-lines reader every data file uses (`tokenization.readers`): a line nested past the recursion
limit is one such line too, and invalid UTF-8 is replaced with one warning naming the first line.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..errors import DataError, shorten
from ..jsonfile import MAX_DEPTH
from ..tokenization.readers import ReadStats, jsonl_records

MULTIPLE_CHOICE, CLOZE = "multiple_choice", "cloze"
DELIMITER = " "  # between a context and its continuation, as lm-eval's target_delimiter


@dataclass(frozen=True)
class Item:
    """One question: the continuations scored after `context`, and which one is right (`gold`).

    A cloze item has one continuation (its last word), gold 0. `choices` are the answers as written (what
    acc_norm's lengths count); `continuations` are what is scored: the delimiter then the answer."""

    context: str
    choices: tuple[str, ...]
    gold: int

    @property
    def continuations(self) -> tuple[str, ...]:
        return tuple(DELIMITER + choice for choice in self.choices)


@dataclass(frozen=True)
class Task:
    """A task file's items, all of one kind, and the file's name (a table's title)."""

    path: Path
    kind: str  # MULTIPLE_CHOICE | CLOZE
    items: tuple[Item, ...]

    @property
    def name(self) -> str:
        return self.path.name.removesuffix(".jsonl")


def read_task(path: str | Path) -> Task:
    """Every item of the task file at `path`; a DataError naming the file, line and field of the first problem."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"task {path}: no such file (expected a JSON-lines task file)", params=("task",))
    items, kind, stats = [], None, ReadStats()
    for where, record in jsonl_records(path, stats, max_depth=MAX_DEPTH):  # records are quoted in messages
        if not isinstance(record, dict):
            raise DataError(f"{where}: expected a JSON object, got {type(record).__name__}")
        kind = kind or (CLOZE if "text" in record and "context" not in record else MULTIPLE_CHOICE)
        items.append(_cloze_item(record, where) if kind == CLOZE else _choice_item(record, where))
    if not items:
        raise DataError(f"{path}: no items (expected one JSON object per line)")
    stats.repairs.warn(f"task {path}")
    return Task(path, kind, tuple(items))


def _choice_item(record: dict, where: str) -> Item:
    context = _text_field(record, "context", where)
    choices = record.get("choices")
    if choices is None:
        raise DataError(f'{where}: no "choices" (expected a list of at least 2 answer strings)')
    if not isinstance(choices, list) or len(choices) < 2 or not all(isinstance(c, str) and c for c in choices):
        raise DataError(f'{where}: "choices" is {shorten(json.dumps(choices), 200)}; expected a list of at '
                        "least 2 non-empty answer strings")
    gold = record.get("gold")
    if gold is None:
        raise DataError(f'{where}: no "gold" (expected the index of the right choice, 0..{len(choices) - 1})')
    if isinstance(gold, bool) or not isinstance(gold, int) or not 0 <= gold < len(choices):
        raise DataError(f'{where}: "gold" is {shorten(json.dumps(gold), 200)}; expected an index of "choices", '
                        f"0..{len(choices) - 1}")
    return Item(context, tuple(choices), gold)


def _cloze_item(record: dict, where: str) -> Item:
    text = _text_field(record, "text", where).rstrip()
    head, _, word = text.rpartition(DELIMITER)
    if not head.strip() or not word:
        raise DataError(f'{where}: "text" needs at least two words: the last one is predicted from the rest')
    return Item(head, (word,), 0)


def _text_field(record: dict, field: str, where: str) -> str:
    value = record.get(field)
    if value is None:
        raise DataError(f'{where}: no "{field}" (expected a string)')
    if not isinstance(value, str) or not value.strip():
        raise DataError(f'{where}: "{field}" is {shorten(json.dumps(value), 200)}; expected a non-empty string')
    return value
