"""Bad input at the command line: one red line naming the culprit, exit code 2, never a traceback."""

import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tfkit.cli.main import app

runner = CliRunner()


def _recipe(tmp_path: Path, text: str) -> str:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    return str(path)


def _checkpoint(tmp_path: Path, weights: bytes | None) -> str:
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "config.json").write_text('{"model": {"arch": "gpt"}}')
    if weights is not None:
        (folder / "model.safetensors").write_bytes(weights)
    return str(folder)


def _jsonl(tmp_path: Path) -> str:
    path = tmp_path / "docs.jsonl"
    path.write_text('{"text": "hello"}\n{"body": "no text field here"}\n')
    return str(path)


def _file(tmp_path: Path) -> Path:
    path = tmp_path / "afile"
    path.write_text("mine")
    return path


CASES = {
    "unknown recipe key": (
        lambda t: ["recipes", "validate", _recipe(t, "train:\n  max_step: 5\n")],
        "train.max_step: unknown key (did you mean 'max_steps'?)",
    ),
    "wrong type": (lambda t: ["recipes", "validate", _recipe(t, "train:\n  batch_size: ten\n")],
                   "train.batch_size: got 'ten', expected an integer"),
    "indivisible heads": (
        lambda t: ["recipes", "validate", "gpt-tiny", "--set", "model.n_kv_heads=3"],
        "model.n_kv_heads",
    ),
    "unknown recipe name": (lambda t: ["pretrain", "gpt-tinyy"], "did you mean 'gpt-tiny'"),
    "yaml syntax": (lambda t: ["recipes", "validate", _recipe(t, "train: [1,\n")], "not valid YAML"),
    "objective vs arch": (
        lambda t: ["recipes", "validate", "gpt-tiny", "--set", "objective.name=mlm"],
        "objective.name: 'mlm' does not train model.arch='gpt'",
    ),
    "malformed --set": (lambda t: ["recipes", "show", "gpt-tiny", "--set", "max_steps"], "expected SECTION.KEY=VALUE"),
    "missing corpus file": (
        lambda t: ["train-tokenizer", str(t / "nope.txt"), "--out", str(t / "tok")],
        "nope.txt",
    ),
    "glob matching nothing": (
        lambda t: ["train-tokenizer", str(t / "*.nothing"), "--out", str(t / "tok")],
        "*.nothing",
    ),
    "jsonl line without the field": (
        lambda t: ["train-tokenizer", _jsonl(t), "--out", str(t / "tok"), "-q"],
        "docs.jsonl:2",
    ),
    "--text-field for plain text": (
        lambda t: ["train-tokenizer", "stdlib:docs:valid", "--out", str(t / "tok"), "--text-field", "body"],
        "--text-field 'body': corpus stdlib:docs:valid has no .json/.jsonl files",
    ),
    "eval --text-field for plain text": (
        lambda t: ["eval", _checkpoint(t, None), "--data", str(_file(t)), "--text-field", "body"],
        "has no .json/.jsonl files, the only ones with fields",
    ),
    "empty corpus path": (
        lambda t: ["train-tokenizer", "", "--out", str(t / "tok")],
        "corpus '': empty path, expected a file, folder, glob or stdlib:docs",
    ),
    "vocab smaller than the alphabet": (
        lambda t: ["train-tokenizer", "stdlib:docs:valid", "--out", str(t / "tok"), "--vocab-size", "50", "-q"],
        "vocab_size",
    ),
    "run folder is a file": (lambda t: ["pretrain", "gpt-tiny", "--run-dir", str(_file(t))], "afile"),
    "tokenizer --out is a file": (
        lambda t: ["train-tokenizer", "stdlib:docs:valid", "--out", str(_file(t))],
        "is a file, expected a folder",
    ),
    "tokenizer --out under a file": (
        lambda t: ["train-tokenizer", "stdlib:docs:valid", "--out", str(_file(t) / "sub")],
        "afile is a file, not a folder",
    ),
    "negative --heldout-chars": (
        lambda t: ["train-tokenizer", "stdlib:docs:valid", "--out", str(t / "tok"), "--heldout-chars", "-5"],
        "--heldout-chars must be >= 0",
    ),
    "missing checkpoint": (lambda t: ["generate", str(t / "no-such-run"), "--prompt", "hi"], "no-such-run"),
    "checkpoint without weights": (
        lambda t: ["eval", _checkpoint(t, None), "--data", "stdlib:docs:valid"],
        "model.safetensors",
    ),
    "corrupt weights": (
        lambda t: ["generate", _checkpoint(t, b"not a safetensors file"), "--prompt", "hi"],
        "model.safetensors",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_gives_one_line_and_exit_code_2(case, tmp_path):
    make_args, expected = CASES[case]
    result = runner.invoke(app, make_args(tmp_path))
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: "), result.stderr
    assert expected in last, last


USAGE_CASES = {
    "missing argument": (["pretrain"], "Missing argument 'recipe'", "tfkit pretrain -h"),
    "unknown option": (["eval", "ckpt", "--bogus", "x"], "No such option: --bogus", "tfkit eval -h"),
    "unknown command": (["pretrian"], "No such command 'pretrian'", "tfkit -h"),
    "not a number": (["convert-mqa-to-gqa", "ckpt", "--kv-heads", "two", "--out", "o"], "'two' is not a valid int",
                     "tfkit convert-mqa-to-gqa -h"),
    "top-level option": (["--bogus", "recipes", "list"], "No such option: --bogus", "tfkit -h"),
    "nested group": (["lab", "run"], "Missing argument 'claim'", "tfkit lab run -h"),
}


@pytest.mark.parametrize("case", sorted(USAGE_CASES))
def test_a_command_line_mistake_is_one_line_and_exit_code_2(case):
    """What the argument parser refuses reads as every other mistake: one line naming it and where the
    usage is, not a usage block and a framed box."""
    args, expected, usage = USAGE_CASES[case]
    result = runner.invoke(app, args, prog_name="tfkit")
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert expected in lines[0] and usage in lines[0], lines[0]


def test_debug_shows_the_traceback_instead(tmp_path):
    result = runner.invoke(app, ["--debug", "recipes", "validate", str(tmp_path / "missing.yaml")])
    assert result.exit_code != 0
    assert type(result.exception).__name__ == "ConfigError"


def test_file_system_errors_are_one_line_naming_the_path(tmp_path, monkeypatch):
    """An OSError no check caught (here export-hf writing under a regular file) still gets the boundary's
    one line, with the path, the OS reason and which component is in the way; --debug re-raises it."""
    import tfkit.checkpoints.hf_export as hf_export
    from tfkit.checkpoints.weights import save_model
    from tfkit.models import ModelConfig, build_model

    def write_under(ckpt, out, force=False, card=None):
        (Path(out) / "config.json").write_text("{}")  # what a converter does once past its own checks

    monkeypatch.setattr(hf_export, "export_hf", write_under)
    save_model(build_model(ModelConfig(vocab_size=50, d_model=16, n_layers=1, n_heads=2)), tmp_path)  # its card is read first
    blocked = _file(tmp_path) / "sub"
    result = runner.invoke(app, ["export-hf", str(tmp_path), "--out", str(blocked)])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert result.stderr.strip().splitlines() == [
        f"error: {blocked / 'config.json'}: Not a directory ({blocked.parent} is a file, not a folder)"]
    debug = runner.invoke(app, ["--debug", "export-hf", str(tmp_path), "--out", str(blocked)])
    assert isinstance(debug.exception, NotADirectoryError)


def test_os_error_line_names_both_paths_and_the_reason(tmp_path):
    from tfkit.cli.main import os_error_line

    afile = _file(tmp_path)
    with pytest.raises(FileExistsError) as exc:
        (afile / "sub").parent.mkdir(parents=True, exist_ok=True)  # what writers of `--out afile/sub` do
    assert os_error_line(exc.value) == f"{afile}: File exists (a file, not a folder)"
    assert os_error_line(PermissionError(13, "Permission denied", "/root/x")) == "/root/x: Permission denied"
    assert os_error_line(OSError(18, "Invalid cross-device link", "a", None, "b")) == \
        "a -> b: Invalid cross-device link"
    assert os_error_line(OSError("no path at all")) == "no path at all"


def test_nothing_is_overwritten_by_a_failed_tokenizer_run(tmp_path):
    out = tmp_path / "tok"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    result = runner.invoke(app, ["train-tokenizer", str(tmp_path / "missing.txt"), "--out", str(out)])
    assert result.exit_code == 2
    assert (out / "keep.txt").read_text() == "mine"
    afile = _file(tmp_path)
    assert runner.invoke(app, ["train-tokenizer", "stdlib:docs:valid", "--out", str(afile)]).exit_code == 2
    assert afile.read_text() == "mine"


def test_help_lists_every_command():
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    for command in ("train-tokenizer", "pretrain", "eval", "generate", "convert-mqa-to-gqa", "import-hf",
                    "export-hf", "recipes"):
        assert command in result.output


def test_version():
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and result.output.startswith("tfkit ")


def test_ctrl_c_while_the_commands_load_exits_130_quietly(monkeypatch, capsys):
    """Importing the commands (torch) takes seconds; a Ctrl-C then must not print an import traceback."""
    import types

    from tfkit.cli import entry

    loading = types.ModuleType("tfkit.cli.main")

    def interrupted(name):
        raise KeyboardInterrupt

    loading.__getattr__ = interrupted  # `from .main import main` is interrupted half-way
    monkeypatch.setitem(sys.modules, "tfkit.cli.main", loading)
    with pytest.raises(SystemExit) as stop:
        entry.run()
    assert stop.value.code == 130
    assert capsys.readouterr().err == ""


def test_tfkit_warnings_are_one_line_without_python_source(tmp_path):
    """A corpus with invalid UTF-8 is trained on (the bytes replaced) and said so in one `warning:` line,
    not in Python's `file.py:163: CorpusWarning: ...` format with a source line, which reads as a crash."""
    corpus = tmp_path / "mixed.txt"
    corpus.write_bytes(b"To be, or not to be: that is the question.\n" * 50 + b"caf\xe9\n")
    result = runner.invoke(app, ["train-tokenizer", str(corpus), "--out", str(tmp_path / "tok"), "--vocab-size",
                                 "300", "-q"])
    assert result.exit_code == 0, result.output
    lines = [line for line in result.stderr.splitlines() if "invalid UTF-8" in line]
    assert lines == [f"warning: corpus {corpus}: 1 invalid UTF-8 byte replaced with U+FFFD, the first at "
                     f"{corpus}:51, byte 4"]
    assert "CorpusWarning" not in result.stderr and ".py:" not in result.stderr
