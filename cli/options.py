"""Options shared by several commands, defined once so their names and help read the same everywhere."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

Overrides = Annotated[
    Optional[list[str]],
    typer.Option("--set", metavar="SECTION.KEY=VALUE", help="Override a recipe key (repeatable), e.g. --set train.max_steps=20."),
]
Device = Annotated[str, typer.Option("--device", help="auto, cpu, cuda or cuda:N.")]
Dtype = Annotated[str, typer.Option("--dtype", help="fp32, bf16 or fp16: the dtype the weights are cast to for decoding.")]
