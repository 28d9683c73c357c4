"""A pretraining run on a list of named, weighted sources (issue 47): start.log and the report list every
source, metrics.jsonl holds each source's validation loss and bits per byte beside the mixed figure, and
those equal `tfkit eval` of the same checkpoint on the same source; `repeat: false` ends the run in one line;
the tokenizer samples its text by the weights; recipes, checkpoints and `tfkit eval --data` take the lists;
the single-corpus form is unchanged."""

from __future__ import annotations

import inspect
import json
import json.decoder
import math
import textwrap
from pathlib import Path

import pytest

from helpers import write_recipe
from tfkit.checkpoints.record import CheckpointRecord
from tfkit.checkpoints.run_record import read_metrics
from tfkit.errors import CheckpointError
from tfkit.evaluation.evaluate import EvalRequest, evaluate_corpora
from tfkit.tokenization.sources import read_sources
from tfkit.trainer.mixing import mixed_texts
from tfkit.trainer.recipe import load_recipe


def cli(args: list):
    from typer.testing import CliRunner

    from tfkit.cli.main import app

    return CliRunner().invoke(app, [str(a) for a in args])


def write_sources(folder: Path, english: str) -> dict[str, Path]:
    """Three small sources and two validation texts: English prose, Python source, a few lines of one kind."""
    code = "\n\n".join(inspect.getsource(m) for m in (json.decoder, textwrap, inspect))
    texts = {"docs": english[:40_000], "code": code[:30_000], "tiny": "A tiny source, read again and again.\n" * 3,
             "docs-valid": english[40_000:44_000], "code-valid": code[30_000:34_000]}
    folder.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, text in texts.items():
        paths[name] = folder / f"{name}.txt"
        paths[name].write_text(text, encoding="utf-8")
    return paths


def mixture_recipe(folder: Path, english: str, docs: dict | None = None, **sections) -> Path:
    p = write_sources(folder / "corpora", english)
    data = {"train": [{"name": "docs", "path": str(p["docs"]), "weight": 0.6, **(docs or {})},
                      {"name": "code", "path": str(p["code"]), "weight": 0.3},
                      {"name": "tiny", "path": str(p["tiny"]), "weight": 0.1}],
            "valid": [{"name": "docs", "path": str(p["docs-valid"])}, {"name": "code", "path": str(p["code-valid"])}]}
    return write_recipe(folder, english, data={**data, **sections.pop("data", {})},
                        **{"eval": {"batches": 100}, **sections})


@pytest.fixture(scope="module")
def mixed_run(english_text, tmp_path_factory):
    folder = tmp_path_factory.mktemp("mixture")
    recipe = mixture_recipe(folder, english_text, train={"max_steps": 8, "eval_every": 4})
    result = cli(["pretrain", recipe, "--run-dir", folder / "run"])
    assert result.exit_code == 0, result.output
    return folder, folder / "run", result.output


def test_start_log_and_report_list_every_source(mixed_run):
    _, run, output = mixed_run
    log = (run / "start.log").read_text()
    assert "3 sources mixed before packing" in log
    for name in ("docs", "code", "tiny"):
        line = next(line for line in log.splitlines() if line.strip().startswith(f"{name}:"))
        assert "documents" in line and "tokens" in line and "asked" in line and "epochs" in line, line
    assert "validation per source (data.valid)" in log
    assert "share realised" in output and "epochs" in output  # the report's sources table
    tiny = next(line for line in output.splitlines() if line.startswith("│ tiny"))
    assert float(tiny.split("│")[-2].strip()) > 1  # about 100 tokens at 10% of 8 x 256: read twice


def test_validation_rows_per_source_equal_tfkit_eval_of_the_same_checkpoint(mixed_run, tmp_path):
    folder, run, _ = mixed_run
    rows = [r for r in read_metrics(run / "metrics.jsonl") if "val_loss" in r]
    assert [r["step"] for r in rows] == [0, 4, 8]
    last = rows[-1]
    for key in ("val_bpb", "val_loss/docs", "val_bpb/docs", "val_loss/code", "val_bpb/code"):
        assert math.isfinite(last[key]), key
    corpora = {name: str(folder / "corpora" / f"{name}-valid.txt") for name in ("docs", "code")}
    scored = evaluate_corpora(run / "checkpoints" / "step-8", corpora,
                              EvalRequest(batch_size=8, cache_dir=tmp_path / "cache", show_progress=False))
    for name in corpora:
        assert last[f"val_loss/{name}"] == pytest.approx(scored[name]["loss"], rel=1e-6)
        assert last[f"val_bpb/{name}"] == pytest.approx(scored[name]["bits_per_byte"], rel=1e-6)
    shares = {"docs": 0.6 / 0.9, "code": 0.3 / 0.9}  # the training weights of the sources validated
    assert last["val_loss"] == pytest.approx(sum(shares[n] * last[f"val_loss/{n}"] for n in shares))


def test_checkpoint_records_the_mixture_and_a_run_from_it_reads_the_same(mixed_run):
    _, run, _ = mixed_run
    record = CheckpointRecord.read(run / "checkpoints" / "step-8")
    assert [s["name"] for s in record.data.train] == ["docs", "code", "tiny"]
    assert record.data.train[0]["weight"] == 0.6 and len(record.data.valid) == 2


def test_a_damaged_source_list_in_config_json_is_refused(mixed_run, tmp_path):
    _, run, _ = mixed_run
    raw = json.loads((run / "checkpoints" / "step-8" / "config.json").read_text())
    raw["data"]["train"][1]["weight"] = -1
    (tmp_path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(CheckpointError, match=r"data.train\[1\] \(code\).weight"):
        CheckpointRecord.read(tmp_path)


def test_repeat_false_ends_the_run_when_the_source_runs_out(english_text, tmp_path):
    recipe = mixture_recipe(tmp_path, english_text, docs={"repeat": False},
                            train={"max_steps": 400, "eval_every": 1000, "save_every": 1000})
    result = cli(["pretrain", recipe, "--run-dir", tmp_path / "run"])
    assert result.exit_code == 0, result.output
    line = next(line for line in result.output.splitlines() if "(repeat: false) runs out after" in line)
    steps = int(line.split("runs out after ")[1].split(" steps")[0].replace(",", ""))
    assert 0 < steps < 400 and f"becomes {steps}" in line
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir())[-1] == f"step-{steps}"


def test_the_old_single_corpus_form_is_unchanged(english_text, tmp_path):
    recipe = write_recipe(tmp_path, english_text, train={"max_steps": 2, "eval_every": 2})
    result = cli(["pretrain", recipe, "--run-dir", tmp_path / "run"])
    assert result.exit_code == 0, result.output
    rows = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if "val_loss" in r]
    assert set(rows[-1]) == {"step", "val_loss", "val_accuracy", "val_ppl", "val_tokens"}
    assert "sources mixed" not in (tmp_path / "run" / "start.log").read_text()
    assert isinstance(CheckpointRecord.read(tmp_path / "run" / "checkpoints" / "step-2").data.train, str)


def test_the_tokenizer_text_is_sampled_by_the_weights(tmp_path):
    for name, line in (("a", "alpha " * 20), ("b", "beta " * 30), ("c", "gamma " * 10)):
        (tmp_path / f"{name}.txt").write_text("\n\n".join(f"{line}{i}" for i in range(50)))
    sources = read_sources([{"name": n, "path": str(tmp_path / f"{n}.txt"), "weight": w}
                            for n, w in (("a", 6), ("b", 3), ("c", 1))], "data.train")
    # each file is one document (a plain text file): several passes over each, interleaved by characters
    chars = {"alpha": 0, "beta": 0, "gamma": 0}
    for text in mixed_texts(sources, 2_000_000):
        chars[text.split()[0]] += len(text)
    total = sum(chars.values())
    assert total >= 2_000_000
    assert [round(chars[k] / total, 2) for k in chars] == [0.6, 0.3, 0.1]
    once = read_sources([{"name": "a", "path": str(tmp_path / "a.txt"), "weight": 1},
                         {"name": "c", "path": str(tmp_path / "c.txt"), "weight": 1, "repeat": False}], "data.train")
    assert sum(len(t) for t in mixed_texts(once, 10_000_000)) < 3 * (tmp_path / "a.txt").stat().st_size


def test_recipes_take_lists_and_say_what_each_source_will_contribute(english_text, tmp_path):
    recipe = mixture_recipe(tmp_path, english_text, data={"train": [
        {"name": "docs", "path": "stdlib:docs:train", "weight": 6},
        {"name": "rare", "path": "stdlib:code", "weight": 0.05}]})
    shown = cli(["recipes", "show", recipe, "--lr-points", "0"])
    assert shown.exit_code == 0, shown.output
    assert "the weights sum to 6.05, not 1" in shown.output
    assert "(under 1%)" in shown.output and "tokens in" in shown.output
    resolved = load_recipe(str(recipe), ["data.train=[{name: a, path: stdlib:docs, weight: 1}]"])
    assert resolved.data.train == [{"name": "a", "path": "stdlib:docs", "weight": 1}]


def test_eval_scores_several_named_corpora_side_by_side(mixed_run, tmp_path, monkeypatch):
    folder, run, _ = mixed_run
    monkeypatch.setenv("TFKIT_CACHE", str(tmp_path / "cache"))
    corpora = folder / "corpora"
    result = cli(["eval", run, "--data", f"docs={corpora / 'docs-valid.txt'}", "--data",
                  f"code={corpora / 'code-valid.txt'}", "--json", tmp_path / "rows.json"])
    assert result.exit_code == 0, result.output
    assert "docs loss" in result.output and "code bits/byte" in result.output
    rows = json.loads((tmp_path / "rows.json").read_text())
    assert [r["name"] for r in rows] == ["docs", "code"]
    twice = cli(["eval", run, "--data", f"docs={corpora / 'docs-valid.txt'}", "--data", "docs=stdlib:docs:valid"])
    assert twice.exit_code == 2 and "given twice" in twice.output


def test_a_resumed_run_says_each_source_share_so_far(mixed_run, tmp_path):
    import shutil

    _, run, _ = mixed_run
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    result = cli(["pretrain", copy / "recipe.yaml", "--run-dir", copy, "--resume", "auto", "--set",
                  "train.max_steps=10"])
    assert result.exit_code == 0, result.output
    line = next(line for line in (copy / "start.log").read_text().splitlines() if "data.train so far" in line)
    assert "docs" in line and "tiny" in line and "epochs" in line, line


def test_a_single_corpus_validates_on_several_named_sources(english_text, tmp_path):
    corpora = write_sources(tmp_path / "corpora", english_text)
    valid = [{"name": "docs", "path": str(corpora["docs-valid"])},
             {"name": "code", "path": str(corpora["code-valid"]), "weight": 3}]
    recipe = write_recipe(tmp_path, english_text, data={"valid": valid}, train={"max_steps": 2, "eval_every": 2})
    result = cli(["pretrain", recipe, "--run-dir", tmp_path / "run"])
    assert result.exit_code == 0, result.output
    row = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if "val_loss" in r][-1]
    assert row["val_loss"] == pytest.approx(0.25 * row["val_loss/docs"] + 0.75 * row["val_loss/code"])
