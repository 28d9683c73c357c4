"""Sharded checkpoints (checkpoints/sharded.py) read wherever a checkpoint is, in one process: the weights equal
the single-file checkpoint they were written from, `generate` and `export-hf` take the folder, `tfkit
consolidate` writes the single-file form with the same tensors; a missing or truncated rank file, a hostile or
damaged metadata file and a config.json of another depth are one line each. The shards are written here in one
process, with the same calls every rank of a run makes (`training.ShardedSave`); the runs of several processes
are tests/test_trainer_sharded.py's."""

import pickle
import shutil
from pathlib import Path

import pytest
import torch

from tfkit.checkpoints.folders import is_complete, is_sharded, resolve_checkpoint
from tfkit.checkpoints.record import CheckpointRecord
from tfkit.checkpoints.weights import load_model
from tfkit.errors import CheckpointError
from tfkit.layout import CONFIG, SHARDS, SHARDS_METADATA
from tfkit.trainer.recipe import load_recipe
from tfkit.trainer.run import pretrain

from helpers import shard_checkpoint, write_recipe

from faults.fault_helpers import assert_one_line_error, cli


@pytest.fixture(scope="module")
def checkpoints(english_text, tmp_path_factory) -> tuple[Path, Path]:
    """(a single-file checkpoint of a 2-step GPT run, the same weights sharded)."""
    folder = tmp_path_factory.mktemp("sharded")
    recipe = write_recipe(folder, english_text, "gpt", train={"max_steps": 2, "save_every": 2, "eval_every": 2})
    pretrain(load_recipe(str(recipe)), run_dir=folder / "run")
    single = resolve_checkpoint(folder / "run")
    return single, shard_checkpoint(single, folder / "sharded")


def states_equal(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_a_sharded_checkpoint_loads_as_its_single_file_form(checkpoints):
    single, shards = checkpoints
    assert is_sharded(shards) and is_complete(shards) and not (shards / "model.safetensors").exists()
    assert resolve_checkpoint(shards) == shards
    assert states_equal(load_model(single)[0], load_model(shards)[0])


def test_generate_and_export_read_a_sharded_checkpoint(checkpoints, tmp_path):
    single, shards = checkpoints
    texts = [cli(["generate", folder, "-p", "The", "-n", "6", "--temperature", "0"]) for folder in (single, shards)]
    assert all(t.exit_code == 0 for t in texts), texts[1].output
    assert texts[0].stdout == texts[1].stdout
    exported = cli(["export-hf", shards, "--out", tmp_path / "hf"])
    assert exported.exit_code == 0, exported.output
    assert (tmp_path / "hf" / "model.safetensors").is_file()


def test_consolidate_writes_the_same_tensors_in_one_file(checkpoints, tmp_path):
    single, shards = checkpoints
    result = cli(["consolidate", shards, "--out", tmp_path / "one"])
    assert result.exit_code == 0, result.output
    assert not is_sharded(tmp_path / "one") and (tmp_path / "one" / "tokenizer.json").is_file()
    assert states_equal(load_model(single)[0], load_model(tmp_path / "one")[0])
    assert CheckpointRecord.read(tmp_path / "one").step == CheckpointRecord.read(single).step
    assert_one_line_error(cli(["consolidate", shards, "--out", tmp_path / "one"]), "already exists")
    assert_one_line_error(cli(["consolidate", single, "--out", tmp_path / "two"]), "already in the single-file form")


@pytest.mark.parametrize("damage", ["missing", "truncated"])
def test_a_missing_or_truncated_rank_file_is_named(checkpoints, tmp_path, damage):
    shards = shutil.copytree(checkpoints[1], tmp_path / "ckpt")
    file = next((shards / SHARDS).glob("__0_*.distcp"))
    if damage == "missing":
        file.unlink()
    else:
        file.write_bytes(file.read_bytes()[:100])
    line = assert_one_line_error(cli(["generate", shards, "-p", "The", "-n", "2"]), str(file), "rank 0", damage)
    assert "sharded checkpoint" in line
    with pytest.raises(CheckpointError, match=damage):
        load_model(shards)


def test_a_hostile_metadata_file_runs_no_code(checkpoints, tmp_path):
    shards = shutil.copytree(checkpoints[1], tmp_path / "ckpt")
    marker = tmp_path / "ran"

    class Hostile:
        def __reduce__(self):
            return (Path.touch, (marker,))

    (shards / SHARDS / SHARDS_METADATA).write_bytes(pickle.dumps(Hostile()))
    assert_one_line_error(cli(["generate", shards, "-p", "The", "-n", "2"]), "not the metadata", "pathlib")
    assert not marker.exists()
    (shards / SHARDS / SHARDS_METADATA).write_bytes(b"\x80\x04garbage")
    assert_one_line_error(cli(["generate", shards, "-p", "The", "-n", "2"]), "damaged")


def test_a_config_of_another_depth_is_refused_before_building(checkpoints, tmp_path):
    shards = shutil.copytree(checkpoints[1], tmp_path / "ckpt")
    text = (shards / CONFIG).read_text().replace('"n_layers": 2', '"n_layers": 20000')
    (shards / CONFIG).write_text(text)
    assert_one_line_error(cli(["generate", shards, "-p", "The", "-n", "2"]), "model.n_layers=20000", "shards holds 2")
