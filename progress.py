"""Output for a person at a terminal, and plain lines for a file: progress bars and rich consoles.

A tqdm bar redraws itself with carriage returns; written to a file (CI, `> log.txt`, `nohup`) every frame
stays, and a quickstart log was 13 KB of them. So bars are drawn only on a terminal or in a notebook;
elsewhere the callers' own log lines (training rows, "data: N tokens", the eval table) are the record.
A rich console off a terminal wraps at 80 columns, mid-path (breaking grep) and mid-value (breaking the
YAML of `tfkit recipes show NAME > my.yaml`), so every console comes from `console()`, which never wraps.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console
    from tqdm import tqdm


def interactive() -> bool:
    """True when stderr is a terminal or a notebook kernel runs us (tqdm.auto draws widgets there)."""
    return sys.stderr.isatty() or "ipykernel" in sys.modules


def progress_bar(*, enabled: bool = True, **kwargs: Any) -> tqdm:
    """A tqdm bar (same keywords), disabled when not `enabled` or not `interactive()`."""
    from tqdm.auto import tqdm  # imported on first use: it pulls in asyncio, 65 ms of CLI start-up

    return tqdm(disable=not (enabled and interactive()), **kwargs)


def console(stderr: bool = False) -> Console:
    """A rich console that never wraps what it prints; tables take the terminal's width, or 200 columns
    in a file (wide enough for every table tfkit prints)."""
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    return Console(stderr=stderr, soft_wrap=True, highlight=False, width=None if stream.isatty() else 200)


class Transcript:
    """A console whose printed lines are also kept as plain text: the start-of-run block is shown and
    written to the run folder from one source, so what the user saw and what the folder keeps agree."""

    def __init__(self, console: Console):
        self.console = console
        self.lines: list[str] = []

    def print(self, *objects: Any, **kwargs: Any) -> None:
        from rich.text import Text

        self.console.print(*objects, **kwargs)
        for obj in objects:
            if isinstance(obj, str):
                self.lines.append(Text.from_markup(obj).plain if kwargs.get("markup", True) else obj)


LINE_EVERY_S = 30.0  # off a terminal: seconds between two progress lines


class Progress:
    """Long work counted in steps: a bar with an ETA on a terminal, a plain line every LINE_EVERY_S seconds off
    one (`desc: 12/40 batches, 31 s, about 72 s left`), nothing when not `enabled`. `clock` is for tests."""

    def __init__(self, desc: str, total: int, unit: str, enabled: bool = True, clock=None) -> None:
        import time

        self.desc, self.total, self.unit, self.clock = desc, total, unit, clock or time.monotonic
        self.bar = progress_bar(total=total, unit=unit, desc=desc, enabled=enabled, leave=False)
        self.lines = enabled and not interactive()
        self.done, self.started = 0, self.clock()
        self.last_line = self.started

    def update(self, n: int = 1) -> None:
        self.done += n
        self.bar.update(n)
        now = self.clock()
        if self.lines and now - self.last_line >= LINE_EVERY_S:
            self.last_line = now
            print(self.line(now - self.started), file=sys.stderr, flush=True)

    def line(self, elapsed: float) -> str:
        text = f"{self.desc}: {self.done:,}/{self.total:,} {self.unit}, {elapsed:.0f} s"
        if 0 < self.done < self.total:
            left = elapsed * (self.total - self.done) / self.done
            text += f", about {left:.0f} s left" if left < 120 else f", about {left / 60:.1f} min left"
        return text

    def close(self) -> None:
        self.bar.close()
