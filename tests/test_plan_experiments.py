"""The plan's measurements keep running: `python -m benchmarks.plan --quick` (predicted against measured memory
and tokens/s) and `python -m experiments.plan_ladder --quick` (sizes at equal CPU time). Their numbers in
quick mode mean nothing; the records are in benchmarks/RESULTS.md."""

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # about 30 s: one configuration, a warm-up run, a measured run and a prediction
def test_plan_benchmark_runs_quickly(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT.parent), str(ROOT)]), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "benchmarks.plan", "--quick", "--work", str(tmp_path)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| gpt")]
    assert len(rows) == 1 and all(" MiB | " in row for row in rows)


@pytest.mark.slow  # about 40 s: two 6-second pretrainings and the bits per byte of the validation text
def test_plan_ladder_runs_quickly(tmp_path, capsys, monkeypatch):
    from tfkit.trainer import run as run_module

    monkeypatch.setattr(run_module, "TimeBudget", run_module.TimeBudget)  # the experiment's CPU clock, undone after
    monkeypatch.syspath_prepend(str(ROOT))
    ladder = importlib.import_module("experiments.plan_ladder")
    import torch

    threads = torch.get_num_threads()
    try:
        assert ladder.main(["--quick", "--out", str(tmp_path / "ladder")]) == 0
    finally:
        torch.set_num_threads(threads)  # the experiment runs on one thread
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| stdlib:docs:train")]
    assert len(rows) == 2 and all(0 < float(row.split("|")[-2]) < 10 for row in rows)  # bits per byte
