"""A corpus key that names several sources: `data.train` / `data.valid` as a list of named, weighted corpora.

    data:
      train:
        - {name: mine, path: corpus/*.jsonl.zst, weight: 0.6}
        - {name: docs, path: stdlib:docs:train, weight: 0.3}
        - {name: code, path: stdlib:code, weight: 0.1, repeat: false}

Each source is any corpus a single-corpus key takes (`path`: a file, glob, folder, JSONL, Parquet, Arrow,
compressed file or `stdlib:...`), with a `name` (what start.log, the metrics rows and the report call it),
a `weight` (its share of the training tokens, normalised over the list), `repeat` (false: the run ends when
the source is used up, rather than reading it again) and its own `text_field` (default `data.text_field`).
Under `data.valid` a source needs no weight: the mixed validation figure weighs it as the training source of
the same name (or by its own `weight`, or equally).

A recipe keeps the list as plain YAML (lists and mappings, so recipe.yaml and config.json read back as
written); `read_sources` turns it into `Source` values, `source_problems` names everything wrong with it at
once, and `spec_text` says it in one line. How the sources are mixed is `mixture.py`.
"""

from __future__ import annotations

import difflib
import math
import re
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")  # a word of metrics keys: val_loss/NAME
KEYS = ("name", "path", "weight", "repeat", "text_field")
VALID_KEYS = ("name", "path", "weight", "text_field")  # validation reads each source once: no repeat


@dataclass(frozen=True)
class Source:
    """One named corpus of a list (module doc); `weight` as written, `share` normalised by `read_sources`."""

    name: str
    path: str
    weight: float | None = 1.0  # None: a validation source that names no weight (`mixed_weights`)
    repeat: bool = True
    text_field: str = "text"
    share: float = 1.0  # weight / the sum of the list's weights

    def label(self) -> str:
        """`docs (stdlib:docs:train)`: how an error or a report line names the source."""
        return f"{self.name} ({self.path})"


def is_mixture(value: object) -> bool:
    """Whether a corpus key holds a list of sources rather than one corpus (a string) or null."""
    return isinstance(value, list)


def source_problems(value: object, key: str, *, valid: bool = False) -> list[str]:
    """Every problem of a list of sources under `key` (data.train, data.valid), each naming the entry: not a
    mapping, an unknown or missing key, a name that is not a word or is given twice, a path that is not a
    text, a weight that is not a positive finite number, a repeat that is not true/false. `valid`: the list
    of data.valid (no `repeat`, `weight` optional)."""
    if not isinstance(value, list):
        return []
    if not value:
        return [f"{key}: an empty list of sources, expected at least one {{name, path, weight}}"]
    allowed = VALID_KEYS if valid else KEYS
    out, seen = [], set()
    for i, entry in enumerate(value):
        where = f"{key}[{i}]"
        if not isinstance(entry, dict):
            out.append(f"{where}: got {entry!r}, expected a mapping {{name, path{'' if valid else ', weight'}}}")
            continue
        name = entry.get("name")
        if isinstance(name, str) and NAME.fullmatch(name):
            where = f"{key}[{i}] ({name})"
            if name in seen:
                out.append(f"{where}: the name {name!r} is given twice, expected one name per source")
            seen.add(name)
        else:
            out.append(f"{where}.name: got {name!r}, expected a word of letters, digits, '_', '-' or '.' (it names "
                       "the source in metrics keys such as val_loss/NAME)")
        for unknown in sorted(set(entry) - set(allowed), key=str):
            close = difflib.get_close_matches(str(unknown), allowed, n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            out.append(f"{where}.{unknown}: unknown key{hint}, expected {', '.join(allowed)}")
        path = entry.get("path")
        if not isinstance(path, str) or not path.strip():
            out.append(f"{where}.path: got {path!r}, expected a corpus (a file, glob, folder or stdlib:...)")
        if "weight" in entry or not valid:
            out += _weight_problem(entry.get("weight"), where)
        if "repeat" in entry and not isinstance(entry["repeat"], bool):
            out.append(f"{where}.repeat: got {entry['repeat']!r}, expected true (read it again when it runs out) "
                       "or false (end the run there)")
        if "text_field" in entry and not (isinstance(entry["text_field"], str) and entry["text_field"]):
            out.append(f"{where}.text_field: got {entry['text_field']!r}, expected a key or column name")
    return out


def _weight_problem(weight: Any, where: str) -> list[str]:
    number = isinstance(weight, (int, float)) and not isinstance(weight, bool)
    if number and math.isfinite(weight) and weight > 0:
        return []
    what = "missing" if weight is None else f"got {weight!r}"
    return [f"{where}.weight: {what}, expected a positive finite number (its share of the training tokens)"]


def read_sources(value: list, key: str, text_field: str = "text", *, valid: bool = False) -> list[Source]:
    """The `Source`s of a list `source_problems` finds nothing wrong with (else one ConfigError naming them
    all), shares normalised; a validation source without a weight has None (`mixed_weights` decides)."""
    problems = source_problems(value, key, valid=valid)
    if problems:
        raise ConfigError("; ".join(problems))
    weights = [float(entry["weight"]) if "weight" in entry else None for entry in value]
    total = sum(w or 1.0 for w in weights)
    return [Source(name=entry["name"], path=entry["path"], weight=w, repeat=entry.get("repeat", True),
                   text_field=entry.get("text_field", text_field), share=(w or 1.0) / total)
            for entry, w in zip(value, weights)]


def weights_note(value: object, key: str = "data.train") -> str | None:
    """A warning when the weights of a list do not sum to 1 (they are normalised: said, not refused)."""
    if not isinstance(value, list) or source_problems(value, key):
        return None
    weights = [float(entry["weight"]) for entry in value]
    if math.isclose(sum(weights), 1.0, rel_tol=1e-6):
        return None
    shares = ", ".join(f"{entry['name']} {w / sum(weights):.3g}" for entry, w in zip(value, weights))
    return f"{key}: the weights sum to {sum(weights):g}, not 1; they are normalised to shares of the tokens: {shares}"


def mixed_weights(valid: list[Source], train: list[Source] | None) -> dict[str, float]:
    """name -> the share each validation source has in the mixed validation figure: the share of the training
    source of the same name when every validation source is one and none names a weight of its own, else its
    own weight (1 where it names none); normalised."""
    by_name = {s.name: s.share for s in train or []}
    if all(s.weight is None and s.name in by_name for s in valid):
        raw = {s.name: by_name[s.name] for s in valid}
    else:
        raw = {s.name: 1.0 if s.weight is None else s.weight for s in valid}
    total = sum(raw.values())
    return {name: w / total for name, w in raw.items()}


def spec_text(value: object) -> str:
    """One line for a corpus key: the string itself, or `mine 60% + docs 30% + code 10%` for a list."""
    if not isinstance(value, list):
        return str(value)
    try:
        sources = read_sources(value, "data")
    except ConfigError:
        return str(value)
    return " + ".join(f"{s.name} {_percent(s.share)}" for s in sources)


def _percent(share: float) -> str:
    return f"{100 * share:.3g}%"


def source_paths(value: object) -> list[tuple[str, str]]:
    """(key, corpus) of every corpus a corpus key reads: (`data.train`, spec) for a string, (`data.train[docs]`,
    path) per source of a list; nothing for null."""
    if isinstance(value, str):
        return [("", value)]
    if isinstance(value, list):
        return [(f"[{e.get('name')}]", e["path"]) for e in value
                if isinstance(e, dict) and isinstance(e.get("path"), str)]
    return []
