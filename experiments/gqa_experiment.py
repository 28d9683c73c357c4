"""GQA uptraining at small scale on CPU: does the paper's ordering survive a 1M-parameter model?

Ainslie et al. (2023) convert a multi-head (MHA) checkpoint to grouped-query (GQA) or multi-query (MQA)
attention by mean-pooling each group's key/value heads, then uptrain for α = 5% of the original steps.
They report: mean pooling beats keeping the first head, which beats random initialisation; uptrained GQA
comes close to the MHA quality while decoding nearly as fast as MQA. This script repeats the recipe with
tfkit's own pieces, end to end:

1. pretrain an MHA GPT (gpt-tiny recipe with 8 heads) for N steps on the stdlib docs (`tfkit pretrain`);
2. convert it to GQA-2 and MQA with mean, first and random (`tfkit convert-mqa-to-gqa`'s code);
3. score each right after conversion (`tfkit eval`'s `evaluate`, identical batches for all);
4. uptrain each for α·N steps with the bundled `gqa-uptrain` recipe, and the MHA model itself for the same
   steps as the control (extra steps help MHA too, so "GQA close to MHA" is judged against that control);
5. time greedy decoding (tfkit.models.generation's prefill / decode_step) of MHA, GQA-2 and MQA,
   interleaved per round so a busy host slows every variant alike: on the trained models, and on the same
   shape with random weights at a long context, where the KV cache (what GQA shrinks) dominates.

    python -m experiments.gqa_experiment [--quick] [--steps N] [--threads N] [--work DIR] [--json OUT]

Run from the repository root. The full run takes about 5 minutes on one thread of a 2-core CPU; `--quick`
(40 steps, a small tokenizer) checks that the script still runs and records nothing. The latest results are in
experiments/RESULTS.md ("GQA uptraining"); `tfkit lab run gqa-uptrain` asks the same questions with seeds,
controls and verdicts (docs/lab.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import statistics
import sys
import time
from dataclasses import dataclass
from datetime import date
from pathlib import Path

import torch

from tfkit.checkpoints.convert import convert_checkpoint
from tfkit.checkpoints.weights import load_model
from tfkit.cli.convert import uptrain_overrides
from tfkit.evaluation.evaluate import EvalRequest, evaluate
from tfkit.models import build_model, kv_cache_bytes_per_token
from tfkit.models.convert import attention_params
from tfkit.models.generation import decode_step, prefill
from tfkit.replacing import TFKIT_MODEL, check_new_folder
from tfkit.trainer.recipe import load_recipe
from tfkit.trainer.run import pretrain

from benchmarks.common import machine

HERE = Path(__file__).resolve().parent
VALID = "stdlib:docs:valid"
METHODS = ("mean", "first", "random")
# The trainer's own end-of-run validation is kept minimal (eval.batches=2): every number reported here
# comes from evaluate on the same validation batches, not from the runs' reports.
QUIET = ["log.progress=false", "log.tensorboard=false", "log.plot=false", "eval.sample_prompt=null",
         "eval.batches=2"]


@dataclass(frozen=True)
class Setup:
    steps: int  # pretraining steps N; uptraining runs round(alpha * N)
    tokenizer: tuple[str, ...]  # overrides of gpt-tiny's tokenizer section
    n_layers: int
    eval_tokens: int  # validation tokens scored per checkpoint (the same batches for every one)
    decode_rounds: int
    long_context: int  # prompt length of the random-weights decode probe
    alpha: float = 0.05
    n_heads: int = 8
    kv_groups: tuple[int, ...] = (2, 1)  # GQA-2 and MQA


FULL = Setup(steps=400, tokenizer=(), n_layers=2, eval_tokens=65_536, decode_rounds=7, long_context=1536)
QUICK = Setup(steps=40, tokenizer=("tokenizer.vocab_size=1024", "tokenizer.max_train_mb=0.5"), n_layers=2,
              eval_tokens=4_096, decode_rounds=2, long_context=256)


def log(message: str, start: float) -> None:
    print(f"[gqa {time.perf_counter() - start:6.1f}s] {message}", file=sys.stderr, flush=True)


def val_loss(checkpoint: Path, setup: Setup, work: Path) -> float:
    """Mean next-token loss on the first `eval_tokens` validation tokens (identical batches every call)."""
    request = EvalRequest(batch_size=16, seq_len=128, max_tokens=setup.eval_tokens, cache_dir=work / "eval-tokens",
                          show_progress=False)
    return evaluate(checkpoint, VALID, request)["loss"]


def train(recipe: str, overrides: list[str], run_dir: Path, work: Path) -> Path:
    """Run a bundled recipe with overrides through tfkit's pretrain API; returns its final checkpoint."""
    shared = [f"data.cache_dir={work / 'tokens'}", *QUIET]  # token shards built once, reused by every run
    result = pretrain(load_recipe(recipe, overrides + shared), run_dir=run_dir)
    return result.checkpoint


@torch.inference_mode()
def decode_speed(models: dict[str, torch.nn.Module], batch: int, context: int, steps: int,
                 rounds: int) -> dict[str, dict]:
    """Greedy decode tokens per second after a prefill (prefill not timed), MHA/GQA/MQA interleaved in
    every round (order reversed on odd rounds); medians, and the median per-round speed-up over MHA.

    Timed on one intra-op thread by the thread's CPU clock as well as by the wall clock: on a shared host
    the wall clock also counts the time other processes held the core, the CPU clock only the work done
    (cache and memory stalls included, which is where a smaller KV cache pays off).
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    wall: dict[str, list[float]] = {name: [] for name in models}
    cpu: dict[str, list[float]] = {name: [] for name in models}
    try:
        for r in range(rounds):
            for name in list(models) if r % 2 == 0 else reversed(list(models)):
                model = models[name]
                prompt = torch.randint(0, model.config.vocab_size, (batch, context),
                                       generator=torch.Generator().manual_seed(r))  # (B, T)
                cache = model.new_kv_cache(batch, context + steps + 1)
                token = prefill(model, prompt, cache).argmax(-1, keepdim=True)  # (B, 1)
                start_wall, start_cpu = time.perf_counter(), time.thread_time()
                with torch.inference_mode():
                    for pos in range(context, context + steps):
                        step = decode_step(model, token, torch.tensor(pos), cache)  # (B, V)
                        token = step.argmax(-1, keepdim=True)  # (B, 1)
                cpu[name].append(batch * steps / (time.thread_time() - start_cpu))
                wall[name].append(batch * steps / (time.perf_counter() - start_wall))
    finally:
        torch.set_num_threads(threads)

    def speedup(samples: dict[str, list[float]], name: str) -> float:
        return statistics.median(a / b for a, b in zip(samples[name], samples["MHA"]))

    return {name: {"cpu_tok_per_s": statistics.median(cpu[name]), "cpu_x_mha": speedup(cpu, name),
                   "wall_tok_per_s": statistics.median(wall[name]), "wall_x_mha": speedup(wall, name),
                   "kv_bytes_per_token_fp32": kv_cache_bytes_per_token(models[name].config, torch.float32)}
            for name in models}


def random_like(model: torch.nn.Module, max_seq_len: int) -> torch.nn.Module:
    """The same architecture with a longer context and fresh weights (speed does not depend on values)."""
    cfg = model.config
    torch.manual_seed(0)
    return build_model(type(cfg)(**{**cfg.to_dict(), "max_seq_len": max_seq_len})).eval()


def run(setup: Setup, work: Path) -> dict:
    start = time.perf_counter()
    up_steps = max(1, round(setup.alpha * setup.steps))
    # 1. pretrain MHA
    base = ["model.n_heads=" + str(setup.n_heads), f"model.n_layers={setup.n_layers}",
            f"train.max_steps={setup.steps}", f"schedule.warmup_steps={max(1, setup.steps // 10)}",
            f"train.eval_every={setup.steps}", f"train.save_every={setup.steps}", "train.device=cpu",
            *setup.tokenizer]
    log(f"pretraining MHA for {setup.steps} steps", start)
    mha = train("gpt-tiny", base, work / "mha", work)
    results = {"MHA": {"kv_heads": setup.n_heads, "method": None, "converted": val_loss(mha, setup, work)}}
    up = [f"train.max_steps={up_steps}", f"train.eval_every={up_steps}", f"train.save_every={up_steps}",
          f"schedule.warmup_steps={min(2, up_steps - 1) if up_steps > 1 else 0}", "train.device=cpu"]
    # 2-4. convert, score, uptrain
    for groups in setup.kv_groups:
        for method in METHODS:
            name = ("MQA" if groups == 1 else f"GQA-{groups}") + f" {method}"
            out = work / f"conv-{groups}-{method}"
            check_new_folder(out, [mha], force=False, replaces=(TFKIT_MODEL,))
            _, converted = convert_checkpoint(mha, out, groups, method, seed=0)
            loss = val_loss(out, setup, work)
            log(f"{name}: loss right after conversion {loss:.4f}; uptraining {up_steps} steps", start)
            uptrained = train("gqa-uptrain", uptrain_overrides(out, converted.config) + up,
                              work / f"up-{groups}-{method}", work)
            results[name] = {"kv_heads": groups, "method": method, "converted": loss,
                             "uptrained": val_loss(uptrained, setup, work), "checkpoint": str(uptrained)}
    log(f"MHA control: uptraining {up_steps} steps", start)
    mha_cfg = load_model(mha)[1]
    control = train("gqa-uptrain", uptrain_overrides(mha, mha_cfg) + up, work / "up-mha", work)
    results["MHA"].update(uptrained=val_loss(control, setup, work), checkpoint=str(control))
    for row in results.values():
        model, cfg = load_model(row["checkpoint"])
        row.update(params=model.num_params(), attention_params=attention_params(model),
                   kv_bytes_per_token_bf16=kv_cache_bytes_per_token(cfg))
    # 5. decode speed
    log("timing decoding", start)
    trained = {"MHA": load_model(results["MHA"]["checkpoint"])[0]}
    for groups in setup.kv_groups:
        label = "MQA" if groups == 1 else f"GQA-{groups}"
        trained[label] = load_model(results[f"{label} mean"]["checkpoint"])[0]
    torch.manual_seed(0)
    short = decode_speed(trained, batch=16, context=192, steps=48, rounds=setup.decode_rounds)
    long_models = {k: random_like(m, setup.long_context + 64) for k, m in trained.items()}
    long = decode_speed(long_models, batch=16, context=setup.long_context, steps=32, rounds=setup.decode_rounds)
    return {"setup": setup.__dict__, "uptrain_steps": up_steps, "date": date.today().isoformat(),
            "machine": {**machine(), "threads": torch.get_num_threads()},
            "seconds": round(time.perf_counter() - start, 1), "loss": results,
            "decode": {"trained_B16_T192": short, f"random_B16_T{setup.long_context}": long}}


def tables(payload: dict) -> str:
    """The two Markdown tables: quality per conversion, decode speed per layout."""
    s = payload["setup"]
    lines = [f"validation loss ({VALID}, {s['eval_tokens']:,} tokens max; lower is better); pretrain "
             f"{s['steps']} steps, uptrain {payload['uptrain_steps']} (alpha={s['alpha']})", "",
             "| model | KV heads | method | params | KV B/token (bf16) | right after conversion | after uptraining |",
             "| --- | ---: | --- | ---: | ---: | ---: | ---: |"]
    for name, r in payload["loss"].items():
        after = "MHA control: " if name == "MHA" else ""
        lines.append(f"| {name.split()[0]} | {r['kv_heads']} | {r['method'] or '(original)'} | {r['params']:,} | "
                     f"{r['kv_bytes_per_token_bf16']:,} | {r['converted']:.4f} | {after}{r['uptrained']:.4f} |")
    names = list(payload["decode"]["trained_B16_T192"])
    lines += ["", f"greedy decoding, batch 16, fp32, 1 thread, median of {s['decode_rounds']} interleaved rounds: "
              "tokens per CPU-second (x MHA) | wall tokens/s (x MHA)", "",
              "| case | " + " | ".join(names) + " |", "| --- |" + " ---: |" * len(names)]
    for case, row in payload["decode"].items():
        lines.append(f"| {case} | " + " | ".join(
            f"{v['cpu_tok_per_s']:,.0f} ({v['cpu_x_mha']:.2f}x) / {v['wall_tok_per_s']:,.0f} ({v['wall_x_mha']:.2f}x)"
            for v in row.values()) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.gqa_experiment",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: 40 steps, small tokenizer, few tokens (about a minute on a busy host); "
                             "not for recording")
    parser.add_argument("--steps", type=int, default=None, help="pretraining steps N (default 400, quick 40)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads (default 1: on a shared host two OpenMP threads wait for each "
                             "other at every op; 0 = torch's default)")
    parser.add_argument("--work", type=Path, default=None, help="scratch folder (default runs/gqa-experiment[-quick])")
    parser.add_argument("--json", type=Path, default=None,
                        help="results file (default experiments/gqa_experiment.json; --quick: in the work folder)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    suffix = "-quick" if args.quick else ""
    work = args.work or Path("runs") / f"gqa-experiment{suffix}"
    shutil.rmtree(work, ignore_errors=True)  # a scratch folder: every run starts from nothing
    setup = QUICK if args.quick else FULL
    if args.steps:
        setup = dataclasses.replace(setup, steps=args.steps)
    payload = run(setup, work)
    payload["quick"] = args.quick
    out = args.json or (work / "gqa_experiment.json" if args.quick else HERE / "gqa_experiment.json")
    out.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    print(tables(payload))
    print(f"\n{payload['machine']['cpu']}, {payload['machine']['cores']} cores, torch {payload['machine']['torch']}, "
          f"{payload['seconds']:.0f} s; JSON: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
