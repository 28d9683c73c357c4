"""Data parallelism on CPU: two gloo processes under torchrun give the loss curve of one process with the
same global batch (MLM, whose masked-token counts differ between ranks and micro-batches, with
gradient accumulation; FSDP2 for every objective), and only rank 0 writes the run folder."""

import shutil
import subprocess
import sys

import pytest
import torch

from tfkit.checkpoints.run_record import read_metrics
from tfkit.trainer.recipe import load_recipe
from tfkit.trainer.run import pretrain

from helpers import ONE_THREAD, write_recipe

pytestmark = pytest.mark.slow  # two torchrun processes per test: CI's second step (`pytest -m slow`) runs them

SCRIPT = """
import sys
from tfkit.trainer.recipe import load_recipe
from tfkit.trainer.run import pretrain
pretrain(load_recipe(sys.argv[1], sys.argv[3:]), run_dir=sys.argv[2])
"""


@pytest.mark.parametrize("arch, mode", [("bert", "ddp"), ("bert", "fsdp"), ("gpt", "fsdp"), ("transformer", "fsdp")])
def test_two_gloo_processes_match_one_process(english_text, tmp_path, arch, mode):
    recipe = write_recipe(tmp_path, english_text, arch, model={"dropout": 0.0},  # dropout draws differ per rank
                          train={"max_steps": 6, "batch_size": 8, "grad_accum": 2, "eval_every": 3,
                                 "save_every": 3, "distributed": mode})
    single = pretrain(load_recipe(str(recipe)), run_dir=tmp_path / "single")
    script = tmp_path / "launch.py"
    script.write_text(SCRIPT)
    shutil.rmtree(tmp_path / "single" / "data")  # the 2-process run tokenizes afresh, on rank 0
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(script),
           str(recipe), str(tmp_path / "double"), f"data.cache_dir={tmp_path / 'cache2'}"]  # its own tokenizer
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=ONE_THREAD)
    assert done.returncode == 0, done.stderr[-3000:]
    one = read_metrics(tmp_path / "single" / "metrics.jsonl")
    two = read_metrics(tmp_path / "double" / "metrics.jsonl")
    keys = ("loss", "accuracy", "grad_norm", "val_loss", "val_accuracy", "tokens")
    assert [r["step"] for r in one] == [r["step"] for r in two] and len(one) == 6 + 3
    for a, b in zip(one, two):
        for key in keys:
            if key in a:
                assert b[key] == pytest.approx(a[key], abs=1e-5), (a["step"], key, a[key], b[key])
    print(f"{mode}: 1 process", [round(r["loss"], 6) for r in one if "loss" in r])
    print(f"{mode}: 2 processes", [round(r["loss"], 6) for r in two if "loss" in r])
    assert f"x2 ({mode})" in " ".join(done.stdout.split())  # the run said it used both (rich wraps lines)
    assert single.final.loss == pytest.approx(two[-1]["val_loss"], abs=1e-5)
    assert sorted(p.name for p in (tmp_path / "double" / "checkpoints").iterdir()) == ["step-3", "step-6"]


def test_compiled_fsdp_matches_one_eager_process(english_text, tmp_path):
    """`train.compile` with FSDP2: the compiled graph runs through the sharded blocks' hooks (2 gloo
    processes, CPU inductor) and reproduces an eager single-process run's losses."""
    recipe = write_recipe(tmp_path, english_text, "gpt", model={"dropout": 0.0},
                          train={"max_steps": 4, "batch_size": 8, "grad_accum": 2, "eval_every": 2,
                                 "save_every": 4, "distributed": "fsdp", "compile": True})
    eager = pretrain(load_recipe(str(recipe), ["train.compile=false"]), run_dir=tmp_path / "eager")
    script = tmp_path / "launch.py"
    script.write_text(SCRIPT)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(script),
           str(recipe), str(tmp_path / "compiled"), f"tokenizer.path={tmp_path / 'eager' / 'tokenizer'}"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=ONE_THREAD)
    assert done.returncode == 0, done.stderr[-3000:]
    one = read_metrics(tmp_path / "eager" / "metrics.jsonl")
    two = read_metrics(tmp_path / "compiled" / "metrics.jsonl")
    assert [r["step"] for r in one] == [r["step"] for r in two] and len(one) == 4 + 3  # validations at steps 0, 2, 4
    for a, b in zip(one, two):
        for key in ("loss", "grad_norm", "val_loss"):
            if key in a:
                assert b[key] == pytest.approx(a[key], abs=1e-4), (a["step"], key, a[key], b[key])
    assert eager.final.loss == pytest.approx(two[-1]["val_loss"], abs=1e-4)


FINETUNE = ["--set", "train.max_steps=4", "--set", "train.eval_every=2", "--set", "train.save_every=4",
            "--set", "train.batch_size=8", "--set", "model.dropout=0.0", "--set", "task.dropout=0.0",
            "--set", "train.precision=fp32", "--set", "data.seq_len=32", "--set", "log.progress=false",
            "--set", "log.plot=false", "--set", "train.keep_best=true"]


@pytest.fixture(scope="module")
def bert_run(english_text, tmp_path_factory):
    """A briefly pretrained tiny BERT, the body the fine-tuning runs start from."""
    folder = tmp_path_factory.mktemp("bert")
    recipe = write_recipe(folder, english_text, "bert", train={"max_steps": 2, "eval_every": 2, "save_every": 2})
    pretrain(load_recipe(str(recipe)), run_dir=folder / "run")
    return folder / "run"


@pytest.mark.parametrize("mode, pooling", [("ddp", "cls"), ("fsdp", "mean")])
def test_fine_tuning_in_two_gloo_processes_matches_one_process(bert_run, tmp_path, mode, pooling):
    """The classifier's unused body parameters (the MLM head, the pooler under mean pooling) are frozen, so
    DDP does not wait for their gradients; each process writes its shards of the classifier's checkpoints and
    best/. Both give the single process's losses, accuracies and best weights."""
    from tfkit.checkpoints.folders import is_sharded
    from tfkit.checkpoints.weights import load_classifier

    args = ["finetune", "finetune-classify", "--set", f"train.init_from={bert_run}", "--set",
            f"train.distributed={mode}", "--set", f"task.pooling={pooling}", *FINETUNE]
    one = subprocess.run([sys.executable, "-m", "tfkit", *args, "--run-dir", str(tmp_path / "one")],
                         capture_output=True, text=True, timeout=300, env=ONE_THREAD)
    assert one.returncode == 0, one.stderr[-3000:]
    two = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                          "-m", "tfkit", *args, "--run-dir", str(tmp_path / "two")],
                         capture_output=True, text=True, timeout=300, env=ONE_THREAD)
    assert two.returncode == 0, two.stderr[-3000:]
    rows = [read_metrics(tmp_path / run / "metrics.jsonl") for run in ("one", "two")]
    assert [r["step"] for r in rows[0]] == [r["step"] for r in rows[1]] and len(rows[0]) == 4
    for a, b in zip(*rows):
        for key in ("loss", "val_loss", "val_accuracy", "val_macro_f1"):
            if key in a:
                assert b[key] == pytest.approx(a[key], abs=1e-5), (a["step"], key)
    assert not is_sharded(tmp_path / "one" / "best") and is_sharded(tmp_path / "two" / "best")
    best = [load_classifier(tmp_path / run / "best")[0].state_dict() for run in ("one", "two")]
    assert best[0].keys() == best[1].keys() and any(k.startswith("classifier.") for k in best[0])
    for name in best[0]:
        assert torch.allclose(best[0][name], best[1][name], atol=1e-5), name
