"""`python -m benchmarks.gpu_checklist`: every step of the GPU checklist recorded in one compact folder.

The real run happens on a GPU machine lent for minutes, where a lost or unreadable result costs the whole
lease; so what is held here is the bookkeeping: a hang, a crash, a step that exits 0 having failed (the
loss did not fall), a step whose input failed, a step past the budget each end up as one line of the
summary, which is complete after every step, and the folder stays within what such a machine sends back.
The slow test runs the whole checklist with `--quick` on the CPU."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # benchmarks/ is not an installed package: import it as `python -m` does
from benchmarks import gpu_checklist as gc  # noqa: E402

sys.path.remove(str(ROOT))
PY = sys.executable


class TimedFromFirstLine(subprocess.Popen):
    """A step whose timeout counts from its first line of output, not from its start: on a loaded machine
    starting Python can outlast a 1 s timeout, and a step killed before it printed anything would not show
    what the tests read (its output kept, the process it started ended). A step that ends first, or
    prints nowhere a file holds, is timed as usual."""

    def __init__(self, *args, stdout=None, **kwargs):
        self.output = Path(stdout.name) if hasattr(stdout, "name") else None
        super().__init__(*args, stdout=stdout, **kwargs)

    def wait(self, timeout=None):
        while timeout is not None and self.output is not None and self.poll() is None \
                and not self.output.stat().st_size:
            time.sleep(0.01)
        return super().wait(timeout)


def fake_plan(work: Path) -> list[gc.Step]:
    """One step of every outcome; `reads` prints the summary as the step after `ok` finds it on disk."""
    return [
        gc.Step("ok", [PY, "-c", "print('first line'); print('{\"x\": 1}')"], 30, "a.log", gc.read_env),
        gc.Step("reads", [PY, "-c", "import sys; print(open(sys.argv[1]).read())", "SUMMARY"], 30, "a.log"),
        gc.Step("crash", [PY, "-c", "raise SystemExit('bad thing happened')"], 30, "b.log"),
        gc.Step("hang", [PY, "-c", "import time; print('started', flush=True); time.sleep(60)"], 1, "b.log"),
        gc.Step("quiet-fail", [PY, "-c", "print('done')"], 30, "b.log", gc.read_pytest),
        gc.Step("needs-crash", [PY, "-c", "pass"], 30, "b.log", needs="crash"),
        gc.Step("not-here", [PY, "-c", "pass"], 30, "b.log", skip="needs two GPUs"),
        gc.Step("too-long", [PY, "-c", "pass"], 10_000, "b.log"),
    ]


@pytest.fixture(scope="module")
def checklist_run(tmp_path_factory):
    """The fake checklist run once for the module's three tests: (exit code, DIR, what it printed)."""
    out = tmp_path_factory.mktemp("checklist") / "out"

    def planned(work, quick, gpus):
        steps = fake_plan(work)
        steps[1].argv[-1] = str(out / "summary.json")
        return steps

    printed, errors = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as patch, redirect_stdout(printed), redirect_stderr(errors):
        patch.setattr(gc, "plan", planned)
        patch.setattr(gc.subprocess, "Popen", TimedFromFirstLine)  # `hang` is killed after its line
        code = gc.main(["--out", str(out), "--budget-minutes", "5"])
    return code, out, SimpleNamespace(out=printed.getvalue(), err=errors.getvalue())


def test_every_step_is_one_summary_entry_whatever_its_outcome(checklist_run):
    code, out, printed = checklist_run
    assert code == 0, printed.err
    summary = json.loads((out / "summary.json").read_text())
    steps = {s["step"]: s for s in summary["steps"]}
    assert summary["planned"] == list(steps) == [s.name for s in fake_plan(out)]
    assert {name: s["status"] for name, s in steps.items()} == {
        "ok": "ok", "reads": "ok", "crash": "failed", "hang": "timeout", "quiet-fail": "failed",
        "needs-crash": "skipped", "not-here": "skipped", "too-long": "skipped"}
    assert steps["ok"]["figures"] == {"x": 1}
    assert steps["crash"]["exit_code"] == 1 and "bad thing happened" in steps["crash"]["reason"]
    assert "within 1 s" in steps["hang"]["reason"]
    assert steps["quiet-fail"]["exit_code"] == 0 and "pytest summary" in steps["quiet-fail"]["reason"]
    assert "needs crash" in steps["needs-crash"]["reason"]
    assert steps["not-here"]["reason"] == "needs two GPUs"
    assert steps["too-long"]["reason"].startswith("budget: may take 10000 s")
    markdown = (out / "summary.md").read_text()
    for name, s in steps.items():
        assert f"| {name} | {s['status']} |" in markdown
    assert markdown == printed.out.rstrip("\n") + "\n"


def test_the_summary_is_on_disk_before_and_after_every_step(checklist_run):
    """What a run cut off from outside leaves: the step `reads` found `ok` done and itself running."""
    _, out, _ = checklist_run
    log = (out / "a.log").read_text()
    seen = json.loads(log[log.index("===== reads"):].split("\n", 1)[1])
    assert [(s["step"], s["status"]) for s in seen["steps"]] == [("ok", "ok"), ("reads", "running")]


def test_logs_are_few_flat_files_with_each_steps_command_and_output(checklist_run):
    _, out, _ = checklist_run
    assert sorted(p.name for p in out.iterdir()) == ["a.log", "b.log", "summary.json", "summary.md"]
    b = (out / "b.log").read_text()
    assert "===== crash:" in b and "bad thing happened" in b
    assert "===== hang:" in b and "started" in b  # what a step printed before its timeout is kept
    assert "===== needs-crash" not in b  # a skipped step runs nothing


def running(pid: int) -> bool:
    """Whether process `pid` still runs (a zombie waiting for its parent to reap it does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError):
        return False


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process states from /proc")
def test_a_timeout_ends_what_the_step_started_too(tmp_path, monkeypatch):
    """torchrun's workers or a compiler's pool must not run on (and hold the GPU) after their step timed out."""
    pid_file = tmp_path / "child.pid"
    child = (f"import os, time; open({str(pid_file)!r} + '.tmp', 'w').write(str(os.getpid())); "
             f"os.rename({str(pid_file)!r} + '.tmp', {str(pid_file)!r}); time.sleep(60)")
    argv = [PY, "-c", f"import os, subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {child!r}])\n"
                      f"while not os.path.exists({str(pid_file)!r}): time.sleep(0.01)\n"
                      "print('child started', flush=True); time.sleep(60)"]
    monkeypatch.setattr(gc.subprocess, "Popen", TimedFromFirstLine)  # the 2 s count once the child runs
    checklist = gc.Checklist(tmp_path, tmp_path, quick=True, budget_s=60)
    result = gc.run_step(gc.Step("spawns", argv, 2, "x.log"), checklist, dict(os.environ))
    monkeypatch.undo()
    assert result["status"] == "timeout"
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + 30  # the kill is immediate; this only bounds a broken test
    while running(pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not running(pid)


def test_a_log_keeps_the_tail_of_a_long_output(tmp_path, monkeypatch):
    monkeypatch.setattr(gc, "LOG_TAIL_BYTES", 100)
    raw = tmp_path / "raw"
    raw.write_text("".join(f"line {i}\n" for i in range(1000)))
    step = gc.Step("long", ["prog"], 1, "x.log")
    tail = gc.append_log(tmp_path / "x.log", step, raw)
    assert tail.endswith("line 999\n") and len(tail) == 100
    log = (tmp_path / "x.log").read_text()
    assert "earlier bytes cut" in log and "line 0\n" not in log and len(log) < 200


def test_falling_loss_reads_metrics_jsonl(tmp_path):
    read = gc.falling_loss(tmp_path)
    rows = [{"step": 0, "val_loss": 9.0}, {"step": 5, "loss": 8.0, "tokens_per_sec": 100.0},
            {"step": 10, "loss": 7.0, "tokens_per_sec": 120.0}, {"step": 10, "val_loss": 7.5}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert read("") == {"steps": 10, "first_loss": 8.0, "last_loss": 7.0, "tokens_per_sec": 120, "val_loss": 7.5}
    rows[2]["loss"] = 8.5
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(gc.StepFailed, match="did not fall: 8.0 -> 8.5"):
        read("")
    (tmp_path / "metrics.jsonl").write_text(json.dumps(rows[1]) + "\n")
    with pytest.raises(gc.StepFailed, match="1 training row"):
        read("")


def test_generate_is_read_for_its_stop_and_its_pace():
    out = "loaded x\nstopped: --max-new-tokens 128 reached\nspeed: 128 tokens in 1.20 s, 3.50 ms per token after the first 4\n"
    assert gc.read_generate(out) == {"stopped": "--max-new-tokens 128 reached", "warnings": 0, "ms_per_token": 3.5}
    with pytest.raises(gc.StepFailed, match="no 'stopped:' line"):
        gc.read_generate("loaded x\n")


def test_pytest_closing_line_as_counts():
    assert gc.read_pytest("..s\n3 passed, 11 skipped, 2479 deselected in 17.41s\n") == {
        "passed": 3, "skipped": 11, "deselected": 2479}
    assert gc.read_pytest("1 failed, 2 passed, 1 warning in 3.00s") == {"failed": 1, "passed": 2, "warning": 1}


def test_the_real_plan_covers_the_checklist_in_priority_order(tmp_path):
    names = [s.name for s in gc.plan(tmp_path, quick=False, gpus=1)]
    assert names == ["env", "bench-decode-1b", "bench-fused-loss", "bench-inloop", "bench-bert-128", "bench-reference",
                     "bench-async-save", "doc-mask-test", "doc-mask", "pretrain-gpt", "generate", "pretrain-bert", "finetune",
                     "bench-attention", "bench-decode", "pytest-gpu", "ddp", "bench-train"]
    steps = {s.name: s for s in gc.plan(tmp_path, quick=False, gpus=1)}
    assert "--compile" in steps["generate"].argv and steps["ddp"].skip
    assert "data.document_mask=true" in steps["doc-mask"].argv
    assert steps["bench-train"].argv[3:6] == ["--suite", "gpu", "--only"]
    assert not gc.plan(tmp_path, quick=False, gpus=2)[names.index("ddp")].skip
    for name in ("bench-fused-loss", "bench-bert-128", "bench-reference"):  # the goals are the compiled rows'
        assert "--no-eager" in steps[name].argv and "--case" in steps[name].argv, name
    assert "--profile" in steps["bench-bert-128"].argv and "--profile" in steps["bench-reference"].argv
    assert "--quick" not in steps["bench-async-save"].argv  # gpt2-small, the goal's size
    assert gc.plan(tmp_path, quick=True, gpus=0)[names.index("bench-fused-loss")].skip  # a CUDA kernel's case
    assert "train.compile=true" in steps["finetune"].argv and steps["finetune"].needs == "pretrain-bert"
    assert len({s.log for s in steps.values()}) <= 5  # + 2 summaries: within the 8 files a lent machine returns


def test_out_must_be_new_or_empty_and_steps_known(tmp_path, capsys):
    (tmp_path / "old.log").write_text("a user's file")
    assert gc.main(["--out", str(tmp_path), "--quick"]) == 2
    assert "is not empty" in capsys.readouterr().err
    assert (tmp_path / "old.log").read_text() == "a user's file"
    with pytest.raises(SystemExit) as exc:
        gc.main(["--out", str(tmp_path / "new"), "--only", "env,warp"])
    assert exc.value.code == 2 and "warp" in capsys.readouterr().err


@pytest.mark.slow
def test_quick_checklist_runs_every_step_on_the_cpu(tmp_path):
    """The whole checklist as CI can run it: a few minutes on 2 cores, every step recorded."""
    out = tmp_path / "checklist"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([PY, "-m", "benchmarks.gpu_checklist", "--out", str(out), "--quick",
                           ], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    steps = {s["step"]: s for s in summary["steps"]}
    assert list(steps) == summary["planned"] == [s.name for s in gc.plan(tmp_path, quick=True, gpus=0)]
    assert steps.pop("ddp")["status"] == "skipped"  # one GPU-less machine: no two-process run
    assert steps.pop("bench-fused-loss")["status"] == "skipped"  # a GPU case with no CPU counterpart
    assert {name: s["status"] for name, s in steps.items()} == dict.fromkeys(steps, "ok"), summary
    assert steps["env"]["figures"]["cuda_available"] is False
    assert steps["pytest-gpu"]["figures"].get("passed", 0) == 0 and steps["pytest-gpu"]["figures"]["skipped"] > 0
    for name in ("pretrain-gpt", "pretrain-bert", "doc-mask", "finetune"):
        assert steps[name]["figures"]["last_loss"] < steps[name]["figures"]["first_loss"]
    benches = ("train", "attention", "decode", "reference", "bert-128", "inloop", "decode-1b")
    assert all(steps[f"bench-{s}"]["figures"]["rows"] for s in benches[:-1])  # decode_1b: rows on a GPU only
    for row in (row for s in benches for row in steps[f"bench-{s}"]["figures"]["rows"]):
        assert row["tfkit"] > 0 and (row["ratio"] is None or row["ratio"] > 0), row  # these sections' only CI run
        assert row["passed"] is None or row["goal"] is not None, row
    assert ">= 1.2x HF eager" in {row["goal"] for row in steps["bench-train"]["figures"]["rows"]}
    pauses = {row["case"].split(", ")[-1]: row for row in steps["bench-async-save"]["figures"]["rows"]}
    assert set(pauses) == {"in place", "async_save"} and all(0 < r["median"] <= r["max"] for r in pauses.values())
    files = list(out.iterdir())
    assert len(files) <= 8 and all(f.is_file() and f.stat().st_size < 16 * 2**20 for f in files)


@pytest.mark.parametrize("quick", [False, True])
def test_every_training_step_is_a_valid_recipe(tmp_path, quick):
    """The GPU-sized runs never run in CI: their recipe and --set keys are checked here instead."""
    from tfkit.trainer.recipe import load_recipe

    for step in gc.plan(tmp_path, quick=quick, gpus=2):
        command = next((c for c in ("pretrain", "finetune") if c in step.argv), None)
        if command:
            args = step.argv[step.argv.index(command) + 1:]
            sets = [args[i + 1] for i, arg in enumerate(args) if arg == "--set"]
            recipe = load_recipe(args[0], sets)
            assert recipe.train.max_steps >= 10, step.name
            assert recipe.train.batch_size % (recipe.train.grad_accum * (2 if step.name == "ddp" else 1)) == 0
