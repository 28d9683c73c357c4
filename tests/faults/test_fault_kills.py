"""A command killed while it replaces a folder (SIGKILL at each of its file-system steps): the folder is
the old one or the complete new one, never a mix of the two, and the next command that writes there
clears what the dead process left beside it (its staging folder, the old folder it had set aside) and
never touches a live process's temporaries.

The kill points are generated: the command runs once in a forked child that counts its file-system
mutations (Python's audit hook: opens for writing, mkdir, rename, remove, rmtree, chmod), then once per
kill point in a child that SIGKILLs itself at that mutation, with the atomic exchange of folders both
available and not (the two-rename fallback of other file systems)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from fault_helpers import cli, snapshot

from tfkit import files

WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT
MUTATIONS = {"os.rename", "os.replace", "os.remove", "os.rmdir", "os.mkdir", "shutil.rmtree", "os.chmod", "os.link"}
REPORT = "tokenizer_report.json"  # holds the training time: compared by presence, not content


def _mutates(event: str, args: tuple) -> bool:
    if event == "open":
        mode, flags = args[1], args[2]
        return (isinstance(mode, str) and any(c in mode for c in "wax+")) or bool(flags & WRITE_FLAGS)
    return event in MUTATIONS


def _forked(args: list, kill_at: int | None, exchange: bool) -> int:
    """Run `tfkit ARGS` in a forked child; SIGKILL it at its `kill_at`-th file-system mutation (None: never).
    Returns the number of mutations of a complete run (-1 when it was killed)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            os.close(read)
            signal.alarm(120)  # a child that hangs (a lock held by a thread of the parent) fails the case instead
            torch.set_num_threads(1)  # no OpenMP team: the parent's threads do not exist in the child
            seen = [0]

            def hook(event, hook_args):
                if _mutates(event, hook_args):
                    seen[0] += 1
                    if seen[0] == kill_at:
                        os.kill(os.getpid(), signal.SIGKILL)

            if not exchange:
                files.exchange = lambda a, b: False
            sys.addaudithook(hook)
            result = cli(args)
            os.write(write, f"{result.exit_code} {seen[0]}".encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        said = pipe.read()
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        assert os.WTERMSIG(status) == signal.SIGKILL, f"the child died of signal {os.WTERMSIG(status)}"
        return -1
    code, count = map(int, said.split())
    assert code == 0, f"exit {code}"
    return count


# Per command: the arguments that write its old output, then those that replace it with a new one.
def _commands(work: Path, run: Path, hf2: Path, hf4: Path) -> dict:
    step2, step4 = run / "checkpoints" / "step-2", run / "checkpoints" / "step-4"
    text, out = work / "text.txt", work / "out"
    return {
        "train-tokenizer": (["train-tokenizer", text, "--out", out, "--vocab-size", "300", "-q"],
                            ["train-tokenizer", text, "--out", out, "--vocab-size", "320", "-q", "--force"]),
        "convert": (["convert-mqa-to-gqa", step2, "--kv-heads", "2", "--out", out],
                    ["convert-mqa-to-gqa", step4, "--kv-heads", "2", "--out", out, "--force"]),
        "export-hf": (["export-hf", step2, "--out", out], ["export-hf", step4, "--out", out, "--force"]),
        "import-hf": (["import-hf", hf2, "--out", out], ["import-hf", hf4, "--out", out, "--force"]),
    }


POINTS = ("first", "25%", "50%", "75%", "last-3", "last-2", "last")
COMMANDS = ("train-tokenizer", "convert", "export-hf", "import-hf")
CASES = [(c, p, x) for c in COMMANDS for p in POINTS for x in (True, False)]


def _kill_at(point: str, total: int) -> int:
    if point == "first":
        return 1
    if point.startswith("last"):
        return total - int(point[len("last-"):] or 0)
    return max(1, round(total * int(point[:-1]) / 100))


@pytest.fixture(scope="module")
def sources(tiny_run, tmp_path_factory):
    """HF exports of the tiny run's two checkpoints (the inputs of import-hf), each command's work folder
    after its first run (its input and its old output, copied into every case rather than made anew), and
    each command's count of file-system mutations when it replaces its old output."""
    root = tmp_path_factory.mktemp("kills")
    hf2, hf4 = root / "hf2", root / "hf4"
    for step, hf in ((2, hf2), (4, hf4)):
        assert cli(["export-hf", tiny_run[1] / "checkpoints" / f"step-{step}", "--out", hf]).exit_code == 0
    olds = {}
    for command in COMMANDS:
        olds[command] = _work(root / f"old-{command}")
        first, _ = _commands(olds[command], tiny_run[1], hf2, hf4)[command]
        assert cli(first).exit_code == 0
    return hf2, hf4, olds, {}


def _work(tmp_path: Path) -> Path:
    work = tmp_path / "work"
    work.mkdir(parents=True)
    (work / "text.txt").write_text(" ".join(f"word{i % 97} text{i % 13}" for i in range(6000)))
    return work


def _content(out: Path) -> dict[str, str]:
    found = snapshot(out)
    return {k: ("present" if k == REPORT else v) for k, v in found.items()}


def _leftovers(work: Path) -> list[str]:
    return sorted(p.name for p in work.iterdir() if ".tmp-" in p.name or ".old-" in p.name)


@pytest.mark.parametrize(("command", "point", "exchange"), CASES,
                         ids=[f"kill-{c}-at-{p}-{'exchange' if x else 'two-renames'}" for c, p, x in CASES])
def test_a_killed_replacement_leaves_the_old_or_the_new_folder(command, point, exchange, tiny_run, sources, tmp_path,
                                                               monkeypatch):
    monkeypatch.setenv("TFKIT_CACHE", str(tmp_path / ".cache"))
    hf2, hf4, olds, totals = sources
    work = shutil.copytree(olds[command], tmp_path / "work")
    replace = _commands(work, tiny_run[1], hf2, hf4)[command][1]
    old = _content(work / "out")
    key = (command, exchange)
    if key not in totals:  # a complete replacement in another copy of the folder, counted
        count_work = shutil.copytree(olds[command], tmp_path / "count" / "work")
        totals[key] = _forked(_commands(count_work, tiny_run[1], hf2, hf4)[command][1], None, exchange)
    assert _forked(replace, _kill_at(point, totals[key]), exchange) == -1, "not killed"
    killed = _content(work / "out")  # with the exchange, what a reader sees at the kill
    files.remove_stale(work / "out")  # what the next writer does first
    after = _content(work / "out")
    result = cli(replace)
    assert result.exit_code == 0, result.output
    new = _content(work / "out")
    assert after in (old, new), f"a mix of the old and the new folder: {sorted(set(after.items()) ^ set(old.items()))}"
    if exchange:
        assert killed in (old, new), "the folder was missing or mixed at the kill"
    assert _leftovers(work) == [], _leftovers(work)


# --- temporaries of other owners ------------------------------------------------------------------------

def _live_process():
    """A process that lives until the test kills it: it waits for a signal."""
    return subprocess.Popen([sys.executable, "-c", "import signal; signal.pause()"])


OWNERS = ["dead-staging", "dead-old-restored", "dead-old-removed", "live", "other-host", "unknown-owner",
          "dead-file"]


@pytest.mark.parametrize("owner", OWNERS, ids=[f"stale-{o}" for o in OWNERS])
def test_the_next_writer_clears_only_what_dead_processes_left(owner, tmp_path):
    """Temporaries named for a dead process of this host are cleared by the next write of their target
    (a set-aside old folder is put back if nothing replaced it); anyone else's stay."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    live = _live_process()
    try:
        pid = live.pid if owner == "live" else dead.pid
        host = "000000" if owner == "other-host" else files._host()
        out = tmp_path / "out"
        if owner != "dead-old-restored":
            out.mkdir()
            (out / "a.txt").write_text("current")
        kind = "old" if owner.startswith("dead-old") else "tmp"
        name = f".out.{kind}-{pid}-{host}-x1" if owner != "unknown-owner" else ".out.tmp-k3j9x1q"
        left = tmp_path / name
        if owner == "dead-file":
            left.write_text("half")
        else:
            left.mkdir()
            (left / "a.txt").write_text("set aside" if kind == "old" else "half")
        kept = owner in ("live", "other-host", "unknown-owner")
        with files.staged_folder(out) as stage:
            assert left.exists() == kept
            if owner == "dead-old-restored":
                assert (out / "a.txt").read_text() == "set aside"
            (stage / "a.txt").write_text("new")
        assert left.exists() == kept
        assert (out / "a.txt").read_text() == "new"
    finally:
        live.kill()
        live.wait()
