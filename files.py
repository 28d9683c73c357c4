"""Permissions of what tfkit publishes: what a plain mkdir or open would give, whatever wrote it.

Every output (checkpoints, tokenizers, token shards, exported models) is written into a temporary
folder and renamed into place, so a killed process never leaves half a folder. `tempfile.mkdtemp`
makes those folders 0700, and safetensors writes its files 0600, so without this step a model
published on a shared machine would be unreadable to everyone but its author.
"""

from __future__ import annotations

import os
from pathlib import Path


def share_like_mkdir(root: Path) -> None:
    """Give `root` and everything in it the permissions of a plain mkdir/open: 0777/0666 less the umask."""
    mask = os.umask(0)
    os.umask(mask)
    for path in [root, *root.rglob("*")]:
        if not path.is_symlink():
            os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~mask)


def write_problem(path: Path) -> str | None:
    """Why `path` cannot be written, checked before the work that would write it; None when it can.

    A regular file where a folder of its path should be (`notes.txt/out`), or no permission to write
    where it goes: in the folder that will hold it, or the existing file itself."""
    target = path.absolute()
    existing = next(p for p in (target, *target.parents) if p.exists())  # the nearest thing already there
    if existing != target and not existing.is_dir():
        return f"{existing} is a file, not a folder"
    if existing == target and not target.is_dir():
        return None if os.access(target, os.W_OK) else f"no permission to write {target}"
    where = target.parent if existing == target else existing  # new entries are made in this folder
    return None if os.access(where, os.W_OK | os.X_OK) else f"no permission to write in {where}"
