"""`--json OUT` of the evaluation commands: the result rows written as one JSON list, all or nothing."""

from __future__ import annotations

import json
import math
from pathlib import Path

from rich.console import Console

from ..files import write_atomic

err = Console(stderr=True, highlight=False, soft_wrap=True)


def json_safe(row: dict) -> dict:
    """The row with NaN/inf (a diverged checkpoint's loss) as null: JSON has no such numbers, and
    `json.dumps` would write a bare NaN that strict readers (jq, JavaScript) reject."""
    return {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in row.items()}


def write_rows(path: Path, rows: list[dict]) -> None:
    """The rows as `path` (its folder made if needed; replaced atomically), and a line saying so."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps([json_safe(r) for r in rows], indent=2) + "\n")
    err.print(f"wrote {path}")
