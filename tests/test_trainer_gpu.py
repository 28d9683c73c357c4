"""The CUDA paths of pretraining, which a CPU never takes: bf16 autocast with torch.compile and the fused
AdamW, fp16 with its loss scaler, MFU in the metrics, and the GPU benchmark suite. Skipped without CUDA
(run them with `python -m pytest -m gpu` on a GPU machine)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tfkit.checkpoints.run_record import read_metrics
from tfkit.trainer.metrics import peak_flops
from tfkit.trainer.recipe import load_recipe
from tfkit.trainer.run import pretrain

from helpers import write_recipe

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("arch", ["gpt", "bert", "transformer"])
def test_bf16_compiled_training_on_cuda_learns_and_reports_mfu(arch, english_text, tmp_path):
    recipe = write_recipe(tmp_path, english_text, arch, train={"device": "cuda", "precision": "bf16", "compile": True,
                                                 "max_steps": 40, "eval_every": 20})
    result = pretrain(load_recipe(str(recipe)), run_dir=tmp_path / "run")
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    valid = [r["val_loss"] for r in rows if "val_loss" in r]
    assert valid[-1] < valid[0] - 0.3 and result.final.loss == valid[-1]
    train = [r for r in rows if "loss" in r and not r.get("skipped")]  # log_every=1: every update has a row
    if peak_flops(torch.cuda.get_device_name()) is not None:
        assert all(0 < r["mfu"] < 1 for r in train)
    weights = load_file(str(tmp_path / "run" / "checkpoints" / "step-40" / "model.safetensors"))
    assert all(w.dtype == torch.float32 for w in weights.values())  # autocast: fp32 master weights


def test_fp16_with_loss_scaling_on_cuda_learns(english_text, tmp_path):
    recipe = write_recipe(tmp_path, english_text, "gpt", train={"device": "cuda", "precision": "fp16", "max_steps": 40,
                                                  "eval_every": 20})
    pretrain(load_recipe(str(recipe)), run_dir=tmp_path / "run")
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    valid = [r["val_loss"] for r in rows if "val_loss" in r]
    assert valid[-1] < valid[0] - 0.3
    applied = [r for r in rows if "loss" in r and not r.get("skipped")]
    assert len(applied) == 40 and all(r.get("reason") != "non-finite loss or gradient norm" for r in rows)


def test_gpu_benchmark_suite_runs_quick(tmp_path):
    out = tmp_path / "gpu.json"
    done = subprocess.run([sys.executable, "-m", "benchmarks.run", "--suite", "gpu", "--quick", "--json", str(out)],
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert {"train", "attention", "decode"} <= {row["section"] for row in result["rows"]}, result["notes"]
    assert result["machine"]["gpu"] == torch.cuda.get_device_name()
