"""A disk that fills: every command that writes says which path could not be written and what is intact,
exits 2, replaces nothing and leaves no half-written file; a run that filled the disk mid-way resumes.

Two ways to fill it. In-process everywhere: `full_disk` makes every write of this process fail with ENOSPC
once a byte budget is spent (Python files, safetensors and torch.save, which write outside Python's file
objects). On a real small file system where the test runs as root and can mount one: a tmpfs of a few
hundred kB, the way a disk really fills (safetensors' own error, a short write); skipped elsewhere."""

from __future__ import annotations

import builtins
import errno
import io
import json
import os
import shutil
import subprocess
from contextlib import contextmanager

import pytest
import torch
from fault_helpers import assert_one_line_error, changes, cli, snapshot
from safetensors.torch import load_file


FULL = "Error while serializing: I/O error: No space left on device (os error 28)"  # as safetensors says it


class _Budget:
    def __init__(self, limit: int):
        self.left = limit

    def spend(self, n: int) -> None:
        if n > self.left:
            self.left = 0
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # a failed write names no file
        self.left -= n


class _FullFile:
    """A file object whose writes draw on the budget."""

    def __init__(self, inner, budget: _Budget):
        self._inner, self._budget = inner, budget

    def write(self, data):
        self._budget.spend(len(data.encode("utf-8") if isinstance(data, str) else data))
        return self._inner.write(data)

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._inner.close()

    def __iter__(self):
        return iter(self._inner)


@contextmanager
def full_disk(monkeypatch, limit: int = 0):
    """Every write of this process fails with ENOSPC once `limit` bytes are written."""
    budget, real_open = _Budget(limit), io.open

    def open_(file, mode="r", *args, **kwargs):
        handle = real_open(file, mode, *args, **kwargs)
        return _FullFile(handle, budget) if any(c in mode for c in "wax+") else handle

    def checked(real, size_of):
        def call(*args, **kwargs):
            budget.spend(size_of(*args, **kwargs))
            return real(*args, **kwargs)
        return call

    import safetensors.torch as st

    from safetensors import SafetensorError

    def safetensors_full(real):
        def call(obj, filename, *args, **kwargs):
            try:
                budget.spend(4096)
            except OSError:
                raise SafetensorError(FULL) from None
            return real(obj, filename, *args, **kwargs)
        return call

    with monkeypatch.context() as m:
        m.setattr(io, "open", open_)
        m.setattr(builtins, "open", open_)
        m.setattr(torch, "save", checked(torch.save, lambda *a, **k: 4096))
        from tfkit.checkpoints import hf_export, weights

        m.setattr(weights, "save_safetensors_from", safetensors_full(st.save_model))
        m.setattr(hf_export, "save_file", safetensors_full(st.save_file))
        yield budget


def _check_full(result, *expected):
    line = assert_one_line_error(result, "no space left on device", *expected)
    assert "intact" in line, line
    return line


def _no_temporaries(root):
    left = [p for p in root.rglob("*") if ".tmp-" in p.name or ".old-" in p.name]
    assert not left, left


@pytest.fixture
def work(tiny_run, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TFKIT_CACHE", str(tmp_path / ".cache"))
    (tmp_path / "text.txt").write_text("Plain text for the evaluation. " * 400)
    return tmp_path


def test_full_disk_eval_json_keeps_the_earlier_results(work, tiny_run, monkeypatch):
    ckpt = tiny_run[1] / "checkpoints" / "step-4"
    args = ["eval", ckpt, "--data", work / "text.txt", "--max-batches", "1", "--json", work / "results.json"]
    assert cli(args).exit_code == 0
    before = snapshot(work)
    with full_disk(monkeypatch, limit=100):
        _check_full(cli(args), "results.json")
    assert not changes(before, snapshot(work))
    json.loads((work / "results.json").read_text())


COMMANDS = {
    "train-tokenizer": lambda w, run: ["train-tokenizer", w / "text.txt", "--out", w / "out", "--vocab-size", "300",
                                       "-q"],
    "convert": lambda w, run: ["convert-mqa-to-gqa", run, "--kv-heads", "2", "--out", w / "out"],
    "export-hf": lambda w, run: ["export-hf", run, "--out", w / "out"],
    "pretrain-start": lambda w, run: ["pretrain", w / "tiny.yaml", "--run-dir", w / "out"],
}


@pytest.mark.parametrize("limit", [0, 5000], ids=["empty", "nearly-full"])
@pytest.mark.parametrize("command", sorted(COMMANDS), ids=[f"disk-{c}" for c in sorted(COMMANDS)])
def test_a_full_disk_names_the_path_and_leaves_nothing(command, limit, work, tiny_run, monkeypatch):
    shutil.copy(tiny_run[0], work / "tiny.yaml")
    before = snapshot(work)
    with full_disk(monkeypatch, limit=limit):
        _check_full(cli(COMMANDS[command](work, tiny_run[1])))
    assert not (work / "out").exists()
    assert not changes(before, snapshot(work)), changes(before, snapshot(work))


@pytest.mark.parametrize("limit", [0, 300, 7_000, 7_400], ids=lambda n: f"disk-train-tokenizer-force-after-{n}-bytes")
def test_a_full_disk_during_train_tokenizer_force_keeps_the_old_tokenizer_whole(limit, work, monkeypatch):
    """The line says every file that existed before is intact, and it is: the folder is the old tokenizer,
    byte for byte (it used to be replaced file by file, so special_tokens_map.json was already the new one)."""
    args = ["train-tokenizer", work / "text.txt", "--out", work / "out", "--vocab-size", "300", "-q"]
    assert cli(args).exit_code == 0
    before = snapshot(work)
    with full_disk(monkeypatch, limit=limit):
        _check_full(cli([*args[:-3], "--vocab-size", "280", "--force", "-q"]), "every file that existed before is intact")
    assert not changes(before, snapshot(work)), changes(before, snapshot(work))


@pytest.fixture(scope="module")
def hf_folder(tiny_run, tmp_path_factory):
    out = tmp_path_factory.mktemp("hf") / "hf"
    assert cli(["export-hf", tiny_run[1], "--out", out]).exit_code == 0
    return out


@pytest.mark.parametrize("limit", [0, 5000], ids=["empty", "nearly-full"])
def test_full_disk_import_hf(limit, work, hf_folder, monkeypatch):
    before = snapshot(work)
    with full_disk(monkeypatch, limit=limit):
        _check_full(cli(["import-hf", hf_folder, "--out", work / "imported"]))
    assert not changes(before, snapshot(work))


def test_a_disk_filling_mid_run_names_the_intact_checkpoint_and_the_run_resumes_exactly(work, tiny_run, monkeypatch):
    """The disk fills while the step-4 checkpoint is written: step-2 is named intact, and once there is
    room again `--resume auto` ends where the uninterrupted run ended, bit for bit."""
    from tfkit.checkpoints import training
    from tfkit.checkpoints.folders import list_checkpoints

    recipe, reference = tiny_run
    real, calls = training.save_checkpoint, [0]

    def second_save_fills_the_disk(*args, **kwargs):
        calls[0] += 1
        if calls[0] == 2:
            with full_disk(monkeypatch, limit=5_000):
                return real(*args, **kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(training, "save_checkpoint", second_save_fills_the_disk)
    line = _check_full(cli(["pretrain", recipe, "--run-dir", work / "run"]), "step-2")
    monkeypatch.setattr(training, "save_checkpoint", real)
    assert [s for s, _ in list_checkpoints(work / "run")] == [2], line
    _no_temporaries(work / "run")
    result = cli(["pretrain", recipe, "--run-dir", work / "run", "--resume", "auto"])
    assert result.exit_code == 0, result.output
    ours = load_file(str(work / "run" / "checkpoints" / "step-4" / "model.safetensors"))
    theirs = load_file(str(reference / "checkpoints" / "step-4" / "model.safetensors"))
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)


# --- a real small file system ------------------------------------------------------------------------------

@pytest.fixture
def small_disk(tmp_path):
    """A tmpfs of 600 kB mounted in tmp_path (root only, where mount works); unmounted after."""
    mount = tmp_path / "disk"
    mount.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a small file system needs root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=600k", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def _fill(mount, leave: int) -> None:
    free = shutil.disk_usage(mount).free
    with open(mount / "filler", "wb") as f:
        f.write(b"\0" * max(free - leave, 0))


REAL = {
    "convert": lambda d, w, run: ["convert-mqa-to-gqa", run, "--kv-heads", "2", "--out", d / "out"],
    "export-hf": lambda d, w, run: ["export-hf", run, "--out", d / "out"],
    "import-hf": lambda d, w, run: ["import-hf", w / "hf", "--out", d / "out"],
    "train-tokenizer": lambda d, w, run: ["train-tokenizer", w / "text.txt", "--out", d / "out", "--vocab-size",
                                          "300", "-q"],
    "pretrain": lambda d, w, run: ["pretrain", w / "tiny.yaml", "--run-dir", d / "out"],
}


@pytest.mark.parametrize("command", sorted(REAL), ids=[f"tmpfs-{c}" for c in sorted(REAL)])
def test_a_real_full_file_system(command, small_disk, work, tiny_run, hf_folder):
    shutil.copy(tiny_run[0], work / "tiny.yaml")
    shutil.copytree(hf_folder, work / "hf")
    (small_disk / "results.json").write_text("[]\n")
    _fill(small_disk, leave=4_000)
    before = snapshot(small_disk)
    line = assert_one_line_error(cli(REAL[command](small_disk, work, tiny_run[1])), "no space left on device")
    assert str(small_disk) in line and "intact" in line, line
    assert not changes(before, snapshot(small_disk)), changes(before, snapshot(small_disk))


def test_a_real_full_file_system_during_eval_json(small_disk, work, tiny_run):
    ckpt = tiny_run[1] / "checkpoints" / "step-4"
    out = small_disk / "results.json"
    args = ["eval", ckpt, "--data", work / "text.txt", "--max-batches", "1", "--json", out]
    assert cli(args).exit_code == 0
    _fill(small_disk, leave=0)
    before = snapshot(small_disk)
    _check_full(cli(args), "results.json")
    assert not changes(before, snapshot(small_disk))
