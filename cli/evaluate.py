"""`tfkit eval CKPT [CKPT ...] --data SPEC`: score checkpoints on the same data, one table row each.

Every checkpoint is scored on identical batches (same corpus, seq_len, seed and batch size; MLM masks
included), so the rows compare. The table goes to stdout, progress to stderr; `--json OUT` writes the
same numbers as a list, one object per checkpoint in the order given. OUT is checked before anything is
scored, so a folder or an unwritable path fails in a second rather than after the whole evaluation.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from ..errors import ConfigError
from ..progress import console as output_console
from ..replacing import check_json_out
from ..runtime import check_precision, pick_device
from ..threads import set_threads
from .json_rows import write_rows
from .options import Device
from .task_eval import evaluate_probe, evaluate_task, refuse_corpus_options

if TYPE_CHECKING:
    from ..checkpoints.record import CheckpointRecord

err = Console(stderr=True, highlight=False, soft_wrap=True)


def _num(value, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def steps_text(step, prior) -> str:
    """Training steps behind the weights: `300` for a pretraining run, `300+15` for 15 steps of uptraining a
    300-step model, `300+0` for a converted one; `-` when the checkpoint does not say (an import)."""
    if prior:
        return f"{prior:,}+{step or 0:,}"
    return _num(step, ",")


def results_table(rows: list[dict], names: list[str], data: str) -> Table:
    """One row per checkpoint: what a user compares (lower loss/ppl/bpb is better). KV-cache bytes are at
    bf16, the inference dtype, as convert-mqa-to-gqa reports them."""
    table = Table(title=f"eval on {data}")
    for column in ("checkpoint", "arch", "steps", "params", "loss", "ppl", "bits/byte", "acc", "tokens",
                   "KV B/tok (bf16)", "tok/s"):
        table.add_column(column, justify="left" if column in ("checkpoint", "arch") else "right")
    for name, r in zip(names, rows):
        table.add_row(name, r["arch"], steps_text(r["step"], r["prior_steps"]), f"{r['params']:,}",
                      f"{r['loss']:.4f}", f"{r['perplexity']:.2f}", _num(r["bits_per_byte"], ".4f"),
                      f"{100 * r['token_accuracy']:.2f}%",
                      f"{r['tokens']:,}", _num(r["kv_cache_bytes_per_token"], ","), _num(r["tokens_per_sec"], ",.0f"))
    return table


def named_corpora(items: list[str]) -> dict[str, str]:
    """name -> corpus of the --data items: `NAME=CORPUS` names one (NAME a word, as a mixture's source names;
    an item that is itself an existing path is a corpus, whatever it holds), anything else is named by itself."""
    from ..tokenization.sources import NAME

    out: dict[str, str] = {}
    for item in items:
        name, sep, spec = item.partition("=")
        if not (sep and NAME.fullmatch(name) and spec) or Path(item).exists():
            name, spec = item, item
        if name in out:
            raise ConfigError(f"data {item}: the name {name!r} is given twice, expected one corpus per name",
                              params=("data",))
        out[name] = spec
    return out


def side_by_side(by_corpus: list[dict[str, dict]], names: list[str], corpora: dict[str, str]) -> Table:
    """One row per checkpoint, each corpus's loss and bits per byte in columns of its own (several --data)."""
    table = Table(title="eval on " + ", ".join(f"{name} ({spec})" if name != spec else name
                                               for name, spec in corpora.items()))
    table.add_column("checkpoint")
    table.add_column("steps", justify="right")
    for name in corpora:
        table.add_column(f"{name} loss", justify="right")
        table.add_column(f"{name} bits/byte", justify="right")
    for ckpt, scored in zip(names, by_corpus):
        first = next(iter(scored.values()))
        cells = [c for r in scored.values() for c in (f"{r['loss']:.4f}", _num(r["bits_per_byte"], ".4f"))]
        table.add_row(ckpt, steps_text(first["step"], first["prior_steps"]), *cells)
    return table


def choose_seq_len(records: list[CheckpointRecord], seq_len: int | None, overrides: list[str] | None = None) -> int:
    """One context length for every row, or the numbers would not compare: --seq-len, or the shortest length
    the checkpoints trained at, within the smallest max_seq_len (or the one `--set model.max_seq_len` gives:
    a RoPE model scored longer than it trained, under `model.rope_scaling`)."""
    from ..evaluation.evaluate import trained_seq_len
    from ..evaluation.model_overrides import parse_model_overrides

    longer = dict(parse_model_overrides(overrides or [])).get("max_seq_len")
    max_len = longer if isinstance(longer, int) else min(record.model.max_seq_len for record in records)
    if seq_len is None:
        seq_len = min(trained_seq_len(record) for record in records)
        if seq_len < max_len:
            err.print(f"scoring at seq_len {seq_len}, the length the checkpoints trained at "
                      f"(--seq-len takes up to {max_len})")
    elif not 1 <= seq_len <= max_len:
        raise ConfigError(f"--seq-len must be in 1..{max_len} (the smallest max_seq_len of the checkpoints), "
                          f"got {seq_len}")
    return seq_len


def check_limits(max_tokens: int | None, max_batches: int | None) -> None:
    if max_tokens is not None and max_tokens < 1:
        raise ConfigError(f"--max-tokens must be >= 1, got {max_tokens}")
    if max_batches is not None and max_batches < 1:
        raise ConfigError(f"--max-batches must be >= 1, got {max_batches}")


def evaluate(
    checkpoints: Annotated[list[str], typer.Argument(help="Checkpoint folders or run folders (latest checkpoint each).")],
    data: Annotated[Optional[list[str]], typer.Option("--data", help="Corpus to score: a file, folder, glob, JSONL, or "
                                                      "stdlib:docs:valid; repeat it (NAME=CORPUS) to score several "
                                                      "side by side, e.g. the sources of a mixture.")] = None,
    task: Annotated[Optional[Path], typer.Option("--task", help="Instead of --data: a JSONL task file scored by log-likelihood, multiple choice ({\"context\", \"choices\", \"gold\"}) or cloze ({\"text\"}), GPT checkpoints.")] = None,
    probe: Annotated[Optional[str], typer.Option("--probe", help="Instead of --data: a linear probe's held-out accuracy on frozen mean-pooled features of labelled data (stdlib:topics, a file with text and label columns, or '{data: FILE, text: COL, label: COL}'), as eval.probe scores it during training.")] = None,
    json_out: Annotated[Optional[Path], typer.Option("--json", help="Also write the results as a JSON list to this file.")] = None,
    batch_size: Annotated[int, typer.Option("--batch-size", help="Sequences per forward pass (speed only: every example is scored, with the same masks).")] = 8,
    max_tokens: Annotated[Optional[int], typer.Option("--max-tokens", help="Stop once this many tokens are scored: predicted tokens, so masked ones for BERT (default: all).")] = None,
    max_batches: Annotated[Optional[int], typer.Option("--max-batches", help="Stop after this many batches (default: all).")] = None,
    seq_len: Annotated[Optional[int], typer.Option("--seq-len", help="Context length (default: the length the checkpoints trained at, the smallest if they differ).")] = None,
    stride: Annotated[Optional[int], typer.Option("--stride", help="GPT: sliding-window perplexity, scoring `stride` new tokens per window.")] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the evaluation batches (MLM masks): keep it to compare runs.")] = 0,
    text_field: Annotated[str, typer.Option("--text-field", help="JSON/JSONL key holding the text.")] = "text",
    overrides: Annotated[Optional[list[str]], typer.Option("--set", metavar="model.KEY=VALUE", help="Evaluate under another value of a model key that keeps every weight (repeatable), e.g. --set model.attention=naive or model.attn_scale=none.")] = None,
    device: Device = "auto",
    dtype: Annotated[str, typer.Option("--dtype", help="auto (the precision each checkpoint trained in), fp32, "
                                       "bf16 or fp16 (autocast).")] = "auto",
) -> None:
    """Evaluate checkpoints on a corpus: loss, perplexity, bits per byte, token accuracy, parameters,
    KV-cache bytes per token and throughput, one table row per checkpoint.

    GPT checkpoints are scored on next-token prediction, BERT on masked tokens (the same masks for every
    checkpoint), encoder-decoders on their seq2seq objective. Bits per byte divides by the text's UTF-8
    bytes rather than tokens, so checkpoints with different tokenizers compare. `--set model.KEY=VALUE`
    scores every checkpoint under another setting that changes no weight (a key that would is refused).

    `--task FILE` scores GPT checkpoints on a downstream task instead, as lm-evaluation-harness does:
    multiple-choice accuracy by log-likelihood (acc, and acc_norm per byte of the choice) or cloze
    last-word accuracy (LAMBADA), each with its standard error.
    """
    from ..checkpoints.folders import chosen_note, read_checkpoint
    from ..checkpoints.record import CheckpointRecord
    from ..tokenization.corpus import check_text_field

    if sum(bool(given) for given in (data, task, probe)) != 1:
        raise ConfigError("give --data CORPUS (loss, perplexity), --task FILE (downstream accuracy) or --probe DATA "
                          "(a linear probe's accuracy), one of them")
    corpora = named_corpora(data or [])
    if json_out is not None:  # the options first, then every argument resolved, then the work
        check_json_out(json_out, [*checkpoints, *corpora.values(), *([task] if task else []), *([probe] if probe else [])])
    if task is not None or probe is not None:
        refuse_corpus_options({"--seq-len": seq_len, "--stride": stride, "--max-tokens": max_tokens,
                               "--max-batches": max_batches, "--set": overrides or None})
    else:
        for spec in corpora.values():
            check_text_field(spec, text_field)
        check_limits(max_tokens, max_batches)
    records = []
    for path in checkpoints:  # every argument resolved before any work (a run's best/ when it kept one)
        folder, record = read_checkpoint(path, CheckpointRecord.read, best=True)
        records.append(record)
        if note := chosen_note(path, folder):
            err.print(note)
    if any(record.is_classifier for record in records):  # made by `tfkit finetune`: scored on labelled rows
        if task is not None or probe is not None:
            raise ConfigError("--task and --probe score language models; a classifier made by `tfkit finetune` is "
                              "scored on labelled rows: --data FILE")
        from .evaluate_labelled import evaluate_labelled

        if len(corpora) > 1:
            raise ConfigError("a classifier made by `tfkit finetune` is scored on one labelled file: give one --data")
        return evaluate_labelled(checkpoints, next(iter(corpora.values())), json_out, batch_size, device)
    from ..evaluation.evaluate import EvalRequest, evaluate_corpora

    torch_device, precision = pick_device(device), check_precision(dtype, allow_auto=True)
    set_threads()  # the cores the machine's load leaves free
    if task is not None:
        return evaluate_task(checkpoints, task, json_out=json_out, batch_size=batch_size, device=torch_device,
                             dtype=dtype)
    if probe is not None:
        return evaluate_probe(checkpoints, probe, json_out=json_out, device=torch_device, dtype=dtype)
    request = EvalRequest(batch_size=batch_size, max_batches=max_batches, max_tokens=max_tokens,
                          seq_len=choose_seq_len(records, seq_len, overrides), stride=stride, device=torch_device,
                          dtype=precision, seed=seed, text_field=text_field, overrides=tuple(overrides or ()),
                          best=True)
    rows, by_corpus = [], []
    for number, ckpt in enumerate(checkpoints, start=1):  # a plain line each: progress on a terminal or off one
        started = time.perf_counter()
        scored = evaluate_corpora(ckpt, corpora, request)
        by_corpus.append(scored)
        rows += [{**row, "name": name} if len(corpora) > 1 else row for name, row in scored.items()]
        losses = ", ".join(f"{'' if len(corpora) == 1 else name + ' '}{r['loss']:.4f} on {r['tokens']:,} tokens"
                           for name, r in scored.items())
        err.print(f"[{number}/{len(checkpoints)}] {ckpt}: loss {losses} ({rows[-1]['dtype']}), "
                  f"{time.perf_counter() - started:.1f} s")
    console = output_console()
    if len(corpora) > 1:
        console.print(side_by_side(by_corpus, checkpoints, corpora))
    else:
        console.print(results_table(rows, checkpoints, next(iter(corpora.values()))))
    if note := mixed_objectives_note(rows):
        err.print(note)
    if json_out is not None:
        write_rows(json_out, rows)


def mixed_objectives_note(rows: list[dict]) -> str | None:
    """A note when the rows score different objectives, whose losses do not compare; else None."""
    objectives = sorted({r["objective"] for r in rows})
    if len(objectives) < 2:
        return None
    return (f"note: these rows score different objectives ({', '.join(objectives)}: masked tokens seen from both "
            "sides, next tokens, a target given its source): their losses, perplexities and bits per byte measure "
            "different tasks and do not compare across objectives")
