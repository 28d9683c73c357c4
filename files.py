"""How tfkit writes to disk: nothing the user had is lost, nothing half-written is left behind.

Every file tfkit replaces is written under a temporary name beside it and renamed over it
(`atomic_file`, `write_atomic`); every folder it publishes (checkpoints, tokenizers, token shards,
converted and exported models) is filled as a temporary sibling and renamed into place whole
(`staged_folder`). A rename within one file system is atomic, so a reader, a killed process or a full
disk sees the old file or folder or the complete new one, never a mix.

Every temporary name carries its owner: `.NAME.tmp-PID-HOST-...` (and `.NAME.old-PID-HOST-...` for a
folder set aside while it is replaced). A process killed mid-write (SIGKILL, a power cut) cannot clean
up after itself, so the next write to NAME does (`remove_stale`): what a dead process of this host left is
removed, a set-aside old folder is put back where the new one never arrived, and a live process's
temporaries are never touched. An existing folder is swapped for the new one in one atomic exchange
(`renameat2(RENAME_EXCHANGE)`) where the file system has it, so even a reader never sees it missing.

What is published gets the permissions of a plain mkdir or open (`share_like_mkdir`): `tempfile.mkdtemp`
makes folders 0700 and safetensors writes files 0600, which would leave a model on a shared machine
unreadable to everyone but its author.

What an output folder may replace is decided before any work, in replacing.py.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import hashlib
import os
import re
import shutil
import socket
import tempfile
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from .errors import CheckpointError


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
    where it goes: the existing file itself, or the folder that will hold it (an existing file or folder
    is replaced by a rename there too: `atomic_file`, `staged_folder`)."""
    target = path.absolute()
    existing = next(p for p in (target, *target.parents) if p.exists())  # the nearest thing already there
    if existing != target and not existing.is_dir():
        return f"{existing} is a file, not a folder"
    if existing == target and not target.is_dir() and not os.access(target, os.W_OK):
        return f"no permission to write {target}"
    where = target.parent if existing == target else existing  # new entries and renames are made in this folder
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


@functools.cache
def _host() -> str:
    """A short tag of this machine, in temporary names: a pid says whether its process lives only on the
    host that made it (a folder on a shared file system is written from several)."""
    return hashlib.sha256(socket.gethostname().encode()).hexdigest()[:6]


def _owner_tag() -> str:
    return f"{os.getpid()}-{_host()}"


def _is_alive(pid: int) -> bool:
    """Whether process `pid` of this host exists (a process of another user counts: it may not be touched)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def remove_stale(target: Path) -> None:
    """Clear what dead processes of this host left beside `target` while writing it: their temporary
    files and staging folders `.NAME.tmp-PID-HOST-*` are removed; a folder they set aside to replace
    (`.NAME.old-PID-HOST-*`) is put back when no `target` took its place (they died between the two
    renames), else removed. Temporaries of live processes, other hosts and unknown owners stay."""
    pattern = re.compile(rf"\.{re.escape(target.name)}\.(tmp|old)-(\d+)-{_host()}-")
    try:
        entries = list(target.parent.iterdir())
    except OSError:
        return
    for entry in sorted(entries, key=lambda e: e.name):
        found = pattern.match(entry.name)
        if found is None or _is_alive(int(found.group(2))):
            continue
        try:
            if found.group(1) == "old" and not os.path.lexists(target):
                entry.rename(target)
            else:
                _remove(entry)
        except OSError:  # another process cleared it first
            pass


@functools.cache
def _renameat2():
    """libc's renameat2, or None (not Linux, or a C library without it)."""
    try:
        function = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    return function


def exchange(a: Path, b: Path) -> bool:
    """Swap the entries `a` and `b` in one atomic step (Linux `renameat2(RENAME_EXCHANGE)`); False, with
    nothing changed, where the system or the file system cannot."""
    function = _renameat2()
    if function is None:
        return False
    at_fdcwd, rename_exchange = -100, 2
    if function(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EPERM):
        return False
    raise OSError(code, os.strerror(code), str(a), None, str(b))


@contextmanager
def atomic_file(path: Path) -> Iterator[Path]:
    """A temporary path beside `path` for the block to write; renamed over `path` when the block succeeds,
    removed when it fails, so `path` is always the old file or the complete new one. The new file is
    flushed to the disk before the rename: a file system that reports a full disk only when the data is
    written back (NFS, some FUSE mounts) fails here, before the old file is replaced."""
    remove_stale(path)
    tmp = path.with_name(f".{path.name}.tmp-{_owner_tag()}-{time.monotonic_ns()}")
    try:
        yield tmp
        share_like_mkdir(tmp)
        with tmp.open("rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        raise_named(exc, path)
    finally:
        tmp.unlink(missing_ok=True)


def raise_named(exc: OSError, path: Path, staging: Path | None = None) -> None:
    """Raise `exc`, naming `path` (the file or folder being written) when it names no file, or only names in
    the temporary `staging` folder: a failed write or flush names none ("[Errno 28] No space left on
    device"), a failed copy names its source first, and the user must know where."""
    named = [str(n) for n in (exc.filename, exc.filename2) if n is not None]
    in_staging = staging is not None and any(n.startswith(str(staging)) for n in named)
    if (named and not in_staging) or exc.errno is None:
        raise exc
    raise type(exc)(exc.errno, exc.strerror or os.strerror(exc.errno), str(path)) from exc


def write_atomic(path: Path, data: str | bytes) -> None:
    """Replace `path` with `data` (text as UTF-8) atomically; a short write (a full disk) raises before
    anything is replaced."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    with atomic_file(path) as tmp:
        tmp.write_bytes(raw)
        if tmp.stat().st_size != len(raw):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))


def set_aside(folder: Path, name: str) -> Path:
    """Rename `folder` to `name` beside it (replacing an earlier folder of that name): kept for inspection
    under a name no reader takes for the original (a diverged checkpoint, `checkpoints/diverged-step-N`)."""
    target = folder.with_name(name)
    if target.exists():
        shutil.rmtree(target, ignore_errors=True)
    folder.rename(target)
    return target


def is_disk_full(exc: BaseException) -> bool:
    """Whether `exc` says the disk (or the user's quota) is full."""
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)


LOCK_FILE = ".tfkit.lock"  # in a run folder: held (flock) by the process training into it


@contextmanager
def folder_lock(folder: Path, what: str = "run folder") -> Iterator[Path]:
    """Hold an exclusive advisory lock (`fcntl.flock`) on `folder/.tfkit.lock` for the block, or raise a
    CheckpointError at once when another process holds it. The kernel drops the lock when its holder
    exits, however it exits, so a lock file left by a killed process never blocks anyone; the file itself
    stays (removing it would race with a process that just opened it)."""
    import fcntl

    path = folder / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip()
            pid = f" (pid {holder})" if holder.isdigit() else ""
            raise CheckpointError(f"{what} {folder}: in use by another tfkit process{pid}; wait for it to finish, or "
                                  "choose another --run-dir") from None
        try:  # who holds it, for the refusal above; a full disk must not stop the run for this
            os.ftruncate(fd, 0)
            os.pwrite(fd, str(os.getpid()).encode(), 0)
        except OSError:
            pass
        yield path
    finally:
        os.close(fd)  # closing the descriptor releases the lock


@contextmanager
def staged_folder(out: Path, *, keep_existing: bool = False, durable: bool = False) -> Iterator[Path]:
    """A new, empty temporary folder beside `out` for the block to fill; when the block succeeds it becomes
    `out` whole, when it fails it is removed (what dead processes left beside `out` is cleared first:
    `remove_stale`).

    An existing `out` is replaced (the caller decided it may be) in one atomic exchange, or where the file
    system has none, set aside and deleted once the new folder stands; with `keep_existing` it is left as
    it is and the new folder dropped: another process published the same content first, even while this
    one was being written (a shared cache; an empty folder holds nothing to keep and is replaced).
    `durable` flushes the files to the disk before the rename (checkpoints)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_stale(out)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-{_owner_tag()}-", dir=out.parent))
    try:
        try:
            yield tmp
        except OSError as exc:
            raise_named(exc, out, tmp)
        share_like_mkdir(tmp)
        if durable:
            fsync_tree(tmp)
        _publish(tmp, out, keep_existing)
        if durable:
            fsync_dir(out.parent)
    finally:
        _remove(tmp)  # after an exchange: the old folder


def holds_working_folder(folder: Path) -> bool:
    """Whether `folder` is the working folder or one that holds it: renaming it would move the shell's
    working folder away (`--out .`), so it is never replaced whole (`write_files_into`)."""
    cwd = Path.cwd().resolve()
    target = folder.resolve()
    return target == cwd or target in cwd.parents


def write_files_into(folder: Path, files: dict[str, bytes]) -> None:
    """Replace the named files of a folder that cannot be replaced whole (`holds_working_folder`): every
    new file is written and flushed under a temporary name first, then each is renamed over the old one.
    A full disk or a write error thus changes nothing; only a kill within the last few renames can leave
    some files old and some new."""
    staged: dict[str, Path] = {}
    name = next(iter(files), "")
    try:
        for name, data in files.items():
            tmp = staged[name] = folder / f".{name}.tmp-{_owner_tag()}-{time.monotonic_ns()}"
            tmp.write_bytes(data)
            if tmp.stat().st_size != len(data):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            share_like_mkdir(tmp)
            with tmp.open("rb") as f:
                os.fsync(f.fileno())
        for name, tmp in staged.items():
            os.replace(tmp, folder / name)
    except OSError as exc:
        raise_named(exc, folder / name)
    finally:
        for tmp in staged.values():
            tmp.unlink(missing_ok=True)


def carry_over(out: Path, staging: Path, replaced: Iterable[str]) -> None:
    """Put into `staging` everything the existing folder `out` holds except the entries named `replaced`
    (the new files), so that publishing `staging` whole keeps the rest (a model's weights beside its
    tokenizer, a tokenizer's report, the user's notes)."""
    if out.is_dir():
        for entry in out.iterdir():
            if entry.name not in replaced:
                link_or_copy(entry, staging / entry.name)


def link_or_copy(source: Path, target: Path) -> None:
    """Put `source` (a file or a folder tree) at `target` by hard links where the file system allows them
    (no data is copied; nothing tfkit writes is ever changed in place), else by copies."""
    def one(src: str, dst: str) -> None:
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    if source.is_dir() and not source.is_symlink():
        shutil.copytree(source, target, symlinks=True, copy_function=one)
    elif source.is_symlink():
        os.symlink(os.readlink(source), target)
    else:
        one(str(source), str(target))


def _publish(tmp: Path, out: Path, keep_existing: bool) -> None:
    """Make the filled folder `tmp` be `out` (staged_folder); after an exchange `tmp` holds the old `out`."""
    if keep_existing:
        try:
            tmp.rename(out)  # replaces at most an empty folder
        except OSError:
            if not out.exists():
                raise  # anything but "another process published it first"
    elif not os.path.lexists(out):
        tmp.rename(out)
    elif not exchange(tmp, out):
        trash = out.with_name(f".{out.name}.old-{_owner_tag()}-{time.time_ns()}")
        out.rename(trash)
        tmp.rename(out)  # killed just before: the next write puts `trash` back (remove_stale)
        _remove(trash)
