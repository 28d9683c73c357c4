"""Checkpoints an earlier tfkit wrote still load, resume, score and export: tests/data/checkpoints-cd30549 holds a
training run (with best/), its MQA conversion and a classifier fine-tuned from it, all made by tfkit at commit
cd30549 (make.sh there says how), before config.json had a type. Every one of their config.json files reads into
a CheckpointRecord and writes back the same JSON (model keys added since then, e.g. shared_kv, at their defaults)."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from tfkit.checkpoints.folders import list_checkpoints, resolve_checkpoint
from tfkit.checkpoints.record import CheckpointRecord
from tfkit.checkpoints.trainer_state import load_trainer_state
from tfkit.checkpoints.weights import load_classifier, load_model
from tfkit.cli.main import app
from tfkit.errors import CheckpointError
from tfkit.models import ModelConfig

ROOT = Path(__file__).resolve().parents[1]
OLD = ROOT / "tests" / "data" / "checkpoints-cd30549"
runner = CliRunner()


def test_every_config_json_reads_as_a_record_and_writes_back_the_same_json():
    files = sorted(OLD.rglob("config.json"))
    assert len(files) == 6, files  # gpt-run: step-2, step-4, best/; gpt-mqa; classifier-run: step-2, best/
    for file in files:
        written, old = json.loads(CheckpointRecord.read(file.parent).to_json()), json.loads(file.read_text())
        added = set(written["model"]) - set(old["model"])  # model keys added since cd30549: at their defaults
        assert all(written["model"].pop(k) == ModelConfig.__dataclass_fields__[k].default for k in added), added
        assert written == old, file


def test_the_records_say_what_each_checkpoint_is():
    run = CheckpointRecord.read(resolve_checkpoint(OLD / "gpt-run"))
    assert (run.step, run.prior_steps, run.objective, run.recipe, run.precision) == (4, 0, "clm", "gpt-tiny", "fp32")
    assert run.data.train == "tests/data/checkpoints-cd30549/corpus.txt" and not run.data.document_mask
    assert CheckpointRecord.read(OLD / "gpt-run" / "best").val_loss > 0
    mqa = CheckpointRecord.read(OLD / "gpt-mqa")
    assert (mqa.step, mqa.prior_steps, mqa.method, mqa.kv_heads_before, mqa.model.kv_heads) == (None, 4, "mean", 2, 1)
    assert mqa.converted_from.endswith("gpt-run/checkpoints/step-4")
    clf = CheckpointRecord.read(resolve_checkpoint(OLD / "classifier-run"))
    assert clf.is_classifier and clf.head.labels == ("hill", "sea") and clf.head.pooling == "mean"
    assert (clf.task.text, clf.task.label, clf.task.metric, clf.total_steps) == ("text", "label", "accuracy", 6)


def test_the_weights_load_and_compute():
    ids = torch.tensor([[5, 17, 42, 9]])
    for folder in (OLD / "gpt-run", OLD / "gpt-mqa"):
        model, cfg = load_model(folder)
        assert torch.isfinite(model(ids)).all() and cfg.vocab_size == 300
    classifier, _ = load_classifier(OLD / "classifier-run")
    assert classifier.head_config.labels == ("hill", "sea")
    for folder in (OLD / "gpt-run", OLD / "classifier-run"):
        state = load_trainer_state(list_checkpoints(folder)[-1][1])
        assert state["state"]["step"] in (2, 4)


def test_an_old_run_resumes_and_its_checkpoints_score_and_export(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)  # the run's recipe names its corpus relative to the repository root
    run = tmp_path / "gpt-run"
    shutil.copytree(OLD / "gpt-run", run)
    resumed = runner.invoke(app, ["pretrain", str(run / "recipe.yaml"), "--resume", "auto", "--run-dir", str(run),
                                  "--set", "train.max_steps=6"])
    assert resumed.exit_code == 0, resumed.output
    assert [step for step, _ in list_checkpoints(run)] == [4, 6]
    assert CheckpointRecord.read(run / "checkpoints" / "step-6").step == 6
    scored = runner.invoke(app, ["eval", str(OLD / "gpt-mqa"), "--data", str(OLD / "corpus.txt"), "--max-batches", "1",
                                 "--json", str(tmp_path / "scores.json")])
    assert scored.exit_code == 0, scored.output
    assert json.loads((tmp_path / "scores.json").read_text())[0]["prior_steps"] == 4
    labelled = runner.invoke(app, ["eval", str(OLD / "classifier-run"), "--data", str(OLD / "labels.csv")])
    assert labelled.exit_code == 0, labelled.output
    exported = runner.invoke(app, ["export-hf", str(OLD / "gpt-run"), "--out", str(tmp_path / "hf")])
    assert exported.exit_code == 0, exported.output
    assert "- Steps: 4" in (tmp_path / "hf" / "README.md").read_text()


@pytest.mark.parametrize("key, value, expected", [
    ("step", "4", "'step' is '4', expected an integer or null"),
    ("prior_steps", -1, "'prior_steps' is -1, expected a non-negative integer"),
    ("data", [], "'data' is [], expected a JSON object"),
    ("pair_fields", ["source"], "'pair_fields' is ['source'], expected two field names"),
])
def test_a_damaged_fact_is_refused_naming_the_file_and_key(tmp_path, key, value, expected):
    folder = tmp_path / "ckpt"
    shutil.copytree(OLD / "gpt-run" / "best", folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, key: value}))
    with pytest.raises(CheckpointError) as err:
        CheckpointRecord.read(folder)
    assert str(err.value).startswith(f"{folder / 'config.json'}: {expected}")
