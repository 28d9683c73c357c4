"""The GPU checklist in one command: does every CUDA path run, and the benchmark goals, into one folder.

    python -m benchmarks.gpu_checklist --out DIR [--quick] [--budget-minutes N] [--only STEP,...]

The CUDA paths (bf16 autocast, fused AdamW, `train.compile`, flash attention, flex document masks, the
compiled decode step, the GPU benchmark suite, the tests marked `gpu`) are checked on a GPU machine lent
for minutes at a time, so the time must go to measuring, not to set-up or to a lost run. Each step is a
subprocess with its own timeout (a hang or crash loses that step, not the rest), steps run in priority
order (cheap correctness first, benchmarks last), and DIR's `summary.json` and `summary.md` are rewritten
before and after every step (so a run cut off from outside still leaves what it finished, and says which
step it was in), beside each step's output, kept to its tail in a handful of log files. A step whose
timeout does not fit in what is left of `--budget-minutes` is not started. The exit code is 0 whenever
the summary was written: a failed step is a result. `--quick` runs every step on the CPU at tiny sizes,
so CI keeps the checklist itself working.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tfkit.checkpoints.run_record import read_metrics
from tfkit.files import write_atomic

ROOT = Path(__file__).resolve().parent.parent
LOG_TAIL_BYTES = 256 * 1024  # per step: DIR comes back from a lent machine as at most 8 files of 16 MiB
SAMPLE_PROMPT = "def main("

# Environment facts: printed as one JSON line, read back by `read_env`.
ENV_SCRIPT = """
import json, subprocess, torch
facts = {"torch": torch.__version__, "cuda": torch.version.cuda, "cuda_available": torch.cuda.is_available(),
         "gpus": torch.cuda.device_count()}
if torch.cuda.is_available():
    facts["device"] = torch.cuda.get_device_name(0)
    facts["capability"] = ".".join(map(str, torch.cuda.get_device_capability(0)))
    facts["bf16"] = torch.cuda.is_bf16_supported()
    facts["cudnn"] = torch.backends.cudnn.version()
try:
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True, timeout=30)
    facts["nvidia_smi"] = smi.stdout.strip() or smi.stderr.strip()
except (OSError, subprocess.SubprocessError) as exc:
    facts["nvidia_smi"] = f"not run: {exc}"
print(json.dumps(facts))
"""


class StepFailed(Exception):
    """A step exited 0 but what it left says it did not do its job (e.g. the loss did not fall)."""


@dataclass
class Step:
    """One item of the checklist: a command, how long it may take, and how to read what it left."""

    name: str
    argv: list[str]
    timeout: float  # seconds: a hang ends here, and the budget must hold this much for the step to start
    log: str  # log file in DIR; steps share a few, so DIR stays within what a lent machine sends back
    read: Callable[[str], dict] | None = None  # key figures from the tail of the output; raises StepFailed
    needs: str | None = None  # a step that must have succeeded first (its run folder is this one's input)
    skip: str | None = None  # why this step does not run on this machine


@dataclass
class Checklist:
    """The results so far, written to DIR before and after every step."""

    out: Path  # DIR: summary.json, summary.md, the logs
    work: Path  # run folders, benchmark JSON and whole outputs: what DIR must not grow with
    quick: bool
    budget_s: float
    started: float = field(default_factory=time.monotonic)
    results: list[dict] = field(default_factory=list)

    def left_s(self) -> float:
        return self.budget_s - (time.monotonic() - self.started)

    def status(self, name: str) -> str | None:
        return next((r["status"] for r in self.results if r["step"] == name), None)


def falling_loss(run_dir: Path) -> Callable[[str], dict]:
    """The reader of a pretrain step: metrics.jsonl's training loss falls from its first row to its last."""

    def read(output: str) -> dict:
        rows = read_metrics(run_dir / "metrics.jsonl")  # a torn last line of a killed run skipped
        train = [r for r in rows if "loss" in r]
        valid = [r for r in rows if "val_loss" in r]
        if len(train) < 2:
            raise StepFailed(f"{len(train)} training row(s) in metrics.jsonl; a falling loss needs 2 or more")
        figures = {"steps": train[-1]["step"], "first_loss": round(train[0]["loss"], 4),
                   "last_loss": round(train[-1]["loss"], 4),
                   "tokens_per_sec": round(train[-1].get("tokens_per_sec", 0.0)),
                   "val_loss": round(valid[-1]["val_loss"], 4) if valid else None}
        if not train[-1]["loss"] < train[0]["loss"]:
            raise StepFailed(f"loss did not fall: {figures['first_loss']} -> {figures['last_loss']}")
        return figures

    return read


def read_env(output: str) -> dict:
    """The facts ENV_SCRIPT printed: its last line is one JSON object."""
    return json.loads(output.strip().splitlines()[-1])


def read_pytest(output: str) -> dict:
    """pytest's closing line, e.g. '3 passed, 11 skipped, 2479 deselected in 17.41s', as counts."""
    last = output.strip().splitlines()[-1] if output.strip() else ""
    counts = {}
    for part in last.split(" in ")[0].split(","):
        words = part.split()
        if len(words) == 2 and words[0].isdigit():
            counts[words[1]] = int(words[0])
    if not counts:
        raise StepFailed(f"no pytest summary line: {last[:200]!r}")
    return counts


def read_generate(output: str) -> dict:
    """Why generation stopped and how fast, as `tfkit generate` says on stderr (a compile fallback warns
    there too): the steady ms per token is goal 4's figure (at most 5 ms at B=1 on GPT-2 124M)."""
    lines = output.splitlines()
    stopped = [line for line in lines if line.startswith("stopped:")]
    if not stopped:
        raise StepFailed("no 'stopped:' line: generation did not finish")
    figures = {"stopped": stopped[-1].removeprefix("stopped:").strip(),
               "warnings": sum("warning" in line.lower() for line in lines)}
    speed = re.search(r"^speed: .*?, ([\d.]+) ms per token", output, re.M)
    if speed:
        figures["ms_per_token"] = float(speed.group(1))
    return figures


def read_bench(path: Path) -> Callable[[str], dict]:
    """The reader of a benchmark step: every row's ratio and goal, from the JSON benchmarks.run wrote."""

    def read(output: str) -> dict:
        result = json.loads(path.read_text())
        rows = [{"case": r["case"], "unit": r["unit"], "tfkit": r["tfkit"], "baseline": r["baseline"],
                 "ratio": r["ratio"], "goal": r["goal"]["text"] if r["goal"] else None, "passed": r["passed"]}
                for r in result["rows"]]
        goals = [r["passed"] for r in rows if r["goal"] is not None and r["passed"] is not None]
        return {"ratios": len(rows), "goals_passed": f"{sum(goals)}/{len(goals)}", "rows": rows,
                "notes": result["notes"], "seconds": result["seconds"]}

    return read


def read_async_save(path: Path) -> Callable[[str], dict]:
    """The reader of the async-save step: each mode's median and longest pause per checkpoint (the longest as
    the row's figure: the goal bounds every checkpoint's pause)."""

    def read(output: str) -> dict:
        rows = [{**r, "tfkit": r["max"], "baseline": None, "ratio": None} for r in json.loads(path.read_text())["rows"]]
        return {"rows": rows, "goals_passed": f"{sum(bool(r['passed']) for r in rows if r['goal'])}/"
                                              f"{sum(1 for r in rows if r['goal'])}"}

    return read


def pretrain_sets(quick: bool, steps: int) -> list[str]:
    """The --set options of a short run: a few hundred steps on a GPU (a handful on the CPU), no extras."""
    sets = [f"train.max_steps={steps}", f"train.log_every={max(steps // 10, 1)}", f"train.eval_every={steps}",
            f"train.save_every={steps}", f"schedule.warmup_steps={max(steps // 10, 1)}", "log.progress=false",
            "log.tensorboard=false", "log.plot=false"]
    if quick:  # tiny shapes: seconds on a CPU, fp32, no compile (compiling takes minutes there)
        sets += ["train.batch_size=8", "data.seq_len=64", "tokenizer.vocab_size=1024", "tokenizer.max_train_mb=0.3",
                 "eval.batches=2", "train.precision=fp32"]
    return [arg for s in sets for arg in ("--set", s)]


def pretrain_step(name: str, recipe: str, run_dir: Path, quick: bool, steps: int, extra: list[str],
                  timeout: float, needs: str | None = None) -> Step:
    argv = [sys.executable, "-m", "tfkit", "pretrain", recipe, "--run-dir", str(run_dir),
            *pretrain_sets(quick, steps), *[arg for s in extra for arg in ("--set", s)]]
    return Step(name, argv, timeout, "pretrain.log", falling_loss(run_dir), needs=needs)


def finetune_step(bert_run: Path, run_dir: Path, quick: bool) -> Step:
    """`tfkit finetune` of the bundled classifier recipe from `pretrain-bert`'s run (bf16 and compile on a GPU)."""
    steps = 10 if quick else 150
    sets = [f"train.init_from={bert_run}", f"train.max_steps={steps}", f"train.log_every={steps // 5}",
            f"train.eval_every={steps}", f"train.save_every={steps}", f"schedule.warmup_steps={steps // 10}",
            "log.progress=false", "log.plot=false", "log.tensorboard=false"]
    sets += ["train.precision=fp32"] if quick else ["train.precision=bf16", "train.compile=true", "optim.lr=5e-5"]
    argv = [sys.executable, "-m", "tfkit", "finetune", "finetune-classify", "--run-dir", str(run_dir),
            *[arg for s in sets for arg in ("--set", s)]]
    return Step("finetune", argv, 180, "generate.log", falling_loss(run_dir), needs="pretrain-bert")


def plan(work: Path, quick: bool, gpus: int) -> list[Step]:
    """The checklist in priority order: what no lease has measured yet or what changed since, then what
    earlier leases passed.

    A lent machine gives one command of about ten minutes, so the order is what a cut-off run should have
    done first: the goals not yet met or measured (the 1B-class GQA/MQA decode cells, the fused loss, the
    in-loop task overhead, BERT-base at T=128 with a profile of its step, GPT-2 124M against the
    nanoGPT-style reference, the pause a sharded checkpoint puts into training with and without
    train.async_save), then the checks earlier leases passed: the document-mask test and
    gpt2-small trained with document masks, the GPT pretrain at full size (bf16, compile, fused AdamW,
    flash attention) and what reads its run (compiled decoding), BERT and its fine-tuning, the short
    benchmark sections, `pytest -m gpu` and the whole train section. On a GPU the shipped gpt2-small / bert-base
    recipes run as published (bf16, compile, their model and tokenizer sizes) but for the batch, the step
    count and the text the tokenizer trains on; `--quick` runs the tiny recipes and the CPU benchmark
    cases on the CPU instead. Timeouts are about twice what each step took on an H200
    (benchmarks/RESULTS.md); a step starts only if its timeout fits in what is left of the budget."""
    py = sys.executable
    gpt, bert = ("gpt-tiny", "bert-tiny") if quick else ("gpt2-small", "bert-base")
    gpt_run, bert_run = work / "gpt", work / "bert"
    reuse_tokenizer = f"tokenizer.path={gpt_run / 'tokenizer'}"
    gpt_sets = [] if quick else ["train.batch_size=16", "train.grad_accum=1", "tokenizer.max_train_mb=20"]
    bert_sets = [] if quick else ["train.batch_size=128", "tokenizer.max_train_mb=20"]
    new_tokens = "8" if quick else "128"
    suite = ["--suite", "cpu", "--quick"] if quick else ["--suite", "gpu"]

    def bench(name: str, section: str, timeout: float, *options: str, skip: str | None = None) -> Step:
        json_path = work / f"{name}.json"
        return Step(name, [py, "-m", "benchmarks.run", *suite, "--only", section, *options, "--json", str(json_path)],
                    timeout, "bench.log", read_bench(json_path), skip=skip)

    def train_case(name: str, gpu_case: str, cpu_case: str | None, timeout: float, *options: str) -> Step:
        """One train case, compiled only on a GPU (the goals are the compiled rows'); its CPU counterpart
        with --quick, or no run where the case is about a CUDA kernel."""
        case = cpu_case if quick else gpu_case
        return bench(name, "train", timeout, "--case", case or gpu_case, *([] if quick else ["--no-eager"]), *options,
                     skip=None if case else f"{gpu_case}: CUDA only")

    return [
        Step("env", [py, "-c", ENV_SCRIPT], 60, "env-tests.log", read_env),
        bench("bench-decode-1b", "decode_1b", 280),  # goal 5: 142 s on an H100
        train_case("bench-fused-loss", "fused loss", None, 240),  # goal 6: past 120 s on an H100 (compiling)
        bench("bench-inloop", "inloop", 300),
        train_case("bench-bert-128", "bert-base MLM T=128", "bert tiny MLM", 220, "--profile"),  # goal 2: 110 s
        train_case("bench-reference", "reference GPT", "reference GPT", 200, "--profile"),  # goal 1: 98 s
        Step("bench-async-save", [py, "-m", "benchmarks.async_save", *(["--quick", "--saves", "2"] if quick else []),
                                  "--json", str(work / "async-save.json")], 150, "bench.log",
             read_async_save(work / "async-save.json")),  # issue 46 item 5: at most 1 s per checkpoint
        # The document-mask fix (the block mask built outside the compiled graph): its test, then training.
        Step("doc-mask-test", [py, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_models_gpu.py", "-k",
                               "document_mask"], 120, "env-tests.log", read_pytest),
        pretrain_step("doc-mask", gpt, work / "doc-mask", quick, 10 if quick else 150,
                      [*gpt_sets, "data.document_mask=true"], 260),
        pretrain_step("pretrain-gpt", gpt, gpt_run, quick, 10 if quick else 300, gpt_sets, 180),
        Step("generate", [py, "-m", "tfkit", "generate", str(gpt_run), "-p", SAMPLE_PROMPT, "-n", new_tokens,
                          "--min-new-tokens", new_tokens, "-t", "0",
                          *([] if quick else ["--compile", "--dtype", "bf16"])],
             90, "generate.log", read_generate, needs="pretrain-gpt"),
        pretrain_step("pretrain-bert", bert, bert_run, quick, 10 if quick else 300, bert_sets, 180),
        finetune_step(bert_run, work / "finetune", quick),
        bench("bench-attention", "attention", 90),
        bench("bench-decode", "decode", 300),
        # `pytest -m gpu` but its quick run of the GPU suite, which the bench steps run at full size
        Step("pytest-gpu", [py, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "gpu", *gpu_test_files(),
                            "--deselect", "tests/test_trainer_gpu.py::test_gpu_benchmark_suite_runs_quick"],
             300, "env-tests.log", read_pytest),
        Step("ddp", [py, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m", "tfkit",
                     "pretrain", gpt, "--run-dir", str(work / "ddp"), *pretrain_sets(quick, 50),
                     "--set", "train.batch_size=32", "--set", "train.grad_accum=1", "--set", reuse_tokenizer],
             300, "pretrain.log", falling_loss(work / "ddp"), needs="pretrain-gpt",
             skip=None if gpus >= 2 else f"a two-process torchrun needs two GPUs; this machine has {gpus}"),
        bench("bench-train", "train", 480),
    ]


def gpu_test_files() -> list[str]:
    """The test files that hold `gpu`-marked tests: collecting the whole suite to select them costs a lent
    machine (and CI's quick run) some 15 s of imports."""
    return sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("test_*.py")
                  if "mark.gpu" in p.read_text(encoding="utf-8"))


def append_log(path: Path, step: Step, output: Path) -> str:
    """The step's command and the tail of its output, added to its (shared) log file; the tail as text."""
    with output.open("rb") as f:
        size = f.seek(0, 2)
        f.seek(max(size - LOG_TAIL_BYTES, 0))
        tail = f.read().decode("utf-8", "replace")
    command = " ".join(step.argv[:12]) + (" ..." if len(step.argv) > 12 else "")
    with path.open("a", encoding="utf-8") as log:
        log.write(f"\n===== {step.name}: {command}\n")
        log.write(f"[... {size - LOG_TAIL_BYTES} earlier bytes cut ...]\n" if size > LOG_TAIL_BYTES else "")
        log.write(tail)
    return tail


def why_not(step: Step, checklist: Checklist) -> str | None:
    """Why a step is not started: not for this machine, an earlier step it needs failed, or no time left."""
    if step.skip:
        return step.skip
    if step.needs and checklist.status(step.needs) != "ok":
        return f"needs {step.needs}, which did not succeed"
    if step.timeout > checklist.left_s():
        return f"budget: may take {step.timeout:.0f} s, {max(checklist.left_s(), 0):.0f} s left"
    return None


def run_step(step: Step, checklist: Checklist, env: dict[str, str]) -> dict:
    """Run one step under its timeout and read its figures: {step, status, seconds, figures | reason}.

    The output goes to a file as it comes (not held in memory), and only its tail reaches DIR's log."""
    result: dict = {"step": step.name, "log": step.log}
    raw = checklist.work / f"{step.name}.out"
    start = time.monotonic()
    with raw.open("wb") as out:
        try:  # its own process group, so a timeout ends what it started too (torchrun's workers, compilers)
            proc = subprocess.Popen(step.argv, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT, preexec_fn=os.setpgrp)
        except OSError as exc:  # the program could not be started
            out.write(f"{type(exc).__name__}: {exc}\n".encode())
            code: int | str | None = None
        else:
            try:
                code = proc.wait(timeout=step.timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                code = "timeout"
    result["seconds"] = round(time.monotonic() - start, 1)
    output = append_log(checklist.out / step.log, step, raw)
    if code == "timeout":
        return {**result, "status": "timeout", "reason": f"no exit within {step.timeout:.0f} s"}
    if code != 0:
        last = output.strip().splitlines()[-1:] or ["no output"]
        return {**result, "status": "failed", "exit_code": code, "reason": last[0][:300]}
    try:
        figures = step.read(output) if step.read else {}
    except (StepFailed, OSError, ValueError, KeyError, IndexError) as exc:
        return {**result, "status": "failed", "exit_code": 0, "reason": f"{type(exc).__name__}: {exc}"[:300]}
    return {**result, "status": "ok", "figures": figures}


def markdown(checklist: Checklist) -> str:
    """summary.md: one table of the steps, then each benchmark row with its ratio and goal."""
    lines = [f"# tfkit GPU checklist{' (quick, CPU: not results)' if checklist.quick else ''}", "",
             "| step | status | seconds | key figures |", "| --- | --- | --- | --- |"]
    for r in checklist.results:
        figures = {k: v for k, v in r.get("figures", {}).items() if k not in ("rows", "notes", "seconds")}
        detail = r.get("reason") or ", ".join(f"{k} {v}" for k, v in figures.items())
        lines.append(f"| {r['step']} | {r['status']} | {r.get('seconds', 0):.0f} | {detail.replace('|', '/')} |")
    for r in checklist.results:
        for row in r.get("figures", {}).get("rows", []):
            ratio = f"{row['tfkit']:.3g} {row['unit']}" if row.get("ratio") is None else f"{row['ratio']:.2f}x"
            verdict = "" if row["goal"] is None else f" (goal {row['goal']}: {'PASS' if row['passed'] else 'MISS'})"
            lines.append(f"- {r['step']}: {row['case']}: {ratio}{verdict}")
    return "\n".join(lines) + "\n"


def write_summary(checklist: Checklist, planned: list[str]) -> None:
    """summary.json and summary.md, each replaced whole."""
    summary = {"quick": checklist.quick, "budget_s": checklist.budget_s,
               "elapsed_s": round(time.monotonic() - checklist.started, 1), "planned": planned,
               "steps": checklist.results}
    write_atomic(checklist.out / "summary.json", json.dumps(summary, indent=1) + "\n")
    write_atomic(checklist.out / "summary.md", markdown(checklist))


def run_checklist(checklist: Checklist, steps: list[Step], env: dict[str, str]) -> None:
    """Every step in order, the summary rewritten before and after each one that runs."""
    planned = [s.name for s in steps]
    write_summary(checklist, planned)
    for step in steps:
        reason = why_not(step, checklist)
        if reason:
            checklist.results.append({"step": step.name, "status": "skipped", "seconds": 0.0, "reason": reason})
            continue
        print(f"[{time.monotonic() - checklist.started:6.0f}s] {step.name} ...", file=sys.stderr, flush=True)
        checklist.results.append({"step": step.name, "status": "running", "log": step.log})
        write_summary(checklist, planned)  # a run cut off from outside says which step it was in
        checklist.results[-1] = run_step(step, checklist, env)
        print(f"[{time.monotonic() - checklist.started:6.0f}s] {step.name}: {checklist.results[-1]['status']}",
              file=sys.stderr, flush=True)
        write_summary(checklist, planned)
    write_summary(checklist, planned)


def parse_args(argv: list[str] | None, names: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_checklist", description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True,
                        help="a new or empty folder: summary.json, summary.md and the steps' logs")
    parser.add_argument("--quick", action="store_true", help="every step on the CPU at tiny sizes (CI)")
    parser.add_argument("--budget-minutes", type=float, default=None,
                        help="start no step whose timeout would end past this (default 9: one 10-minute command; "
                             "30 with --quick, whose CPU steps keep the GPU timeouts)")
    parser.add_argument("--only", default=",".join(names), help=f"comma-separated steps (default all: {','.join(names)})")
    args = parser.parse_args(argv)
    args.only = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = sorted(set(args.only) - set(names))
    if unknown:
        parser.error(f"--only: unknown step(s) {', '.join(unknown)}; expected some of {', '.join(names)}")
    args.budget_minutes = args.budget_minutes or (30.0 if args.quick else 9.0)
    if not args.budget_minutes > 0:
        parser.error(f"--budget-minutes: {args.budget_minutes} is not a positive number of minutes")
    return args


def gpu_count() -> int:
    import torch  # here, not at the top: a --quick run never needs it in this process

    return torch.cuda.device_count()


def main(argv: list[str] | None = None) -> int:
    work = Path(tempfile.mkdtemp(prefix="tfkit-checklist-"))  # run folders and whole outputs, out of DIR
    try:
        args = parse_args(argv, [s.name for s in plan(work, quick=True, gpus=0)])
        if args.out.exists() and (not args.out.is_dir() or any(args.out.iterdir())):
            print(f"gpu_checklist: --out {args.out} {'is not empty' if args.out.is_dir() else 'is a file'}; "
                  "give a new or empty folder (the logs of a run are its own)", file=sys.stderr)
            return 2
        args.out.mkdir(parents=True, exist_ok=True)
        steps = [s for s in plan(work, args.quick, 0 if args.quick else gpu_count()) if s.name in args.only]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        if args.quick:
            env["CUDA_VISIBLE_DEVICES"] = ""  # the CPU paths, even on a machine with a GPU
        checklist = Checklist(args.out, work, args.quick, args.budget_minutes * 60)
        run_checklist(checklist, steps, env)
        print(markdown(checklist))
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
