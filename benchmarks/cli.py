"""The command line as a user meets it: whole processes, from the shell prompt back to the prompt.

- start-up: `tfkit --help` and `tfkit recipes list` against `python -c pass` (the interpreter alone);
  goal: within 0.3 s of it. No command that runs no model may import torch (seconds on a busy machine).
- tokenizer training: `tfkit train-tokenizer FILE` (its defaults: byte-level BPE, 8,192 tokens, the
  held-out report) against a plain `tokenizers` script that trains the same pipeline on the same 8.6 MB
  file with `Tokenizer.train` (files read in Rust); goal: at most 1.3x its time.

Each process is timed by the wall clock, or with `--clock cpu` by the CPU time the children used (user +
system), which a busy host disturbs far less. The corpus is the built-in one (the standard library's
docstrings, then its source), cut to 8.6 MB, so every machine measures the same kind of text.
"""

from __future__ import annotations

import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from tfkit.tokenization.stdlib_corpus import stdlib_documents

from .common import Context, Goal, Row, median, paired_ratio, time_interleaved

STARTUP_BUDGET_S = 0.3
CORPUS_BYTES, QUICK_BYTES = 8_600_000, 300_000
TRAIN_GOAL = Goal("<= 1.3x plain tokenizers", 1 / 1.3)

# What a user without tfkit would write: tfkit's bpe pipeline (tokenization/train.py), trained from the file.
PLAIN_SCRIPT = """
import sys
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.post_processor = processors.ByteLevel(trim_offsets=False)
tok.decoder = decoders.ByteLevel()
trainer = trainers.BpeTrainer(vocab_size=8192, min_frequency=2, special_tokens=["<|endoftext|>", "<|pad|>"],
                              initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
tok.train([sys.argv[1]], trainer)
tok.save(sys.argv[2])
"""


def children_cpu() -> float:
    """CPU seconds used so far by this process's finished children (user + system)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def process(*args: str, cwd: Path) -> Callable[[], None]:
    """A function that runs `python ARGS` to completion, failing loudly if the command fails."""

    def run() -> None:
        subprocess.run([sys.executable, *args], cwd=cwd, check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)

    return run


def corpus_text(size: int) -> str:
    """The built-in corpus (docstrings, then source) as one text file would hold it, cut to `size` chars."""
    docs = stdlib_documents("stdlib:docs") + stdlib_documents("stdlib:code")
    out, total = [], 0
    for doc in docs:
        out.append(doc)
        total += len(doc) + 2
        if total >= size:
            break
    return "\n\n".join(out)[:size]


def run(ctx: Context) -> list[Row]:
    timer = children_cpu if ctx.clock == "cpu" else time.perf_counter
    rounds = 2 if ctx.quick else 7
    work = Path(tempfile.mkdtemp(prefix="tfkit-bench-cli-"))
    try:
        ctx.log("cli: start-up")
        starts = {"pass": process("-c", "pass", cwd=work), "help": process("-m", "tfkit", "--help", cwd=work),
                  "list": process("-m", "tfkit", "recipes", "list", cwd=work)}
        samples = time_interleaved(starts, ctx.device, warmup=1, rounds=rounds, calls=1, timer=timer)
        base = median(samples["pass"])
        rows = []
        for name, case in (("help", "tfkit --help"), ("list", "tfkit recipes list")):
            took = median(samples[name])
            rows.append(Row("cli", f"{case} vs python -c pass (whole processes)", "s", took, base,
                            higher_is_better=False, goal=Goal(f"within {STARTUP_BUDGET_S} s of python -c pass",
                                                              base / (base + STARTUP_BUDGET_S)),
                            note=f"+{took - base:.2f} s over the interpreter", extra={"samples_s": samples}))
        corpus = work / "corpus.txt"
        corpus.write_text(corpus_text(QUICK_BYTES if ctx.quick else CORPUS_BYTES), encoding="utf-8")
        megabytes = corpus.stat().st_size / 1e6
        ctx.log(f"cli: train-tokenizer on {megabytes:.1f} MB")
        trainers = {"tfkit": process("-m", "tfkit", "train-tokenizer", str(corpus), "--out", str(work / "tok"),
                                     "--force", "-q", cwd=work),
                    "plain": process("-c", PLAIN_SCRIPT, str(corpus), str(work / "plain.json"), cwd=work)}
        samples = time_interleaved(trainers, ctx.device, warmup=0 if ctx.quick else 1, rounds=1 if ctx.quick else 3,
                                   calls=1, timer=timer)
        ratio = paired_ratio(samples["tfkit"], samples["plain"])
        rows.append(Row("cli", f"tfkit train-tokenizer vs a plain tokenizers script, bpe 8192, {megabytes:.1f} MB",
                        "s", median(samples["tfkit"]), median(samples["plain"]), higher_is_better=False,
                        goal=TRAIN_GOAL, paired=ratio, note=f"tfkit takes {1 / ratio:.2f}x the time",
                        extra={"samples_s": samples}))
        return rows
    finally:
        shutil.rmtree(work, ignore_errors=True)
