"""Every command that writes refuses an output that is one of its inputs, `--force` or not: the same path,
a symlink to it, a hard link of it, a path spelled through `..`, a folder that holds it or one inside an
input folder. One line naming the option, exit code 2, the input byte for byte as it was.

The table holds, per command, how its output is made to meet its input (`replacing.check_not_an_input`).
Outputs that already met this rule elsewhere (export-hf, import-hf and convert --out against the
checkpoint, export-gguf inside its input) are tried in test_fault_paths.py and the commands' own tests."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from fault_helpers import assert_one_line_error, cli, snapshot, tiny_recipe

ROWS = "text,label\n" + "".join(f"{'good fine great' if i % 2 else 'bad poor awful'} day {i},{i % 2}\n"
                                for i in range(40))


@pytest.fixture(scope="module")
def classifier(tiny_run, english_text, tmp_path_factory):
    """A classifier fine-tuned for two steps from the tiny run's tokenizer (the checkpoint predict reads)."""
    root = tmp_path_factory.mktemp("classifier")
    (root / "rows.csv").write_text(ROWS)
    recipe = tiny_recipe(root, english_text, model={"n_layers": 1}, tokenizer={"path": str(tiny_run[1] / "tokenizer")},
                         data={"train": str(root / "rows.csv"), "valid": None, "valid_fraction": 0.25},
                         objective={"name": "classify"}, train={"max_steps": 2})
    result = cli(["finetune", recipe, "--run-dir", root / "run"])
    assert result.exit_code == 0, result.output
    return root / "run"


def _link(kind: str, target, at):
    """`at` made to name `target`: a symlink or a hard link."""
    (os.symlink if kind == "symlink" else os.link)(target, at)
    return at


def _results(work):
    """An earlier `tfkit eval --json` file, scored now as a corpus (its text in the checkpoint column)."""
    path = work / "results.json"
    rows = [{"checkpoint": " ".join(["the quick brown fox jumps over the lazy dog"] * 20), "loss": 1.0}] * 4
    path.write_text(json.dumps(rows))
    return path


def _case(case: str, work, run, classifier, recipe):
    """(arguments, the input they must leave as it was, what the line names) of one case."""
    ckpt = run / "checkpoints" / "step-4"
    rows = work / "rows.csv"
    rows.write_text(ROWS)
    corpus = work / "data" / "corpus"
    corpus.mkdir(parents=True)
    (corpus / "a.txt").write_text("Some text to read. " * 400)
    predict = ["predict", classifier, "--data", rows, "--force", "--out"]
    tokenizer = ["train-tokenizer", corpus, "--vocab-size", "300", "-q", "--force", "--out"]
    if case == "predict-out-is-data":
        return [*predict, rows], rows, "--out"
    if case in ("predict-out-symlink-to-data", "predict-out-hardlink-of-data"):
        return [*predict, _link(case.split("-")[2], rows, work / "preds.csv")], rows, "--out"
    if case == "predict-out-through-dotdot":
        (work / "sub").mkdir()
        return [*predict, f"{work}/sub/../rows.csv"], rows, "--out"
    if case in ("eval-json-is-data", "eval-json-symlink-to-data", "eval-json-hardlink-of-data"):
        data = _results(work)
        out = data if case == "eval-json-is-data" else _link(case.split("-")[2], data, work / "r.json")
        return ["eval", ckpt, "--data", data, "--text-field", "checkpoint", "--json", out], data, "--json"
    if case == "train-tokenizer-out-is-corpus":
        return [*tokenizer, corpus], corpus, "--out"
    if case == "train-tokenizer-out-symlink-to-corpus":
        return [*tokenizer, _link("symlink", corpus, work / "tok")], corpus, "--out"
    if case == "train-tokenizer-out-inside-corpus":
        return [*tokenizer, corpus / "tok"], corpus, "--out"
    if case == "train-tokenizer-out-holds-corpus":
        return [*tokenizer, work / "data"], corpus, "--out"
    if case in ("convert-out-holds-eval-data", "convert-out-holds-eval-data-through-a-link"):
        out = work / "gqa"
        assert cli(["convert-mqa-to-gqa", ckpt, "--kv-heads", "2", "--out", out]).exit_code == 0
        shutil.copy(corpus / "a.txt", out / "text.txt")
        data = out / "text.txt" if case.endswith("data") else _link("symlink", out, work / "link") / "text.txt"
        return (["convert-mqa-to-gqa", ckpt, "--kv-heads", "2", "--out", out, "--force", "--eval-data", data],
                out / "text.txt", "--out")
    if case == "pretrain-run-dir-inside-data":
        return (["pretrain", recipe, "--run-dir", corpus / "run", "--set", f"data.train={corpus}", "--set",
                 "data.valid=null"], corpus, "data.train")
    if case == "pretrain-init-from-the-runs-own-best":
        fresh = work / "run"
        shutil.copytree(run / "checkpoints" / "step-2", fresh / "best")
        (fresh / "best" / "trainer_state.pt").unlink()
        return (["pretrain", recipe, "--run-dir", fresh, "--set", f"train.init_from={fresh / 'best'}"],
                fresh / "best", "train.init_from")
    raise AssertionError(case)


CASES = ["predict-out-is-data", "predict-out-symlink-to-data", "predict-out-hardlink-of-data",
         "predict-out-through-dotdot", "eval-json-is-data", "eval-json-symlink-to-data", "eval-json-hardlink-of-data",
         "train-tokenizer-out-is-corpus", "train-tokenizer-out-symlink-to-corpus", "train-tokenizer-out-inside-corpus",
         "train-tokenizer-out-holds-corpus", "convert-out-holds-eval-data",
         "convert-out-holds-eval-data-through-a-link",
         "pretrain-run-dir-inside-data", "pretrain-init-from-the-runs-own-best"]


@pytest.mark.parametrize("case", CASES)
def test_an_output_that_is_an_input_is_refused(case, tiny_run, classifier, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TFKIT_CACHE", str(tmp_path / ".cache"))
    recipe, run = tiny_run
    args, kept, named = _case(case, tmp_path, run, classifier, recipe)
    before = snapshot(kept) if kept.is_dir() else kept.read_bytes()
    assert_one_line_error(cli(args), named, "never")
    assert (snapshot(kept) if kept.is_dir() else kept.read_bytes()) == before, "the input changed"
