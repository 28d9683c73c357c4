"""Weighted mixtures of sources (issue 47): bad input is one line, exit 2, nothing lost, before any training;
a three-source run killed at any moment (one source used up and restarted several times during it) is
continued to the same end as the uninterrupted run: the same weights, the same rows, each source's
validation included."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from fault_helpers import assert_one_line_error, changes, cli, snapshot, tiny_recipe
from kill_points import killed_at
from tfkit.checkpoints.run_record import read_metrics

TINY = "A tiny source, read again and again.\n" * 3  # about 70 tokens: a quarter of 8 x 32 tokens a step


def sources(folder: Path, english: str) -> dict[str, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    texts = {"docs": english[:30_000], "prose": english[50_000:70_000], "tiny": TINY,
             "docs-valid": english[40_000:43_000], "prose-valid": english[70_000:73_000]}
    for name, text in texts.items():
        (folder / f"{name}.txt").write_text(text, encoding="utf-8")
    return {name: folder / f"{name}.txt" for name in texts}


def mixture(p: dict[str, Path]) -> dict:
    return {"train": [{"name": "docs", "path": str(p["docs"]), "weight": 0.5},
                      {"name": "prose", "path": str(p["prose"]), "weight": 0.25},
                      {"name": "tiny", "path": str(p["tiny"]), "weight": 0.25}],
            "valid": [{"name": "docs", "path": str(p["docs-valid"])}, {"name": "prose", "path": str(p["prose-valid"])}]}


# --- bad input ---------------------------------------------------------------------------------------------------

def _train(p, **change) -> list:
    """data.train with the tiny source changed (None: removed key)."""
    out = mixture(p)["train"]
    out[2] = {k: v for k, v in {**out[2], **change}.items() if v is not None}
    return out


BAD = {  # name -> (what data.train / the recipe becomes, fragments of the one line)
    "weight-zero": (lambda p: {"train": _train(p, weight=0)}, ["data.train[2] (tiny).weight: got 0"]),
    "weight-negative": (lambda p: {"train": _train(p, weight=-0.1)}, ["data.train[2] (tiny).weight: got -0.1"]),
    "weight-not-a-number": (lambda p: {"train": _train(p, weight="lots")}, ["(tiny).weight: got 'lots'"]),
    "weight-missing": (lambda p: {"train": _train(p, weight=None)}, ["(tiny).weight: missing"]),
    "duplicate-name": (lambda p: {"train": _train(p, name="docs")}, ["data.train[2] (docs)", "given twice"]),
    "name-not-a-word": (lambda p: {"train": _train(p, name="my docs")}, ["data.train[2].name: got 'my docs'"]),
    "unknown-key": (lambda p: {"train": _train(p, wieght=1)}, ["(tiny).wieght: unknown key (did you mean 'weight'?)"]),
    "missing-source": (lambda p: {"train": _train(p, path=str(p["tiny"].parent / "gone.txt"))},
                       ["data.train source tiny (", "gone.txt"]),
    "empty-source": (lambda p: {"train": _train(p, path=str(p["tiny"].parent / "empty.txt"))},
                     ["data.train source tiny (", "empty.txt", "empty"]),
    "utf16-source": (lambda p: {"train": _train(p, path=str(p["tiny"].parent / "utf16.txt"))},
                     ["data.train source tiny (", "utf16.txt", "UTF-16"]),
    "too-small-for-its-validation-share": (lambda p: {"train": _train(p), "valid": None},
                                           ["data.train source tiny (", "validation share", "tokens"]),
    "bad-validation-source": (lambda p: {"valid": [{"name": "docs", "path": str(p["docs-valid"]), "repeat": True}]},
                              ["data.valid[0] (docs).repeat: unknown key"]),
}
ONE_CORPUS = {  # a list under a key that reads one corpus
    "chat": ({"data": {"format": "chat"}}, ["a list of sources", "data.format: chat"]),
    "seq2seq": ({"model": {"arch": "transformer"}, "objective": {"name": "seq2seq"}}, ["objective seq2seq reads one"]),
}


@pytest.mark.parametrize("case", [*BAD, *ONE_CORPUS])
def test_a_bad_mixture_is_refused_in_one_line_before_any_training(case, english_text, tmp_path, monkeypatch):
    work = tmp_path / "work"
    p = sources(work / "corpora", english_text)
    (work / "corpora" / "empty.txt").write_text("  \n\n")
    (work / "corpora" / "utf16.txt").write_bytes(TINY.encode("utf-16"))
    monkeypatch.setenv("TFKIT_CACHE", str(tmp_path / "cache"))
    if case in BAD:
        change, expected = BAD[case]
        recipe = tiny_recipe(tmp_path / "recipe", english_text, data={**mixture(p), **change(p)})
    else:
        sections, expected = ONE_CORPUS[case]
        sections = {**sections, "data": {**mixture(p), **sections.get("data", {})}}
        recipe = tiny_recipe(tmp_path / "recipe", english_text, **sections)
    before = snapshot(work)
    assert_one_line_error(cli(["pretrain", recipe, "--run-dir", work / "run"]), *expected)
    assert not changes(before, snapshot(work)), changes(before, snapshot(work))


def test_finetuning_refuses_a_list_of_sources(english_text, tmp_path):
    p = sources(tmp_path / "corpora", english_text)
    result = cli(["finetune", "finetune-classify", "--run-dir", tmp_path / "run", "--set",
                  "data.train=" + json.dumps(mixture(p)["train"])])
    assert_one_line_error(result, "a list of sources", "objective classify reads one corpus")


# --- killed and continued ------------------------------------------------------------------------------------------

TRAIN = {"max_steps": 4, "eval_every": 1, "save_every": 3, "keep_best": True, "log_every": 1}
POINTS = {  # as test_fault_run_kills.py, and inside the second source's token cache
    "in-the-tokenizer-staging": (".tokenizer.tmp-", 1, 2),
    "in-the-second-source-cache": ("/data/.tokens-", 2, 2),
    "right-after-the-first-best": ("/best$", 1, 1),
    "in-the-first-checkpoint-staging": ("/checkpoints/.step-3.tmp-", 1, 2),
}


@pytest.fixture(scope="module")
def reference(english_text, tmp_path_factory):
    root = tmp_path_factory.mktemp("mixture-kills")
    recipe = tiny_recipe(root, english_text, data=mixture(sources(root / "corpora", english_text)), train=TRAIN)
    result = cli(["pretrain", recipe, "--run-dir", root / "reference"])
    assert result.exit_code == 0, result.output
    tiny = next(line for line in result.output.splitlines() if line.startswith("│ tiny"))
    assert float(tiny.split("│")[-2]) > 1.5, tiny  # the tiny source ran out and started again during the run
    return recipe, root / "reference"


def _rows(run: Path) -> dict:
    return {(r["step"], k): v for r in read_metrics(run / "metrics.jsonl") for k, v in r.items()
            if k == "loss" or k.startswith("val_")}


def _same_weights(a: Path, b: Path) -> bool:
    x, y = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    return x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)


@pytest.mark.parametrize("point", list(POINTS))
def test_a_mixture_run_killed_at_any_moment_is_continued_to_the_same_end(point, reference, tmp_path, monkeypatch):
    monkeypatch.setenv("TFKIT_CACHE", str(tmp_path / ".cache"))
    recipe, done = reference
    run = tmp_path / "run"
    assert killed_at(["pretrain", recipe, "--run-dir", run], *POINTS[point]), "the run was not killed"
    again = ["pretrain", run / "recipe.yaml" if (run / "recipe.yaml").is_file() else recipe, "--run-dir", run,
             "--resume", "auto"]
    result = cli(again)
    assert result.exit_code == 0, result.output
    assert _same_weights(run / "checkpoints" / "step-4", done / "checkpoints" / "step-4")
    assert _same_weights(run / "best", done / "best")
    rows, expected = _rows(run), _rows(done)
    assert rows == expected and (4, "val_loss/tiny") not in rows and (4, "val_bpb/prose") in rows
