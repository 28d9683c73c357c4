"""The benchmark suite keeps running: `python -m benchmarks.run --quick` end to end, and the GPU suite's
refusal on a machine without CUDA. The numbers of a quick run mean nothing; that every section still
produces its rows, and the JSON its fields, is what these tests hold on to."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def bench(*args: str, timeout: int = 180) -> subprocess.CompletedProcess:
    """The command as a user types it, from the repository root (benchmarks/ is not an installed package)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "benchmarks.run", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.slow
def test_quick_suite_prints_one_table_and_writes_json(tmp_path):
    out = tmp_path / "results.json"
    done = bench("--quick", "--json", str(out))
    assert done.returncode == 0, done.stderr[-2000:]
    table = [line for line in done.stdout.splitlines() if line.startswith("|")]
    assert table[0].split("|")[1].strip() == "section" and len(table) > 2
    result = json.loads(out.read_text())
    assert result["suite"] == "cpu" and result["quick"] is True and result["machine"]["torch"] == torch.__version__
    sections = {row["section"] for row in result["rows"]}
    expected = {"train", "attention", "tokenizer", "batches", "decode", "cli"}
    assert expected <= sections, (sections, result["notes"])
    for row in result["rows"]:
        assert row["tfkit"] > 0 and math.isfinite(row["tfkit"]), row
        if row["baseline"] is not None:
            assert row["ratio"] > 0, row
        if row["goal"] is not None and row["ratio"] is not None:
            assert row["passed"] == (row["ratio"] >= row["goal"]["min_ratio"]), row
    # The CPU goals are on the table, whatever this run's verdict.
    goals = {row["goal"]["text"] for row in result["rows"] if row["goal"]}
    assert {">= 1.2x HF eager", "within 0.3 s of python -c pass", "<= 1.3x plain tokenizers"} <= goals
    assert all("stdlib:docs:train" in row["note"] for row in result["rows"] if row["section"] == "tokenizer")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on machines without CUDA")
def test_gpu_suite_refuses_without_cuda_in_one_line():
    done = bench("--suite", "gpu", timeout=60)
    assert done.returncode == 2
    assert done.stdout == "" and len(done.stderr.strip().splitlines()) == 1
    assert "CUDA" in done.stderr and "--suite cpu" in done.stderr


def test_unknown_section_is_a_usage_error():
    done = bench("--only", "train,warp", timeout=60)
    assert done.returncode == 2 and "warp" in done.stderr
