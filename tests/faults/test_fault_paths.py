"""Every command with a path that is missing, of the wrong kind (a file for a folder, a folder for a file),
under a regular file, or empty: one line naming the path, exit code 2, nothing written or changed."""

from __future__ import annotations

import pytest
from fault_helpers import assert_one_line_error, changes, cli, snapshot

# Where a path goes, per command: {NAME} is replaced by the bad path, {CKPT} by the tiny run's last checkpoint,
# {RUN} by its run folder, {RECIPE} by its recipe, {TXT} by a small text file.
COMMANDS = {
    "train-tokenizer corpus": ["train-tokenizer", "{BAD}", "--out", "{NEW}/tok", "--vocab-size", "300", "-q"],
    "train-tokenizer --out": ["train-tokenizer", "{TXT}", "--out", "{BAD}", "--vocab-size", "300", "-q"],
    "pretrain recipe": ["pretrain", "{BAD}"],
    "pretrain --run-dir": ["pretrain", "{RECIPE}", "--run-dir", "{BAD}"],
    "pretrain --resume": ["pretrain", "{RECIPE}", "--run-dir", "{NEW}/run", "--resume", "{BAD}"],
    "eval checkpoint": ["eval", "{BAD}", "--data", "{TXT}"],
    "eval --data": ["eval", "{CKPT}", "--data", "{BAD}"],
    "eval --json": ["eval", "{CKPT}", "--data", "{TXT}", "--json", "{BAD}"],
    "generate checkpoint": ["generate", "{BAD}", "--prompt", "hi", "-n", "2"],
    "convert checkpoint": ["convert-mqa-to-gqa", "{BAD}", "--kv-heads", "2", "--out", "{NEW}/gqa"],
    "convert --out": ["convert-mqa-to-gqa", "{CKPT}", "--kv-heads", "2", "--out", "{BAD}"],
    "import-hf source": ["import-hf", "{BAD}", "--out", "{NEW}/imported"],
    "import-hf --out": ["import-hf", "{HF}", "--out", "{BAD}"],
    "export-hf checkpoint": ["export-hf", "{BAD}", "--out", "{NEW}/hf"],
    "export-hf --out": ["export-hf", "{CKPT}", "--out", "{BAD}"],
    "recipes validate": ["recipes", "validate", "{BAD}"],
    "recipes show": ["recipes", "show", "{BAD}"],
}

# What the bad path is. Inputs get: missing, a folder where a file or checkpoint is expected (or a file where
# a folder is), under a regular file, empty. Outputs get: under a regular file, an existing file (a folder
# is expected), and an existing folder of other things (never replaced).
INPUT_KINDS = ("missing", "wrong-kind", "under-a-file", "empty")
OUTPUT_KINDS = ("under-a-file", "a-file", "foreign-folder")
OUTPUTS = {"train-tokenizer --out", "pretrain --run-dir", "eval --json", "convert --out", "import-hf --out",
           "export-hf --out"}
FILE_INPUTS = {"pretrain recipe", "recipes validate", "recipes show", "eval --data", "train-tokenizer corpus"}

CASES = [(command, kind) for command in COMMANDS
         for kind in (OUTPUT_KINDS if command in OUTPUTS else INPUT_KINDS)]


def _bad_path(kind: str, command: str, tmp_path):
    if kind == "missing":
        return tmp_path / "no-such-thing", "no-such-thing"
    if kind == "empty":
        return "", None
    if kind == "under-a-file":
        (tmp_path / "afile").write_text("mine")
        return tmp_path / "afile" / "sub", "afile"
    if kind == "a-file":
        (tmp_path / "afile").write_text("mine")
        return tmp_path / "afile", "afile"
    if kind == "foreign-folder":
        (tmp_path / "mine").mkdir()
        (tmp_path / "mine" / "notes.txt").write_text("mine")
        return tmp_path / "mine", "mine"
    # wrong-kind: an empty folder where a file is read, a plain file where a folder or checkpoint is
    if command in FILE_INPUTS:
        (tmp_path / "afolder").mkdir()
        return tmp_path / "afolder", "afolder"
    (tmp_path / "afile").write_text("mine")
    return tmp_path / "afile", "afile"


@pytest.fixture(scope="module")
def hf_folder(tiny_run, tmp_path_factory):
    """A HuggingFace folder (export-hf of the tiny run), the input of import-hf."""
    out = tmp_path_factory.mktemp("hf") / "hf"
    result = cli(["export-hf", tiny_run[1], "--out", out])
    assert result.exit_code == 0, result.output
    return out


@pytest.mark.parametrize(("command", "kind"), CASES, ids=[f"{c.replace(' ', '-')}-{k}" for c, k in CASES])
def test_a_bad_path_is_one_line_naming_it(command, kind, tiny_run, hf_folder, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TFKIT_CACHE", str(tmp_path / ".cache"))
    recipe, run = tiny_run
    text = tmp_path / "text.txt"
    text.write_text("Some text to read. " * 200)
    (tmp_path / "new").mkdir()
    bad, named = _bad_path(kind, command, tmp_path)
    values = {"{BAD}": str(bad), "{NEW}": str(tmp_path / "new"), "{CKPT}": str(run / "checkpoints" / "step-4"),
              "{RUN}": str(run), "{RECIPE}": str(recipe), "{TXT}": str(text), "{HF}": str(hf_folder)}
    args = []
    for arg in COMMANDS[command]:
        for key, value in values.items():
            arg = arg.replace(key, value)
        args.append(arg)
    before, run_before = snapshot(tmp_path), snapshot(run)
    line = assert_one_line_error(cli(args))
    if named:
        assert named in line, line
    assert not changes(before, snapshot(tmp_path)), changes(before, snapshot(tmp_path))
    assert snapshot(run) == run_before, "an input changed"
