"""`eval.tasks` / `eval.probe` under torchrun: two gloo processes split the items and the probe's rows (DDP: each its
share, on rank 0's weights; FSDP: rank 0 alone, on the gathered weights), and the score each validation logs
equals one process's score of the checkpoint the run wrote."""

import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from tfkit.checkpoints.run_record import read_metrics
from tfkit.cli.main import app

from helpers import ONE_THREAD, write_recipe

pytestmark = pytest.mark.slow  # two torchrun processes: CI's second step (`pytest -m slow`) runs it

SCRIPT = """
import sys
from tfkit.evaluation.inloop import build_downstream
from tfkit.trainer.recipe import load_recipe
from tfkit.trainer.run import pretrain
recipe = load_recipe(sys.argv[1])
pretrain(recipe, run_dir=sys.argv[2], downstream=build_downstream(recipe))
"""


@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_two_processes_log_the_scores_one_process_gives_their_checkpoints(english_text, tmp_path, mode):
    recipe = write_recipe(tmp_path, english_text, "gpt", model={"dropout": 0.0, "max_seq_len": 128},
                          train={"max_steps": 4, "eval_every": 2, "save_every": 2, "distributed": mode},
                          eval={"tasks": ["stdlib:docs-choice", "stdlib:docs-cloze"], "task_limit": 50,
                                "task_batch_size": 4, "probe": "stdlib:topics"})
    script = tmp_path / "launch.py"
    script.write_text(SCRIPT)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(script),
           str(recipe), str(tmp_path / "run")]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=ONE_THREAD)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {r["step"]: r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if "val_loss" in r}
    assert sorted(rows) == [0, 2, 4]
    for step in (2, 4):
        checkpoint = str(tmp_path / "run" / "checkpoints" / f"step-{step}")
        for task, keys in (("stdlib:docs-choice", ("acc", "acc_norm")), ("stdlib:docs-cloze", ("acc", "perplexity"))):
            out = tmp_path / "one.json"
            args = ["eval", checkpoint, "--task", task, "--batch-size", "4", "--json", str(out)]
            assert CliRunner().invoke(app, args).exit_code == 0
            one = json.loads(out.read_text())[0]
            name = task.removeprefix("stdlib:")
            if one["items"] != 50:  # the run scored the first 50 items (eval.task_limit): score those offline
                from tfkit.evaluation.builtin_tasks import load_task
                from tfkit.evaluation.task_scores import score_task

                one = score_task(checkpoint, load_task(task, 50), batch_size=4, dtype="auto")
            assert rows[step][f"task/{name}/acc"] == one["acc"], (step, task)
            # a log-likelihood can differ in its last float32 bit between processes (a CPU kernel's path depends on
            # where its buffers lie): the accuracies are equal, a perplexity to 1e-6
            assert rows[step][f"task/{name}/{keys[1]}"] == pytest.approx(one[keys[1]], rel=1e-6), (step, task)
        probe = tmp_path / "probe.json"
        args = ["eval", checkpoint, "--probe", "stdlib:topics", "--json", str(probe)]
        assert CliRunner().invoke(app, args).exit_code == 0
        assert rows[step]["task/probe-topics/acc"] == json.loads(probe.read_text())[0]["acc"]
