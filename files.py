"""How tfkit writes to disk: nothing the user had is lost, nothing half-written is left behind.

Every file tfkit replaces is written under a temporary name beside it and renamed over it
(`atomic_file`, `write_atomic`); every folder it publishes (checkpoints, tokenizers, token shards,
converted and exported models) is filled as a temporary sibling and renamed into place whole
(`staged_folder`). A rename within one file system is atomic, so a reader, a killed process or a full
disk sees the old file or folder or the complete new one, never a mix.

What is published gets the permissions of a plain mkdir or open (`share_like_mkdir`): `tempfile.mkdtemp`
makes folders 0700 and safetensors writes files 0600, which would leave a model on a shared machine
unreadable to everyone but its author.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
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


def fsync_tree(folder: Path) -> None:
    """Flush every file of `folder` and the folder entry itself to the disk (a checkpoint must survive a
    power cut, not only a killed process); a no-op where the file system does not support it."""
    for path in folder.iterdir():
        if path.is_file():
            with path.open("rb") as f:
                os.fsync(f.fileno())
    fsync_dir(folder)


def fsync_dir(folder: Path) -> None:
    """Make a rename or a new entry in `folder` durable."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextmanager
def atomic_file(path: Path) -> Iterator[Path]:
    """A temporary path beside `path` for the block to write; renamed over `path` when the block succeeds,
    removed when it fails, so `path` is always the old file or the complete new one."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{time.monotonic_ns()}")
    try:
        yield tmp
        share_like_mkdir(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_atomic(path: Path, data: str | bytes) -> None:
    """Replace `path` with `data` (text as UTF-8) atomically."""
    with atomic_file(path) as tmp:
        tmp.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)


@contextmanager
def staged_folder(out: Path, *, keep_existing: bool = False, durable: bool = False) -> Iterator[Path]:
    """A new, empty temporary folder beside `out` for the block to fill; when the block succeeds it becomes
    `out` in one rename, when it fails it is removed.

    An existing `out` is set aside first and deleted only once the new folder stands (the caller decided
    it may be replaced), or, with `keep_existing`, left as it is and the new folder dropped: another
    process published the same content first (a shared cache). `durable` flushes the files to the disk
    before the rename (checkpoints)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        yield tmp
        share_like_mkdir(tmp)
        if durable:
            fsync_tree(tmp)
        if not out.exists():
            tmp.rename(out)
        elif not keep_existing:
            trash = out.with_name(f".{out.name}.old-{time.time_ns()}")
            out.rename(trash)
            tmp.rename(out)
            if trash.is_dir():
                shutil.rmtree(trash)
            else:
                trash.unlink()
        if durable:
            fsync_dir(out.parent)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
