"""Progress of scoring one checkpoint: a bar with an ETA on a terminal, a plain line now and then off one.

Scoring a corpus takes minutes per checkpoint on a CPU (three 1M-parameter models on 1.26 MB took 266 s),
so the user must see that it moves and when it ends. On a terminal that is a tqdm bar (progress.py), with
an ETA whenever the number of batches is known. Off a terminal (CI, `2> eval.log`, nohup) a bar draws
nothing, and its frames would flood a log; instead one plain line every `LINE_EVERY_S` seconds says how far
scoring is and, when the end is known (batches, or --max-tokens), about how long is left.
"""

from __future__ import annotations

import sys
import time

from ..progress import interactive, progress_bar

LINE_EVERY_S = 30.0  # off a terminal: seconds between two progress lines


class ScoringProgress:
    """`update(tokens)` after each scored batch; `close()` at the end. Disabled entirely when not `enabled`."""

    def __init__(self, name: str, total_batches: int | None, max_tokens: int | None, enabled: bool) -> None:
        self.name, self.total, self.max_tokens = name, total_batches, max_tokens
        self.bar = progress_bar(total=total_batches, unit="batch", desc=f"eval {name}", enabled=enabled, leave=False)
        self.lines = enabled and not interactive()
        self.batches = self.tokens = 0
        self.started = self.last_line = time.monotonic()

    def update(self, tokens: int) -> None:
        self.batches, self.tokens = self.batches + 1, self.tokens + tokens
        self.bar.update(1)
        now = time.monotonic()
        if self.lines and now - self.last_line >= LINE_EVERY_S:
            self.last_line = now
            print(self.line(now - self.started), file=sys.stderr, flush=True)

    def line(self, elapsed: float) -> str:
        """`eval NAME: 120/900 batches, 61,440 tokens, 40 s, about 4.3 min left` (the ETA when the end is known)."""
        done = f"{self.batches:,}/{self.total:,}" if self.total is not None else f"{self.batches:,}"
        text = f"eval {self.name}: {done} batches, {self.tokens:,} tokens, {elapsed:.0f} s"
        fractions = []
        if self.total:
            fractions.append(self.batches / self.total)
        if self.max_tokens:
            fractions.append(self.tokens / self.max_tokens)
        fraction = min(max(fractions, default=0.0), 1.0)
        if fraction > 0:
            left = elapsed * (1 - fraction) / fraction
            text += f", about {left:.0f} s left" if left < 120 else f", about {left / 60:.1f} min left"
        return text

    def close(self) -> None:
        self.bar.close()
