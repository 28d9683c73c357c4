"""Options shared by several commands, defined once so their names and help read the same everywhere."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

Overrides = Annotated[
    Optional[list[str]],
    typer.Option("--set", metavar="SECTION.KEY=VALUE", help="Override a recipe key (repeatable), e.g. --set train.max_steps=20."),
]
Device = Annotated[str, typer.Option("--device", help="auto, cpu, cuda or cuda:N.")]
Dtype = Annotated[str, typer.Option("--dtype", help="fp32, bf16 or fp16: the dtype the weights are cast to for decoding.")]
RunDir = Annotated[
    Optional[Path],
    typer.Option("--run-dir", help="Run folder (default: log.run_dir, else runs/<recipe>-<timestamp>)."),
]
Resume = Annotated[
    Optional[str],
    typer.Option("--resume", metavar="auto|PATH",
                 help="auto: continue the latest checkpoint of the run folder (the newest runs/<recipe>-* without "
                      "--run-dir), or start fresh if there is none; PATH: a checkpoint or run folder to continue. A "
                      "resume trains with the run folder's own recipe.yaml plus the --set overrides given now."),
]
ResumeForce = Annotated[
    bool,
    typer.Option("--force", help="With --resume: train on the data RECIPE and --set name even where it differs "
                                 "from the run's (refused otherwise)."),
]
