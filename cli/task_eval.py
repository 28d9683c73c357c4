"""`tfkit eval CKPT... --task FILE`: the downstream-task half of `tfkit eval`, one table row per checkpoint.

The task file is read and checked whole before any checkpoint is loaded, and `--json` before anything is
scored (cli/evaluate.py checks it), so a bad line or path costs a second, not a scoring run.
"""

from __future__ import annotations

import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from ..errors import ConfigError
from ..progress import console as output_console
from .json_rows import write_rows

err = Console(stderr=True, highlight=False, soft_wrap=True)


def _percent(row: dict, key: str) -> str:
    if row.get(key) is None:
        return "-"
    return f"{100 * row[key]:.2f} ± {100 * row[key + '_stderr']:.2f}"


def task_table(rows: list[dict], names: list[str], task: str, kind: str) -> Table:
    """acc (and acc_norm, or perplexity for a cloze task) with their standard errors, one row per checkpoint."""
    table = Table(title=f"{task} ({kind.replace('_', ' ')}, {rows[0]['items']:,} items)")
    last = "acc_norm %" if kind == "multiple_choice" else "ppl"
    for column in ("checkpoint", "params", "acc %", last, "items/s"):
        table.add_column(column, justify="left" if column == "checkpoint" else "right")
    for name, r in zip(names, rows):
        tail = _percent(r, "acc_norm") if kind == "multiple_choice" else f"{r['perplexity']:.2f}"
        table.add_row(name, f"{r['params']:,}", _percent(r, "acc"), tail,
                      "-" if r["items_per_sec"] is None else f"{r['items_per_sec']:,.1f}")
    return table


def refuse_corpus_options(given: dict[str, object]) -> None:
    """The corpus options mean nothing for a task (each item is scored whole): refused, not ignored."""
    named = [flag for flag, value in given.items() if value is not None]
    if named:
        raise ConfigError(f"{', '.join(named)}: options of --data scoring; --task scores each item whole and "
                          "takes none of them")


def evaluate_task(checkpoints: list[str], task_file: Path, *, json_out: Path | None, batch_size: int,
                  device, dtype: str) -> None:
    """Score every checkpoint on the task file, print the table, write `--json` (already checked)."""
    from ..evaluation.builtin_tasks import load_task
    from ..evaluation.task_scores import score_task

    task = load_task(task_file)  # a file, or a built-in task (stdlib:docs-cloze, stdlib:docs-choice)
    rows = []
    for number, ckpt in enumerate(checkpoints, start=1):
        started = time.perf_counter()
        rows.append(score_task(ckpt, task, batch_size=batch_size, device=device, dtype=dtype))
        err.print(f"[{number}/{len(checkpoints)}] {ckpt}: acc {rows[-1]['acc']:.4f} on {len(task.items):,} items, "
                  f"{time.perf_counter() - started:.1f} s")
    output_console().print(task_table(rows, checkpoints, task.name, task.kind))
    if json_out is not None:
        write_rows(json_out, rows)


def evaluate_probe(checkpoints: list[str], probe: str, *, json_out: Path | None, device, dtype: str) -> None:
    """`--probe DATA`: the linear probe's held-out accuracy per checkpoint, as `eval.probe` scores it in training.
    DATA is labelled data (stdlib:topics, a file with text and label columns) or, as the recipe key, a YAML
    mapping `{data: FILE, text: COLUMN, label: COLUMN}`."""
    from ..evaluation.probe import probe_checkpoint
    from ..yamlfile import safe_load

    spec = probe
    if probe.lstrip().startswith("{"):
        spec = safe_load(probe)
        if not isinstance(spec, dict) or not isinstance(spec.get("data"), str):
            raise ConfigError(f"--probe {probe}: expected labelled data or a mapping {{data: FILE, text: COLUMN, "
                              "label: COLUMN}")
    rows = []
    for number, ckpt in enumerate(checkpoints, start=1):
        started = time.perf_counter()
        rows.append(probe_checkpoint(ckpt, spec, device=device, dtype=dtype))
        err.print(f"[{number}/{len(checkpoints)}] {ckpt}: probe accuracy {rows[-1]['acc']:.4f} on "
                  f"{rows[-1]['valid_rows']:,} held-out rows, {time.perf_counter() - started:.1f} s")
    table = Table(title=f"linear probe on {rows[0]['probe']} ({rows[0]['train_rows']:,} rows fitted, "
                        f"{rows[0]['valid_rows']:,} held out, {rows[0]['classes']} classes)")
    for column in ("checkpoint", "arch", "acc %"):
        table.add_column(column, justify="left" if column != "acc %" else "right")
    for name, r in zip(checkpoints, rows):
        table.add_row(name, r["arch"], f"{100 * r['acc']:.2f}")
    output_console().print(table)
    if json_out is not None:
        write_rows(json_out, rows)
