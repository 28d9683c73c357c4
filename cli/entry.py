"""The `tfkit` executable and `python -m tfkit`.

Commands import torch only when they run a model, which takes a few seconds; a Ctrl-C in that time would
print Python's import traceback. Here it ends quietly with 130 (128 + SIGINT), as one during a command does, and so
does one while the interpreter shuts down after the command (a second Ctrl-C during a run's last save and exit).
"""

from __future__ import annotations

import os
import signal
import sys


def run() -> None:
    try:
        from .main import main
    except KeyboardInterrupt:
        sys.exit(130)
    try:
        main()
    finally:  # the command is done: a Ctrl-C during the interpreter's shutdown (torch's exit hooks) ends it at once
        signal.signal(signal.SIGINT, _exit_130)


def _exit_130(signum, frame) -> None:
    os._exit(130)
