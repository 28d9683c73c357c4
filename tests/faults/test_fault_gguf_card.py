"""An export-gguf file and its model card are one unit: several exports into one folder keep one card each
(`a.gguf` -> `a.README.md`), each file carries its own card inside (`tfkit.model_card`), and a replacement
SIGKILLed at any of its steps leaves the file old or new with its own card, and beside it that card or none,
never the card of another file."""

from __future__ import annotations

import shutil

import pytest
from fault_helpers import cli
from kill_points import killed_at

gguf = pytest.importorskip("gguf")  # the export extra; the test extra installs it

CARD_KEY = "tfkit.model_card"


def _inside(path) -> str | None:
    field = gguf.GGUFReader(path).get_field(CARD_KEY)
    return None if field is None else bytes(field.parts[field.data[0]]).decode("utf-8")


def _beside(path):
    card = path.with_name(path.name.removesuffix(".gguf") + ".README.md")
    return card.read_text(encoding="utf-8") if card.exists() else None


def _export(ckpt, out, *extra):
    result = cli(["export-gguf", ckpt, "--out", out, *extra])
    assert result.exit_code == 0, result.output
    return out


def test_two_exports_into_one_folder_keep_a_card_each(tiny_run, tmp_path):
    run = tiny_run[1]
    a = _export(run / "checkpoints" / "step-2", tmp_path / "d" / "a.gguf")
    card_a = _beside(a)
    b = _export(run / "checkpoints" / "step-4", tmp_path / "d" / "b.gguf", "--dtype", "f32")
    assert _beside(a) == card_a == _inside(a) and "llama-cli -m a.gguf" in card_a
    assert _beside(b) == _inside(b) and "llama-cli -m b.gguf" in _beside(b) and _beside(b) != card_a
    assert not (tmp_path / "d" / "README.md").exists()


# the replacement's steps: the new file's temporary, the old card's removal, the rename that publishes the
# new file, the new card's temporary and its rename
POINTS = {"in-the-file-temporary": (".a.gguf.tmp-", 1, 0), "at-the-old-card-removal": ("/a.README.md$", 1, 0),
          "at-the-file-rename": ("/a.gguf$", 1, 0), "after-the-file-rename": ("/a.gguf$", 1, 1),
          "at-the-card-rename": ("/a.README.md$", 2, 0)}


@pytest.mark.parametrize("point", list(POINTS), ids=[f"kill-{p}" for p in POINTS])
def test_a_killed_replacement_never_leaves_a_file_beside_another_files_card(point, tiny_run, tmp_path, monkeypatch):
    monkeypatch.setenv("TFKIT_CACHE", str(tmp_path / ".cache"))
    run = tiny_run[1]
    old = _export(run / "checkpoints" / "step-2", tmp_path / "old" / "a.gguf")
    work = shutil.copytree(old.parent, tmp_path / "d")
    a = work / "a.gguf"
    replace = ["export-gguf", run / "checkpoints" / "step-4", "--out", a, "--force", "--dtype", "f32"]
    new = _export(run / "checkpoints" / "step-4", tmp_path / "new" / "a.gguf", "--dtype", "f32")
    assert killed_at(replace, *POINTS[point]), "not killed"
    assert a.read_bytes() in (old.read_bytes(), new.read_bytes()), "a mix of the old and the new file"
    assert _inside(a) is not None, "the file carries no card"
    assert _beside(a) in (None, _inside(a)), "the card beside the file is another file's"
    _export(run / "checkpoints" / "step-4", a, "--force", "--dtype", "f32")  # the next export makes it whole
    assert a.read_bytes() == new.read_bytes() and _beside(a) == _inside(a)
    assert sorted(p.name for p in work.iterdir()) == ["a.README.md", "a.gguf"]
