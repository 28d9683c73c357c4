"""The one benchmark command: every speed claim tfkit makes comes from this table.

    python -m benchmarks.run [--suite cpu|gpu|all] [--quick] [--json OUT] [--compile | --no-compile]

Sections (each row a ratio against a baseline measured in the same run; > 1 = tfkit better):
train (tokens/s vs HuggingFace, and on CPU vs reference_gpt.py, a minimal nanoGPT-style GPT), attention
(vs bare SDPA and the naive path), tokenizer (vs raw `tokenizers`), corpora (token preparation from every corpus format vs raw
`encode_batch`), batches (MLM batch preparation vs
HuggingFace's masking), decode (GQA/MQA vs MHA, from benchmarks/decode.py), cli (start-up and
`train-tokenizer` as whole processes, from benchmarks/cli.py), doc_mask (a training step with packed documents
kept apart vs attending across them, benchmarks/doc_mask.py), tasks (multiple-choice scoring vs lm-eval's HF
backend, from benchmarks/tasks.py), sft (a chat fine-tuning step vs a plain PyTorch loop over HF's GPT2LMHeadModel,
benchmarks/sft.py), mixture (a weighted mixture's shares in the packed rows, its rows' throughput vs one
source, its peak memory at 1 GB vs 10 MB, benchmarks/mixture.py), inloop (a gpt-tiny run scoring two tasks at every
validation vs the same run without, benchmarks/inloop.py), finetune (fine-tuning quality parity with HF and its
speed, benchmarks/finetune.py: it downloads an encoder and takes most of an hour, so only when named in `--only`).
Questions about quality
alone (does pretraining pay?) are experiments, in experiments/. `--quick` shrinks every shape so the
whole suite runs in seconds (CI checks that it still runs); its numbers are not results. The GPU suite
needs CUDA and is sized to finish in under 10 minutes on one H100; the CPU suite takes a few minutes
on 2 cores.
"""

from __future__ import annotations

import argparse
import datetime
import sys
import time
from pathlib import Path

import torch

from tfkit.models import build_model

from . import (attention, batches, cli, corpora, doc_mask, finetune, inloop, mixture, sft, tasks, tokenizer,
               train_throughput)
from .common import Context, Goal, Row, machine, table, write_json

SECTIONS = ("train", "attention", "tokenizer", "corpora", "batches", "decode", "cli", "doc_mask", "tasks", "sft",
            "mixture", "inloop", "finetune")
# no GPU work: measured by the cpu suite only (keeps the gpu suite under 10 minutes)
CPU_ONLY = ("tokenizer", "corpora", "batches", "cli", "doc_mask", "tasks", "sft", "mixture", "inloop", "finetune")
NAMED_ONLY = ("finetune",)  # full runs take most of an hour: run when --only names them (and by every --quick run)
HERE = Path(__file__).resolve().parent


DECODE_GOAL = Goal(">= 2x HF generate at B=1", 2.0)


def decode_rows(ctx: Context) -> list[Row]:
    """GQA and MQA decode tokens/s against MHA, measured by the teammate-owned benchmarks/decode.py."""
    try:
        from . import decode
    except ModuleNotFoundError as exc:
        if exc.name != f"{__package__}.decode":
            raise
        ctx.skip("decode: benchmarks/decode.py is not there yet")
        return []
    if ctx.quick:
        shape = decode.Shape(d_model=64, n_layers=1, n_heads=8, vocab_size=512, contexts=(16, 64), steps=4)
        cells, repeats = [(1, 16), (4, 64)], 1
    elif ctx.suite == "cpu":  # the FULL model's 2048-token prefills take minutes on 2 cores
        shape, repeats = decode.QUICK, 2
        cells = [(1, shape.contexts[0]), (8, shape.contexts[1])]
    else:
        shape, repeats = decode.FULL, 3
        cells = [(b, c) for c in shape.contexts for b in decode.BATCHES]
    dtype = torch.bfloat16 if ctx.device.type == "cuda" else torch.float32
    torch.manual_seed(0)
    models = {name: build_model(decode.config(shape, kv, shape.steps)).to(ctx.device, dtype).eval()
              for name, kv in decode.variants(shape).items()}
    best = {name: {cell: 0.0 for cell in cells} for name in models}
    for _ in range(repeats):  # variants interleaved inside each repeat, best kept (as decode.py's main)
        for cell in cells:
            ctx.log(f"decode: B={cell[0]} T={cell[1]}")
            for name, model in models.items():
                rate = decode.decode_tokens_per_sec(model, *cell, shape.steps, ctx.device)
                best[name][cell] = max(best[name][cell], rate)
    mha = models["MHA"].config
    rows = []
    for name in ("GQA", "MQA"):
        kv = models[name].config.kv_heads
        for batch, context in cells:
            rows.append(Row("decode", f"{name} ({kv} kv heads) vs MHA ({mha.kv_heads}), d={mha.d_model} "
                                      f"L={mha.n_layers}, B={batch} T={context}, {shape.steps} steps",
                            "tok/s", best[name][(batch, context)], best["MHA"][(batch, context)],
                            note=f"KV cache {kv / mha.kv_heads:.3g}x", extra={"repeats": repeats}))
    if ctx.suite == "gpu" and ctx.compile:
        rows += bytes_bound_rows(ctx, dtype)
    # HF generate where decoding matters most, the largest cell; with --compile also at batch 1, where a
    # step is the matrix-vector products and the compiled step is meant to be twice as fast.
    hf_cells = [cells[-1]] + ([cells[0]] if ctx.compile else [])
    try:
        hf_model = decode.to_hf(models["MHA"])
        hf = None if hf_model is None else {
            cell: decode.hf_tokens_per_sec(hf_model, *cell, shape.steps, ctx.device) for cell in hf_cells}
    except Exception as exc:  # noqa: BLE001 - an optional comparison in a teammate's file; say why, go on
        ctx.skip(f"decode: HF generate comparison failed: {type(exc).__name__}: {str(exc)[:200]}")
        return rows
    if hf is None:
        ctx.skip("decode: HF generate comparison needs transformers and tfkit.checkpoints.hf_export")
        return rows
    batch, context = cells[-1]
    rows.append(Row("decode", f"tfkit MHA vs HF generate (same weights), B={batch} T={context}", "tok/s",
                    best["MHA"][(batch, context)], hf[(batch, context)], extra={"repeats": 1}))
    if ctx.compile:
        batch, context = cells[0]
        ctx.log(f"decode: compiled, B={batch} T={context}")
        rate = max(decode.decode_tokens_per_sec(models["MHA"], batch, context, shape.steps, ctx.device, compile=True)
                   for _ in range(repeats))
        rows.append(Row("decode", f"tfkit MHA compiled vs HF generate (same weights), B={batch} T={context}",
                        "tok/s", rate, hf[(batch, context)], goal=DECODE_GOAL, extra={"repeats": repeats}))
    return rows


def bytes_bound_rows(ctx: Context, dtype: torch.dtype) -> list[Row]:
    """GQA and MQA against MHA where the KV cache is a large share of what a step reads (goal 5): a
    1B-class shape at B=16 and a 2048-token context, the step compiled (CUDA graphs), as `generate
    --compile` runs it. Goal: 80% of the gain the bytes predict (decode.predicted_speedup)."""
    from . import decode

    shape = decode.Shape(256, 2, 8, 4096, (256, 256), 4) if ctx.quick else decode.ONE_B
    batch, context = (4, 256) if ctx.quick else (16, 2048)
    torch.manual_seed(0)
    models = {name: build_model(decode.config(shape, kv, shape.steps)).to(ctx.device, dtype).eval()
              for name, kv in decode.variants(shape).items()}
    best = dict.fromkeys(models, 0.0)
    for _ in range(1 if ctx.quick else 2):
        for name, model in models.items():
            rate = decode.decode_tokens_per_sec(model, batch, context, shape.steps, ctx.device, compile=True)
            best[name] = max(best[name], rate)
            ctx.log(f"decode: {name} compiled, d={shape.d_model} L={shape.n_layers}, B={batch} T={context}: "
                    f"{rate:,.0f} tok/s")
    rows = []
    for name in ("GQA", "MQA"):
        predicted = decode.predicted_speedup(models["MHA"], models[name], batch, context, dtype)
        goal = Goal(f">= 80% of the bytes' gain ({predicted:.2f}x)", 1 + 0.8 * (predicted - 1))
        rows.append(Row("decode", f"{name} ({models[name].config.kv_heads} kv heads) vs MHA ({shape.n_heads}), "
                                  f"compiled, d={shape.d_model} L={shape.n_layers}, B={batch} T={context}", "tok/s",
                        best[name], best["MHA"], goal=goal,
                        note=f"bytes per step predict {predicted:.2f}x; "
                             f"{models['MHA'].num_params() / 1e9:.2f}B parameters",
                        extra={"predicted": predicted}))
        ctx.log(rows[-1].line())
    return rows


RUNNERS = {"train": train_throughput.run, "attention": attention.run, "tokenizer": tokenizer.run,
           "corpora": corpora.run, "batches": batches.run, "decode": decode_rows, "cli": cli.run,
           "doc_mask": doc_mask.run, "tasks": tasks.run, "sft": sft.run, "mixture": mixture.run,
           "inloop": inloop.run, "finetune": finetune.run}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__.split("\n")[0])
    parser.add_argument("--suite", choices=("cpu", "gpu", "all"), default="cpu")
    parser.add_argument("--quick", action="store_true", help="tiny shapes, seconds; checks the suite runs")
    parser.add_argument("--json", type=Path, default=None,
                        help="results file (default benchmarks/results-<suite>[-quick].json)")
    parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                        help="also time torch.compile'd models (default: on for gpu, off for cpu: slow to compile)")
    parser.add_argument("--threads", type=int, default=None,
                        help="CPU threads for torch (default: 1 with --quick, which stays fast on a busy host; "
                             "else torch's default)")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="CPU suite: wall time, or this process's CPU time (steadier on a busy shared host; "
                             "pair with --threads 1). GPU timings and decode are always wall time")
    parser.add_argument("--corpus", type=Path, default=None,
                        help="text file for the tokenizer section (default: about 1 MB of the built-in stdlib:docs)")
    parser.add_argument("--corpus-mb", type=float, default=50.0,
                        help="corpora section: megabytes of text written in every format (default 50; 1 with --quick)")
    parser.add_argument("--finetune-data", type=Path, default=Path("../shared/data/ag_news_test.csv"),
                        help="finetune section: AG News' test CSV (label, title, description), split 6,000 to "
                             "train on and 1,600 to score (default ../shared/data/ag_news_test.csv)")
    parser.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "tfkit-bench",
                        help="finetune section: where all-MiniLM-L6-v2 is downloaded (83 MB) and unzipped, once "
                             "(default ~/.cache/tfkit-bench)")
    parser.add_argument("--only", default=None,
                        help=f"comma-separated sections to run (default all but {','.join(NAMED_ONLY)}, which run "
                             f"when named or with --quick: {','.join(SECTIONS)})")
    parser.add_argument("--case", default="",
                        help="train section: only the cases whose name contains this text, e.g. 'reference GPT'")
    args = parser.parse_args(argv)
    if args.only is None:
        args.only = ",".join(s for s in SECTIONS if args.quick or s not in NAMED_ONLY)
    args.only = [s.strip() for s in args.only.split(",") if s.strip()]
    if args.corpus is not None and not args.corpus.is_file():
        parser.error(f"--corpus: {args.corpus} is not a file")
    unknown = sorted(set(args.only) - set(SECTIONS))
    if unknown:
        parser.error(f"--only: unknown section(s) {', '.join(unknown)}; expected some of {', '.join(SECTIONS)}")
    if args.case and "train" not in args.only:
        parser.error("--case selects train cases; add train to --only")
    if "finetune" in args.only and not args.quick and args.suite != "gpu":
        sizes = finetune.FULL
        problem = finetune.check_data(args.finetune_data, sizes.n_train, sizes.n_test)
        if problem:
            parser.error(f"--finetune-data: {problem}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    suites = ["cpu", "gpu"] if args.suite == "all" else [args.suite]
    if "gpu" in suites and not torch.cuda.is_available():
        print(f"benchmarks: --suite {args.suite} needs a CUDA GPU and torch {torch.__version__} sees none; "
              "use --suite cpu", file=sys.stderr)
        return 2
    threads = args.threads or (1 if args.quick else None)
    if threads:
        torch.set_num_threads(threads)
    started = datetime.datetime.now().astimezone()
    info = {**machine(), "torch_threads": torch.get_num_threads()}
    rows: list[Row] = []
    notes: list[str] = []
    seconds: dict[str, float] = {}
    compiled: dict[str, bool] = {}
    for suite in suites:
        compile_ = compiled[suite] = args.compile if args.compile is not None else suite == "gpu"
        device = torch.device("cuda" if suite == "gpu" else "cpu")
        ctx = Context(suite, args.quick, compile_, device, clock=args.clock, corpus=args.corpus,
                      corpus_mb=args.corpus_mb, finetune_data=args.finetune_data, cache=args.cache)
        for section in args.only:
            if suite == "gpu" and section in CPU_ONLY:
                ctx.notes.append(f"{section}: CPU-only work, measured by --suite cpu")
                continue
            start = time.perf_counter()
            options = {"match": args.case} if section == "train" else {}
            for row in RUNNERS[section](ctx, **options):
                row.section = f"{suite}/{row.section}" if len(suites) > 1 else row.section
                rows.append(row)
            seconds[f"{suite}/{section}"] = round(time.perf_counter() - start, 1)
        notes += ctx.notes
    info["load_avg_1m_end"] = machine()["load_avg_1m"]
    total = sum(seconds.values())
    print(f"# tfkit benchmarks: suite {args.suite}{' (quick: not results)' if args.quick else ''}, "
          f"{started:%Y-%m-%d %H:%M %Z}, {info['cpu']} x{info['cores']}"
          f"{', ' + info['gpu'] if info['gpu'] else ''}, {info['torch_threads']} torch thread(s), "
          f"torch {info['torch']}, "
          f"transformers {info.get('transformers', '-')}, {args.clock} clock, {total:.0f} s")
    print("# ratio > 1 = tfkit better: tfkit/baseline for rates, baseline/tfkit for times; "
          "timed in interleaved rounds, ratio = median of per-round ratios")
    print(table(rows))
    for note in notes:
        print(f"- {note}")
    print("# seconds per section: " + ", ".join(f"{k} {v:.0f}" for k, v in seconds.items()))
    busy = max(info["load_avg_1m"] or 0.0, info["load_avg_1m_end"] or 0.0)
    if "cpu" in suites and args.clock == "wall" and busy > (info["cores"] or 1):
        print(f"# warning: load average {busy:.1f} on {info['cores']} cores: other processes competed for the CPU; "
              "wall-clock CPU numbers are unreliable (try --threads 1 --clock cpu)")
    out = args.json or HERE / f"results-{args.suite}{'-quick' if args.quick else ''}.json"
    write_json(out, {"suite": args.suite, "quick": args.quick, "started": started.isoformat(), "machine": info,
                     "compile": compiled, "clock": args.clock, "seconds": seconds, "rows": [r.to_dict() for r in rows],
                     "notes": notes})
    print(f"# wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
