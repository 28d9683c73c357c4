"""Progress bars where a person watches, plain lines everywhere else.

A tqdm bar redraws itself with carriage returns; written to a file (CI, `> log.txt`, `nohup`) every frame
stays, and a quickstart log was 13 KB of them. So bars are drawn only on a terminal or in a notebook;
elsewhere the callers' own log lines (training rows, "data: N tokens", the eval table) are the record.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tqdm import tqdm


def interactive() -> bool:
    """True when stderr is a terminal or a notebook kernel runs us (tqdm.auto draws widgets there)."""
    return sys.stderr.isatty() or "ipykernel" in sys.modules


def progress_bar(*, enabled: bool = True, **kwargs: Any) -> tqdm:
    """A tqdm bar (same keywords), disabled when not `enabled` or not `interactive()`."""
    from tqdm.auto import tqdm  # imported on first use: it pulls in asyncio, 65 ms of CLI start-up

    return tqdm(disable=not (enabled and interactive()), **kwargs)
