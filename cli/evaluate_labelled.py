"""`tfkit eval CKPT... --data labelled.csv` for checkpoints made by `tfkit finetune`: the task's scores side by
side, one row per checkpoint (cli/evaluate.py hands such checkpoints here)."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table

from ..progress import console as output_console
from ..runtime import pick_device
from ..threads import set_threads

err = Console(stderr=True, highlight=False, soft_wrap=True)
SCORES = ("accuracy", "macro_f1", "matthews", "pearson", "spearman")


def scores_table(rows: list[dict], names: list[str], data: str) -> Table:
    """Checkpoint, task, examples, loss and every score any row has (higher is better)."""
    shown = [s for s in SCORES if any(s in r for r in rows)]
    table = Table(title=f"eval on {data}")
    for column in ("checkpoint", "arch", "task", "examples", "loss", *shown):
        table.add_column(column, justify="left" if column in ("checkpoint", "arch", "task") else "right")
    for name, r in zip(names, rows):
        table.add_row(name, r["arch"], r["task"], f"{r['examples']:,}", f"{r['loss']:.4f}",
                      *(f"{r[s]:.4f}" if s in r else "-" for s in shown))
    return table


def evaluate_labelled(checkpoints: list[str], data: str, json_out: Path | None, batch_size: int, device: str) -> None:
    from ..evaluation.classify import score_classifier
    from ..replacing import check_json_out
    from .json_rows import write_rows

    torch_device = pick_device(device)
    set_threads()
    if json_out is not None:
        check_json_out(json_out, [*checkpoints, data])
    rows = []
    for number, ckpt in enumerate(checkpoints, start=1):
        rows.append(score_classifier(ckpt, data, batch_size=batch_size, device=torch_device))
        err.print(f"[{number}/{len(checkpoints)}] {ckpt}: {rows[-1]['examples']:,} examples")
    output_console().print(scores_table(rows, checkpoints, data))
    if json_out is not None:
        write_rows(json_out, rows)
