"""runtime.py: the one place that turns a device name and a precision into what torch computes with."""

from __future__ import annotations

import pytest
import torch

from tfkit.errors import ConfigError
from tfkit.runtime import check_device, check_precision, pick_device, torch_dtype


def test_auto_is_the_gpu_when_there_is_one(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert pick_device("auto") == torch.device("cpu") and pick_device("cpu") == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert pick_device("auto") == torch.device("cuda") and pick_device("cuda:1") == torch.device("cuda", 1)


@pytest.mark.parametrize("name", ["cuda", "cuda:0"])
def test_cuda_without_a_gpu_is_an_error_naming_the_option(name: str, monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match=f"train.device: '{name}' requested but CUDA is not available"):
        pick_device(name, option="train.device")


@pytest.mark.parametrize("name", ["tpu", "cuda:", "cuda:x", "CPU", ""])
def test_a_device_name_is_checked_without_torch(name: str) -> None:
    with pytest.raises(ConfigError, match=f"^device: got {name!r}, expected auto, cpu, cuda or cuda:N"):
        check_device(name)


def test_precisions() -> None:
    assert [torch_dtype(p) for p in ("fp32", "bf16", "fp16")] == [torch.float32, torch.bfloat16, torch.float16]
    assert check_precision("auto", allow_auto=True) == "auto"
    with pytest.raises(ConfigError, match="^dtype: got 'auto', expected one of fp32, bf16, fp16"):
        check_precision("auto")
    with pytest.raises(ConfigError, match="train.precision: got 'int8', expected one of auto, fp32"):
        check_precision("int8", option="train.precision", allow_auto=True)
