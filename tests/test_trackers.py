"""`log.wandb: true`: a run in W&B's offline mode (no account, no network) logs metrics.jsonl's rows, the
resolved recipe as config and the final validation as a table, read back here from the offline run's own
files; without the wandb package the recipe is refused in one line naming the extra, before any work."""

import json
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from tfkit.checkpoints.run_record import read_metrics
from tfkit.cli.main import app
from tfkit.trainer.recipe import load_recipe
from tfkit.trainer.run import pretrain

wandb = pytest.importorskip("wandb")  # the trackers extra; the test extra installs it
from wandb.proto import wandb_internal_pb2  # noqa: E402

BLOCK, HEADER = 32768, 7  # the LevelDB log format of a .wandb file: 32 KiB blocks, 7-byte record headers


def recipe_file(root: Path, text: str, **log) -> Path:
    (root / "train.txt").write_text(text[:30_000], encoding="utf-8")
    recipe = {
        "name": "wandb-test",
        "model": {"arch": "gpt", "d_model": 32, "n_layers": 1, "n_heads": 2, "max_seq_len": 32},
        "tokenizer": {"kind": "bpe", "vocab_size": 300},
        "data": {"train": str(root / "train.txt"), "valid": None, "seq_len": 32},
        "train": {"max_steps": 4, "batch_size": 4, "log_every": 1, "eval_every": 2, "save_every": 100, "device": "cpu"},
        "eval": {"batches": 1, "sample_prompt": None},
        "log": {"progress": False, "plot": False, "tensorboard": False, **log},
    }
    (root / "r.yaml").write_text(json.dumps(recipe))
    return root / "r.yaml"


def wandb_records(path: Path) -> list:
    """Every record of a .wandb file (`:W&B` header, then LevelDB log records: crc, length, type). W&B's
    service process writes the file; `teardown` waits for it to finish (seen once on a loaded host: the
    file read right after `finish` did not hold the run record yet)."""
    wandb.teardown()
    data, pos, out, pending = path.read_bytes(), HEADER, [], b""
    assert data[:4] == b":W&B"
    while pos + HEADER <= len(data):
        if BLOCK - pos % BLOCK < HEADER:  # a block's tail too short for a header is padding
            pos += BLOCK - pos % BLOCK
            continue
        length, kind = int.from_bytes(data[pos + 4:pos + 6], "little"), data[pos + 6]
        chunk, pos = data[pos + HEADER:pos + HEADER + length], pos + HEADER + length
        pending = chunk if kind in (1, 2) else pending + chunk  # FULL, FIRST | MIDDLE, LAST
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            out.append(record)
    return out


@pytest.fixture
def offline(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    for name in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(name, str(tmp_path / "wandb-home"))


def test_an_offline_run_holds_the_rows_the_recipe_and_the_final_validation(english_text, tmp_path, offline):
    recipe = load_recipe(str(recipe_file(tmp_path, english_text, wandb=True, wandb_project="tfkit-tests")))
    pretrain(recipe, run_dir=tmp_path / "run")
    (run_file,) = (tmp_path / "run" / "wandb").glob("offline-run-*/run-*.wandb")
    records = wandb_records(run_file)
    run = next(r.run for r in records if r.WhichOneof("record_type") == "run")
    assert (run.project, run.display_name) == ("tfkit-tests", "run")
    config = {u.key: json.loads(u.value_json) for u in run.config.update if u.key != "_wandb"}
    assert config == yaml.safe_load((tmp_path / "run" / "recipe.yaml").read_text())  # the resolved recipe
    history = [{i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
               for r in records if r.WhichOneof("record_type") == "history"]
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    logged = [{k: v for k, v in h.items() if not k.startswith("_")} for h in history if "final_eval/path" not in h]
    assert logged == rows and len(rows) == 4 + 3  # 4 training rows; validation at steps 0, 2 and 4
    (table,) = [h for h in history if "final_eval/path" in h]
    contents = json.loads((run_file.parent / "files" / table["final_eval/path"]).read_text())
    assert dict(contents["data"]) == rows[-1] and rows[-1]["step"] == 4 and "val_loss" in rows[-1]


def test_without_the_package_the_recipe_is_refused_naming_the_extra(english_text, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if it were not installed
    path = recipe_file(tmp_path, english_text, wandb=True)
    result = CliRunner().invoke(app, ["pretrain", str(path), "--run-dir", str(tmp_path / "run")])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and 'log.wandb: true needs the wandb package' in lines[0]
    assert 'pip install "tfkit[trackers]"' in lines[0] and not (tmp_path / "run").exists()


def test_a_recipe_without_wandb_never_imports_it(english_text, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)
    assert load_recipe(str(recipe_file(tmp_path, english_text))).log.wandb is False


def test_a_resumed_run_continues_the_w_and_b_run_of_its_folder(english_text, tmp_path, offline):
    path = recipe_file(tmp_path, english_text, wandb=True)
    pretrain(load_recipe(str(path), ["train.max_steps=2", "train.save_every=2"]), run_dir=tmp_path / "run")
    pretrain(load_recipe(str(path), ["train.max_steps=4", "train.save_every=2"]), run_dir=tmp_path / "run",
             resume="auto")
    runs = sorted((tmp_path / "run" / "wandb").glob("offline-run-*/run-*.wandb"))
    ids = {next(r.run.run_id for r in wandb_records(f) if r.WhichOneof("record_type") == "run") for f in runs}
    assert len(runs) == 2 and len(ids) == 1
