"""Labelled data for fine-tuning: texts, or text pairs, each with a class label or a float target.

Data comes as people have it (`labelled_rows`: CSV / TSV with or without a header, JSON lines, Parquet,
gzip / zstd) or as the built-in `stdlib:topics` set; `Columns` picks the text, the pair's second text and
the label by name or by position. What `load_labelled` decides, and why:

- classification labels are strings or integers (an integral float, as Parquet makes of an integer column
  with a null, is its integer; a fractional one is refused, in every format); the classes are the
  training file's, numbered in sorted order, numerically when every label is an integer, so GLUE's 0/1
  stay 0/1 and the numbering never depends on row order;
- a validation label the training file never has is refused (the model has no output for it), and so is
  a training file with a single class;
- a class name holding U+FFFD is refused, naming its row: it is what invalid UTF-8 becomes (`encoding`),
  and a model whose class is `hill\ufffd` carries the damage into config.json's id2label and every
  prediction; a text with a few such bytes is read, as a corpus is, with one warning;
- a regression target must be a finite number;
- a file without the default `text` column is read by HuggingFace's usual names, as run_glue.py reads GLUE:
  `sentence1` / `sentence2`, `premise` / `hypothesis`, `question1` / `question2` and `question` / `sentence` as
  pairs, else `sentence` or `question` alone (`USUAL_TEXTS`); a note says which columns were taken, and a
  column named in the recipe (`task.text`, `task.text_pair`) is never second-guessed;
- a row whose text (or second text) is empty or missing is skipped and counted, and the count is one of
  the `notes` a run writes to start.log: a blank cell is a gap in the data, not a reason to stop a run;
- without a validation file, a seeded share of the training file is held out, stratified by label for
  classification (each class gives its share, and keeps at least one training example), a plain seeded
  sample (`holdout.sample_documents`) for regression; a note says so.
Every problem is one line naming the file, the row and the column, with what was expected.
"""

from __future__ import annotations

import math
import random
import re
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError, DataError, shorten
from .encoding import REPLACEMENT
from .holdout import check_fraction, sample_documents
from .labelled_rows import Row, read_rows
from .stdlib_topics import is_topics_spec, topic_rows

TASKS = ("classification", "regression")
SHOWN = 20  # column names or labels listed in a message
# HuggingFace's usual text columns (GLUE, MNLI/SNLI, QQP, QNLI), pairs first: read where `text` is not a column.
USUAL_TEXTS = (("sentence1", "sentence2"), ("premise", "hypothesis"), ("question1", "question2"),
               ("question", "sentence"), ("sentence", None), ("question", None))


@dataclass(frozen=True)
class Columns:
    """Where the text, the second text of a pair (None: single texts) and the label are: a column name, or
    a position counted from 0 (the only way to name a column of a file read without a header)."""

    text: str | int = "text"
    text_pair: str | int | None = None
    label: str | int = "label"

    def problems(self) -> list[str]:
        out = []
        chosen = {"text": self.text, "text_pair": self.text_pair, "label": self.label}
        for key, column in chosen.items():
            if column is None and key == "text_pair":
                continue
            if isinstance(column, bool) or not isinstance(column, (str, int)) or column == "" or (
                    isinstance(column, int) and column < 0):
                out.append(f"columns.{key}: got {column!r}, expected a column name or a position (0, 1, ...)")
        named = [column for column in chosen.values() if column is not None]
        if len(set(named)) < len(named):
            out.append(f"columns: text, text_pair and label must be different columns, got {chosen}")
        return out


@dataclass
class Examples:
    """One split: `targets` holds class ids (classification) or floats (regression), one per text."""

    source: str
    texts: list[str]
    pairs: list[str] | None  # the second texts, for pair tasks
    targets: list[Any]
    skipped: int = 0  # rows skipped for an empty text
    first_skipped: str | None = None  # where the first of them is
    note: str | None = None  # which columns were read where `text` is not one (`usual_columns`)

    def __len__(self) -> int:
        return len(self.texts)

    def subset(self, indices: list[int], source: str) -> Examples:
        pairs = None if self.pairs is None else [self.pairs[i] for i in indices]
        return Examples(source, [self.texts[i] for i in indices], pairs, [self.targets[i] for i in indices])


@dataclass
class LabelledData:
    train: Examples
    valid: Examples
    task: str
    labels: tuple[str, ...] | None  # class names by id; None for regression
    notes: list[str] = field(default_factory=list)  # what a run reports in start.log

    @property
    def id2label(self) -> dict[int, str]:
        return dict(enumerate(self.labels or ()))

    @property
    def label2id(self) -> dict[str, int]:
        return {name: i for i, name in enumerate(self.labels or ())}


def _listed(names: list[str]) -> str:
    return ", ".join(map(str, names[:SHOWN])) + (f", ... ({len(names)} in all)" if len(names) > SHOWN else "")


def _cell(row: Row, column: str | int, key: str) -> Any:
    """The cell of `column` in `row`; a DataError naming the row and listing the columns there are."""
    if isinstance(column, int):
        if column < len(row.values):
            return row.values[column]
        raise DataError(f"{row.where}: no column {column} for task.{key} (this row has {len(row.values)} "
                        "columns, counted from 0)")
    if row.names is None:
        raise ConfigError(f"task.{key}: {column!r} names a column, but the file is read without a header "
                          "(task.header: false); give its position (0, 1, ...)")
    if column not in row.names:
        raise DataError(f"{row.where}: no column {column!r} (task.{key}); the columns there are: "
                        f"{_listed(row.names)}; set task.{key} to the one to read")
    index = row.names.index(column)
    if index >= len(row.values):
        raise DataError(f"{row.where}: {len(row.values)} cells, but column {column!r} is number {index + 1} "
                        "of the header")
    return row.values[index]


def _text(row: Row, column: str | int, key: str) -> str:
    value = _cell(row, column, key)
    if value is None or isinstance(value, str):
        return value or ""
    raise DataError(f"{row.where}: column {column!r} (task.{key}) holds {value!r}, expected text")


def _finite(value: Any) -> float | None:
    """`value` as a finite float: a number, or a string that spells one; None otherwise (a bool is no number)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return None
    try:
        number = float(value)
    except (ValueError, OverflowError):
        return None
    return number if math.isfinite(number) else None


def _label(row: Row, column: str | int) -> str:
    """A class label as its name: a string, or an integer's digits, however written ("1", 1, 1.0 and "1.0"
    are one class; true / false for a JSON boolean). A fractional number is refused in every format: it
    is a regression target, and as class names an STS-B file would become dozens of classes."""
    value = _cell(row, column, "label")
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        value = value.strip()
        if re.fullmatch(r"[+-]?\d+", value):
            return str(int(value))  # exact, however long
    if value is None or value == "":
        raise DataError(f"{row.where}: the label (column {column!r}) is empty")
    number = _finite(value)
    if number is not None and number.is_integer():
        return str(int(number))
    if number is None and isinstance(value, str):
        return _class_name(row, column, value)
    raise DataError(f"{row.where}: label {shorten(repr(value))} (column {column!r}): expected a class name or an "
                    "integer (fractional targets are task: regression)")


def _class_name(row: Row, column: str | int, name: str) -> str:
    if REPLACEMENT in name:
        raise DataError(f"{row.where}: label {shorten(repr(name))} (column {column!r}) holds U+FFFD, what bytes "
                        "that are not UTF-8 are read as; expected a class name in UTF-8 text (save the file as "
                        "UTF-8, e.g. `iconv -f LATIN1 -t UTF-8`)")
    return name


def _target(row: Row, column: str | int) -> float:
    value = _cell(row, column, "label")
    number = _finite(value)
    if number is None:
        raise DataError(f"{row.where}: column {column!r} is {shorten(repr(value))}, expected a finite number "
                        "(task: regression)")
    return number


def _rows(spec: str, header: bool) -> Iterator[Row]:
    return topic_rows(spec) if is_topics_spec(spec) else read_rows(Path(spec), header)


def usual_columns(columns: Columns, names: list[str] | None, spec: str) -> tuple[Columns, str | None]:
    """`columns`, or for a file whose header has no `text` column while the text is left at that default,
    the first of `USUAL_TEXTS` it has (a pair only when no second text was named), with the note that says so."""
    if names is None or columns.text != "text" or "text" in names:
        return columns, None
    for text, pair in USUAL_TEXTS:
        if text in names and (pair is None or (pair in names and columns.text_pair is None)):
            taken = Columns(text, pair if pair is not None else columns.text_pair, columns.label)
            read = f"'{text}' and '{pair}' as a text pair" if pair else f"'{text}' as the text"
            return taken, (f"{spec}: no column 'text'; reading {read}, as HuggingFace's run_glue.py does "
                           "(set task.text / task.text_pair to choose)")
    return columns, None


def _resolved(rows: Iterator[Row], columns: Columns, spec: str) -> Iterator[tuple[Row, Columns, str | None]]:
    """Every row with the columns to read it by (`usual_columns`, decided on the first row's header)."""
    chosen: tuple[Columns, str | None] | None = None
    for row in rows:
        chosen = chosen or usual_columns(columns, row.names, spec)
        yield row, *chosen


def read_texts(spec: str, columns: Columns, header: bool = True) -> Iterator[tuple[str, str, str | None]]:
    """(where, text, second text or None) of every row of `spec`, streamed, empty texts too: what
    `tfkit predict` labels, one output row per input row; no label column is needed."""
    for row, columns, _ in _resolved(_rows(spec, header), columns, spec):
        pair = None if columns.text_pair is None else _text(row, columns.text_pair, "text_pair")
        yield row.where, _text(row, columns.text, "text"), pair


def read_examples(spec: str, columns: Columns, task: str, header: bool = True) -> tuple[Examples, dict[str, str]]:
    """The examples of one file, targets still as read (label names, or floats), and for classification
    where each label is first seen (for messages about labels)."""
    texts, targets, first_at = [], [], {}
    examples = Examples(spec, texts, None, targets)
    for row, columns, note in _resolved(_rows(spec, header), columns, spec):
        if examples.pairs is None and columns.text_pair is not None:  # the columns are the first row's
            examples.pairs = []
        examples.note = note
        text = _text(row, columns.text, "text")
        pair = None if columns.text_pair is None else _text(row, columns.text_pair, "text_pair")
        if not text.strip() or (pair is not None and not pair.strip()):
            examples.skipped += 1
            examples.first_skipped = examples.first_skipped or row.where
            continue
        target = _label(row, columns.label) if task == "classification" else _target(row, columns.label)
        texts.append(text)
        targets.append(target)
        if pair is not None:
            examples.pairs.append(pair)
        if task == "classification":
            first_at.setdefault(target, row.where)
    if not texts:
        empty = f" ({examples.skipped} rows with an empty text)" if examples.skipped else ""
        raise DataError(f"labelled data {spec}: no examples{empty}")
    return examples, first_at


def label_names(labels: set[str] | dict[str, Any]) -> tuple[str, ...]:
    """The classes in id order: numerically when every label is an integer, else alphabetically."""
    if all(re.fullmatch(r"-?\d+", name) for name in labels):
        return tuple(sorted(labels, key=int))
    return tuple(sorted(labels))


def _check_valid_labels(first_at: dict[str, str], label2id: dict[str, int], train: str) -> None:
    for name, where in first_at.items():
        if name not in label2id:
            raise DataError(f"{where}: label {name!r} never occurs in the training data {train} "
                            f"(its labels: {_listed(list(label2id))})")


def stratified_holdout(targets: list[int], fraction: float, seed: int) -> list[int]:
    """The indices held out: about `fraction` of each class (half up), drawn with `seed`, each class keeping
    at least one training example; one example of the largest class when the shares round to none."""
    rng = random.Random(seed)
    by_class: dict[int, list[int]] = defaultdict(list)
    for i, target in enumerate(targets):
        by_class[target].append(i)
    picked = []
    for label in sorted(by_class):
        members = by_class[label]
        picked += rng.sample(members, min(len(members) - 1, int(len(members) * fraction + 0.5)))
    largest = max(sorted(by_class), key=lambda label: len(by_class[label]))
    if not picked and len(by_class[largest]) > 1:
        picked = rng.sample(by_class[largest], 1)
    return sorted(picked)


def hold_out(examples: Examples, fraction: float, seed: int, stratify: bool) -> tuple[Examples, Examples, str]:
    """(train, valid, the note saying so) from one file's examples."""
    check_fraction(fraction)
    indices = list(range(len(examples)))
    if stratify:
        held = stratified_holdout(examples.targets, fraction, seed)
    else:
        held = sample_documents(indices, fraction, seed)[1]
    if not held or len(held) == len(examples):
        raise DataError(f"labelled data {examples.source}: {len(examples)} examples are too few to hold out "
                        f"{fraction:g} of them for validation; give a validation file")
    kept = sorted(set(indices) - set(held))
    how = "stratified by label" if stratify else "a seeded sample"
    note = (f"no validation data: {len(held)} of the {len(examples)} examples of {examples.source} held out "
            f"for validation (fraction {fraction:g}, seed {seed}, {how})")
    return examples.subset(kept, examples.source), examples.subset(held, f"{examples.source} (held out)"), note


def load_labelled(train: str, valid: str | None = None, *, columns: Columns = Columns(),
                  task: str = "classification", header: bool = True, valid_fraction: float = 0.1,
                  seed: int = 0) -> LabelledData:
    """The training and validation examples of a fine-tuning run, labels numbered (see the module doc)."""
    if task not in TASKS:
        raise ConfigError(f"task: got {task!r}, expected one of {', '.join(TASKS)}")
    problems = columns.problems()
    if problems:
        raise ConfigError("; ".join(problems))
    train_set, train_first = read_examples(train, columns, task, header)
    valid_set, valid_first = read_examples(valid, columns, task, header) if valid else (None, {})
    labels = None
    if task == "classification":
        labels = label_names(train_first)
        if len(labels) < 2:
            raise DataError(f"labelled data {train}: every label is {labels[0]!r}; classification needs at "
                            "least two classes")
        label2id = {name: i for i, name in enumerate(labels)}
        _check_valid_labels(valid_first, label2id, train)
        for split in (train_set, valid_set):
            if split is not None:
                split.targets[:] = [label2id[name] for name in split.targets]
    notes = [s.note for s in (train_set, valid_set) if s is not None and s.note]
    notes += [f"{s.source}: {s.skipped} rows with an empty text skipped (the first at {s.first_skipped})"
              for s in (train_set, valid_set) if s is not None and s.skipped]
    if valid_set is not None and (valid_set.pairs is None) != (train_set.pairs is None):
        raise DataError(f"labelled data {valid}: read as {'text pairs' if valid_set.pairs else 'single texts'}, "
                        f"but {train} as {'text pairs' if train_set.pairs else 'single texts'}; name the columns "
                        "with task.text and task.text_pair")
    if valid_set is None:
        train_set, valid_set, note = hold_out(train_set, valid_fraction, seed, stratify=labels is not None)
        notes.append(note)
    return LabelledData(train_set, valid_set, task, labels, notes)
