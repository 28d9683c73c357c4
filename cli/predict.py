"""`tfkit predict CKPT --data FILE --out preds.jsonl`: a fine-tuned classifier labels every row of a file."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from ..threads import set_threads
from .options import Device

err = Console(stderr=True, highlight=False, soft_wrap=True)


def predict(
    checkpoint: Annotated[str, typer.Argument(help="A checkpoint or run folder made by `tfkit finetune` (its best/ when kept).")],
    data: Annotated[str, typer.Option("--data", help="Rows to label: .csv / .tsv / .jsonl / .parquet (gzip / zstd too) or stdlib:topics, with the text column(s) the model was fine-tuned on; no label needed.")],
    out: Annotated[Path, typer.Option("--out", help="Predictions, one row per input: .jsonl or .csv.")],
    force: Annotated[bool, typer.Option("--force", help="Replace --out when it exists.")] = False,
    batch_size: Annotated[int, typer.Option("--batch-size", help="Rows per forward pass (speed only).")] = 32,
    device: Device = "auto",
) -> None:
    """Label every row of a file with a fine-tuned classifier: the row, the predicted label and each class's
    probability (`p_<label>`), or the predicted value of a regressor.

    Rows are read, scored and written a chunk at a time with a progress bar; the file appears whole at the end.
    """
    from ..evaluation.classify import predict as run_predict  # deferred: `--help` stays fast
    from ..progress import interactive
    from ..replacing import check_not_an_input
    from ..runtime import pick_device

    check_not_an_input(out, [checkpoint, data], "--out")  # --force replaces earlier predictions, never the rows
    set_threads()
    count = run_predict(checkpoint, data, out, batch_size=batch_size, device=pick_device(device), force=force,
                        progress=interactive())
    err.print(f"wrote {count:,} predictions to {out}")
