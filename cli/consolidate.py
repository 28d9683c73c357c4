"""`tfkit consolidate CKPT --out DIR`: a sharded checkpoint (of a run of several processes) as one file."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ..progress import console as output_console
from ..replacing import TFKIT_MODEL, check_new_folder


def consolidate(
    checkpoint: Annotated[str, typer.Argument(help="Sharded checkpoint folder, or a run folder (its latest).")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Model folder to write (never the input).")],
    force: Annotated[bool, typer.Option("--force", help="Replace an earlier output of this command.")] = False,
) -> None:
    """Write a sharded checkpoint in the single-file form: model.safetensors, config.json, the tokenizer.

    A run of several processes (torchrun) writes its checkpoints sharded: each process its part, in shards/.
    Every tfkit command reads them as they are; this writes the form other tools read, in one process and
    with one copy of the weights in memory. The optimizer state stays in the sharded checkpoint (which
    resumes at any process count): DIR is a model folder.
    """
    from ..checkpoints.consolidate import consolidate as write_single_file
    from ..checkpoints.folders import resolve_checkpoint

    check_new_folder(out, [Path(checkpoint), resolve_checkpoint(checkpoint)], force, replaces=(TFKIT_MODEL,))
    folder, model = write_single_file(checkpoint, out)
    output_console().print(f"{folder} -> {out}: {model.num_params():,} parameters in one model.safetensors",
                           highlight=False, markup=False, soft_wrap=True)
