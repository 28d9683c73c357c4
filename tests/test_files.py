"""files.py: a file or folder tfkit writes is the old one or the complete new one, and a failure leaves
nothing behind beside it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tfkit.files import atomic_file, staged_folder, write_atomic


def test_a_failed_staged_folder_leaves_the_old_folder_and_no_temporary_one(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "kept.txt").write_text("old")
    with pytest.raises(RuntimeError, match="interrupted"):
        with staged_folder(out) as tmp:
            assert tmp.parent == tmp_path and tmp.name.startswith(".out.tmp-")
            (tmp / "new.txt").write_text("half")
            raise RuntimeError("interrupted")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert sorted(p.name for p in out.iterdir()) == ["kept.txt"] and (out / "kept.txt").read_text() == "old"
    with pytest.raises(RuntimeError):
        with staged_folder(tmp_path / "new"):
            raise RuntimeError("interrupted")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_staged_folder_replaces_whole_or_keeps_the_existing_one(tmp_path: Path) -> None:
    out = tmp_path / "out"
    for content in ("first", "second"):
        with staged_folder(out) as tmp:
            (tmp / "a.txt").write_text(content)
    assert [p.name for p in out.iterdir()] == ["a.txt"] and (out / "a.txt").read_text() == "second"
    with staged_folder(out, keep_existing=True) as tmp:  # another process published it first: theirs stays
        (tmp / "b.txt").write_text("mine")
    assert [p.name for p in out.iterdir()] == ["a.txt"] and (out / "a.txt").read_text() == "second"
    with staged_folder(out, keep_existing=True) as tmp:  # ... also when it appears while this one is written
        (tmp / "c.txt").write_text("mine")
        out.rename(tmp_path / "gone")
        (tmp_path / "theirs").mkdir()
        (tmp_path / "theirs" / "t.txt").write_text("theirs")
        (tmp_path / "theirs").rename(out)
    assert [p.name for p in out.iterdir()] == ["t.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gone", "out"]


def test_a_failed_atomic_file_keeps_the_old_file_and_leaves_no_temporary_one(tmp_path: Path) -> None:
    path = tmp_path / "results.json"
    write_atomic(path, "old\n")
    with pytest.raises(OSError):
        with atomic_file(path) as tmp:
            tmp.write_text("half")
            raise OSError("no space left on device")
    assert path.read_text() == "old\n" and [p.name for p in tmp_path.iterdir()] == ["results.json"]
    write_atomic(path, b"new\n")
    assert path.read_bytes() == b"new\n"
