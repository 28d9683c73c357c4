"""A command SIGKILLed at a named file-system step: the step is a mutation (Python's audit hook: an open for
writing, mkdir, rename, remove, rmtree, link) whose path holds a text, so a case names where it kills (in
best/'s staging, right after a checkpoint is published) rather than a count that shifts as the code changes."""

from __future__ import annotations

import os
import signal
import sys

import torch

from fault_helpers import cli

MUTATIONS = {"os.rename", "os.replace", "os.remove", "os.rmdir", "os.mkdir", "shutil.rmtree", "os.link"}
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT


def mutated_path(event: str, args: tuple) -> str | None:
    """The path a file-system mutation writes (a rename's destination), None for anything else."""
    if event == "open":
        mode, flags = args[1], args[2]
        writes = (isinstance(mode, str) and any(c in mode for c in "wax+")) or bool(flags & WRITE_FLAGS)
        return str(args[0]) if writes and isinstance(args[0], (str, bytes, os.PathLike)) else None
    if event in ("os.rename", "os.replace"):
        return str(args[1])
    return str(args[0]) if event in MUTATIONS else None


def matches(path: str, needle: str) -> bool:
    """`needle` in `path`; a needle ending in `$` must end it (a rename that publishes that name)."""
    return path.endswith(needle[:-1]) if needle.endswith("$") else needle in path


def killed_at(args: list, needle: str, occurrence: int = 1, later: int = 0) -> bool:
    """Run `tfkit ARGS` in a forked child, SIGKILLed `later` mutations after the `occurrence`-th mutation whose
    path matches `needle`; whether the kill came (False: the command finished first)."""
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            signal.alarm(120)  # a child that hangs fails the case instead of the suite
            torch.set_num_threads(1)  # the parent's OpenMP threads do not exist in the child
            seen, countdown = [0], [None]

            def hook(event, hook_args):
                path = mutated_path(event, hook_args)
                if path is None:
                    return
                if countdown[0] is not None:
                    countdown[0] -= 1
                elif matches(path, needle):
                    seen[0] += 1
                    if seen[0] == occurrence:
                        countdown[0] = later
                if countdown[0] == 0:
                    os.kill(os.getpid(), signal.SIGKILL)

            sys.addaudithook(hook)
            cli(args)
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    return os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
