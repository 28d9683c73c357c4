"""The `tfkit` executable and `python -m tfkit`.

Commands import torch only when they run a model, which takes a few seconds; a Ctrl-C in that time would
print Python's import traceback. Here it ends quietly with 130 (128 + SIGINT), as one during a command does.
"""

from __future__ import annotations

import sys


def run() -> None:
    try:
        from .main import main
    except KeyboardInterrupt:
        sys.exit(130)
    main()
