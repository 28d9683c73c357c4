"""`train.precision: auto`: bf16 autocast where the device multiplies bf16 natively, fp32 elsewhere; the
choice is written down (recipe.yaml, the start block, every checkpoint) and kept by a resumed run.

conftest makes every in-process test see no native bf16; these tests switch it on where they need it."""

import json
import shutil

import pytest
import torch

from tfkit.checkpoints.record import CheckpointRecord
from tfkit.checkpoints.run_record import read_metrics
from tfkit.errors import ConfigError
from tfkit.trainer import optim
from tfkit.trainer.recipe import load_recipe
from tfkit.trainer.run import pretrain

from helpers import losses, weights, write_recipe

CPU = torch.device("cpu")


def test_auto_is_bf16_only_where_the_hardware_has_it(monkeypatch):
    for given in ("fp32", "bf16", "fp16"):  # an explicit setting is never second-guessed
        assert optim.resolve_precision(given, CPU) == given
    assert optim.resolve_precision("auto", CPU) == "fp32"
    monkeypatch.setattr(optim, "native_bf16", lambda device: True)
    assert optim.resolve_precision("auto", CPU) == "bf16"
    assert isinstance(optim.autocast_context("auto", CPU), torch.autocast)
    assert not optim.grad_scaler("auto", CPU).is_enabled()  # bf16 needs no loss scaling


def test_the_probe_reads_the_cpu_flags_and_answers_no_for_other_devices(native_bf16_probe):
    flags = (torch.cpu._is_avx512_bf16_supported(), torch.cpu._is_amx_tile_supported())
    assert native_bf16_probe(CPU) is any(flags)
    assert native_bf16_probe(torch.device("meta")) is False
    if not torch.cuda.is_available():
        assert native_bf16_probe(torch.device("cuda")) is False


def test_auto_is_the_default_and_a_wrong_value_names_the_choices(tmp_path):
    assert load_recipe("gpt-tiny").train.precision == "auto"
    with pytest.raises(ConfigError, match=r"train\.precision: got 'bf32', expected one of auto, fp32, bf16, fp16"):
        load_recipe("gpt-tiny", ["train.precision=bf32"])


def test_an_auto_run_records_its_choice_and_a_resume_elsewhere_keeps_it(english_text, tmp_path, monkeypatch, capsys):
    """Started where bf16 is native, the run trains in bf16 and says so; resumed on a machine without it,
    it still computes in bf16, so the resumed run ends where an uninterrupted one does."""
    recipe = write_recipe(tmp_path, english_text, train={"precision": "auto", "max_steps": 8, "save_every": 4,
                                                         "eval_every": 4})
    monkeypatch.setattr(optim, "native_bf16", lambda device: True)
    full = pretrain(load_recipe(str(recipe)), run_dir=tmp_path / "full").run_dir
    assert "bf16 autocast on cpu (1 CPU thread); train.precision auto: native bf16 on this cpu" in capsys.readouterr().out
    assert load_recipe(str(full / "recipe.yaml")).train.precision == "bf16"
    assert CheckpointRecord.read(full / "checkpoints" / "step-8").precision == "bf16"

    fp32 = pretrain(load_recipe(str(recipe), ["train.precision=fp32"]), run_dir=tmp_path / "fp32").run_dir
    assert losses(fp32) != losses(full)  # the auto run's matmuls did run in bf16

    monkeypatch.setattr(optim, "native_bf16", lambda device: False)  # "another machine"
    pretrain(load_recipe(str(recipe)), run_dir=tmp_path / "resumed", resume=str(full / "checkpoints" / "step-4"))
    resumed = tmp_path / "resumed"
    assert CheckpointRecord.read(resumed / "checkpoints" / "step-8").precision == "bf16"
    assert {k: v for k, v in losses(resumed).items() if k[0] > 4} == {k: v for k, v in losses(full).items() if k[0] > 4}
    for name, tensor in weights(full / "checkpoints" / "step-8").items():
        torch.testing.assert_close(weights(resumed / "checkpoints" / "step-8")[name], tensor, rtol=0, atol=0)
    assert [r["step"] for r in read_metrics(resumed / "metrics.jsonl") if "loss" in r][0] == 5


def test_a_checkpoint_from_before_auto_resumes_in_the_precision_its_run_recorded(english_text, tmp_path, monkeypatch):
    """A run started when fp32 was the default has no precision in its checkpoints' config.json; resumed
    with a recipe that now says auto, on a machine with native bf16, it goes on in fp32 as its recipe.yaml
    says, so the resume stays exact."""
    recipe = write_recipe(tmp_path, english_text, train={"max_steps": 8, "save_every": 4, "eval_every": 4})
    full = pretrain(load_recipe(str(recipe)), run_dir=tmp_path / "full").run_dir  # fp32 (conftest's pin)
    interrupted = tmp_path / "old"  # the same run, stopped after step 4
    shutil.copytree(full, interrupted)
    shutil.rmtree(interrupted / "checkpoints" / "step-8")
    config = interrupted / "checkpoints" / "step-4" / "config.json"
    config.write_text(json.dumps({k: v for k, v in json.loads(config.read_text()).items() if k != "precision"}))
    monkeypatch.setattr(optim, "native_bf16", lambda device: True)
    pretrain(load_recipe(str(recipe), ["train.precision=auto"]), run_dir=interrupted, resume="auto")
    assert CheckpointRecord.read(interrupted / "checkpoints" / "step-8").precision == "fp32"
    for name, tensor in weights(full / "checkpoints" / "step-8").items():
        torch.testing.assert_close(weights(interrupted / "checkpoints" / "step-8")[name], tensor, rtol=0, atol=0)
