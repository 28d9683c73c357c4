"""Reading JSON that a user, a download or a killed process may have damaged: the one guarded reader.

Every JSON file tfkit reads (a checkpoint's or an HF folder's config.json, tokenizer_config.json, a
datasets state.json, a corpus line, metrics.jsonl, a lab's records) goes through `parse_json` or
`read_json`, so each mistake is one `TfkitError` line naming the file, never a traceback:
- invalid JSON or UTF-8;
- JSON nested past Python's recursion limit: the decoder recurses once per level and raises
  RecursionError, at a depth that depends on how deep the caller already was; values nested more than
  MAX_DEPTH levels are refused as well, since whatever walks them afterwards (checks, error messages that
  quote a value) recurses too. Files read only for a few keys of a large document (tokenizer.json, a
  corpus) pass `max_depth=None` and skip that walk;
- a value of the wrong kind where a mapping or a list is expected (`expect`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .errors import DataError, TfkitError

MAX_DEPTH = 100  # configs and records nest a few levels; the limit recipes have too (trainer/recipe.py)
KINDS = {dict: "a JSON object", list: "a JSON array", str: "a string", int: "an integer", float: "a number",
         bool: "true or false", type(None): "null"}


def kind_of(value: Any) -> str:
    """What a JSON value is, in the words of an error message: `a JSON array`, `a string`, `null`."""
    return KINDS.get(type(value), type(value).__name__)


def _too_deep(value: Any, limit: int) -> bool:
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return True
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values() if isinstance(v, (dict, list)))
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item if isinstance(v, (dict, list)))
    return False


def parse_json(data: str | bytes, where: str | Path, error: type[TfkitError] = DataError, *,
               expect: type | None = None, max_depth: int | None = MAX_DEPTH) -> Any:
    """The JSON value of `data`, or `error` naming `where` (a file, `file:line`) and what is wrong."""
    try:
        value = json.loads(data)
    except RecursionError:
        raise error(f"{where}: JSON nested too deeply to read (expected at most {MAX_DEPTH} levels)") from None
    except json.JSONDecodeError as exc:
        raise error(f"{where}: invalid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from None
    except UnicodeDecodeError as exc:
        raise error(f"{where}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at position {exc.start})") from None
    if max_depth is not None and _too_deep(value, max_depth):
        raise error(f"{where}: JSON nested more than {max_depth} levels deep (expected a few levels of keys)")
    if expect is not None and not isinstance(value, expect):
        raise error(f"{where}: expected {KINDS.get(expect, expect.__name__)}, got {kind_of(value)}")
    return value


def read_json(file: Path, error: type[TfkitError] = DataError, *, expect: type | None = dict,
              max_depth: int | None = MAX_DEPTH) -> Any:
    """The JSON value of `file` (a JSON object unless `expect` says otherwise), or `error` naming the file."""
    try:
        data = file.read_bytes()
    except OSError as exc:
        raise error(f"{file}: cannot read it ({exc.strerror or exc})") from None
    return parse_json(data, file, error, expect=expect, max_depth=max_depth)


def member(folder: Path, name: Any, listed_in: Path, error: type[TfkitError] = DataError) -> Path:
    """`folder / name` for a file that a JSON file of `folder` lists (an HF shard index's weight_map, a
    datasets state.json's shards), or `error`: a downloaded folder may only read files inside itself, so
    the name must be a relative path without `..` (a symlink in the folder, as the HF cache makes them,
    is followed like any file there)."""
    if not isinstance(name, str) or not name.strip():
        raise error(f"{listed_in}: lists {name!r} as a file, expected a file name")
    path = Path(name)
    if path.is_absolute() or ".." in path.parts or ":" in path.parts[0]:
        raise error(f"{listed_in}: lists {name!r}, outside the folder {folder}; only files inside it are read")
    return folder / path
