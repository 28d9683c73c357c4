"""`tfkit lab list | run CLAIM | report DIR`: a design claim as paired, controlled runs and a verdict."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from ..progress import console as output_console
from .options import Overrides

app = typer.Typer(help="Test Transformer design claims: paired runs, controls, held-out scores, verdicts.",
                  no_args_is_help=True)
console = output_console()


@app.command("list")
def list_claims() -> None:
    """List the claims shipped with tfkit (recipes/lab/*.yaml) and what each costs."""
    from ..lab.spec import bundled_specs, load_spec, summary

    table = Table("claim", "base", "variants", "cost", "description")
    for name, path in sorted(bundled_specs().items()):
        spec = load_spec(str(path))
        minutes = spec.cost.get("cpu_minutes")
        table.add_row(name, spec.base, str(len(spec.variants)), f"~{minutes} CPU-min" if minutes else "-", summary(path))
    console.print(table)


@app.command("run")
def run(
    claim: Annotated[str, typer.Argument(help="A bundled claim (tfkit lab list) or a spec file.")],
    data: Annotated[Optional[str], typer.Option("--data", help="Training corpus of every run (data.train).")] = None,
    evals: Annotated[Optional[list[str]], typer.Option("--eval", help="A held-out text to score on (repeatable); "
                                                       "default: the spec's, else the base recipe's data.valid.")] = None,
    seeds: Annotated[Optional[int], typer.Option("--seeds", help="Paired seeds per variant; a verdict needs at least 3. "
                                                 "Default: the spec's `seeds:` (what its margins need), else 3. More "
                                                 "seeds on a finished lab's --out continue it as a second look.")] = None,
    steps: Annotated[Optional[list[int]], typer.Option("--steps", help="train.max_steps of every run from scratch; "
                                                       "repeat it for a ladder: the whole lab at each step count "
                                                       "(folders steps-N), verdicts side by side.")] = None,
    sizes: Annotated[Optional[int], typer.Option("--sizes", help="A ladder of N model sizes: the lab at the first N "
                                                 "rungs of the spec's sizes block (else at N widths: 0.5, 1, 2, 4, 8 "
                                                 "times the base d_model), every rung at the same tokens per "
                                                 "parameter (folders d_model-W), a verdict per rung and the trend "
                                                 "of each claim across sizes.")] = None,
    overrides: Overrides = None,
    jobs: Annotated[int, typer.Option("--jobs", help="Trainings run at the same time (processes).")] = 1,
    out: Annotated[Optional[Path], typer.Option("--out", help="Lab folder; an existing lab of the same claim and "
                                                "options is continued. Default: labs/CLAIM-TIMESTAMP.")] = None,
    quick: Annotated[bool, typer.Option("--quick", help="A few steps at a tiny size: checks the lab runs, not the "
                                        "claim (no verdict). Every run still trains, is scored and probed: "
                                        "minutes, not seconds (gqa-uptrain at 3 seeds: 1 min on 2 CPU cores, "
                                        "more on a busy machine).")] = False,
) -> None:
    """Train every variant for every seed, add the controls, score on held-out text (and a `downstream` task's
    held-out labels), write the verdicts."""
    from ..lab.engine import prepare, run as run_lab
    from ..lab.plan import LabOptions
    from ..lab.report import MARKDOWN, write_report
    from ..lab.spec import load_spec

    spec = load_spec(claim)
    ladder = list(steps or [])
    options = LabOptions(seeds=seeds, steps=ladder[0] if len(ladder) == 1 else None, data=data,
                         evals=list(evals or []), sets=list(overrides or []), jobs=jobs, quick=quick)
    if sizes is not None:
        from ..errors import ConfigError
        from ..lab.engine import default_folder
        from ..lab.ladder import run_sizes
        from ..lab.sizes import size_rungs

        if len(ladder) > 1:
            raise ConfigError("sizes: a ladder is along one axis; give --sizes or repeated --steps, not both",
                              params=("sizes",))
        rungs, out = size_rungs(spec, options, sizes), out or default_folder(spec.claim)
        console.print(f"lab {spec.claim}: a ladder of {len(rungs)} model sizes ({rungs[0].key} "
                      f"{', '.join(str(r.value) for r in rungs)}, {', '.join(str(r.steps) for r in rungs)} steps) over "
                      f"{seeds or spec.seeds or 3} seed(s); folder {out}", highlight=False, markup=False)
        folder, results = run_sizes(spec, options, rungs, out)
        _show(folder, results, MARKDOWN)
        return
    if len(ladder) > 1:
        from ..lab.engine import default_folder
        from ..lab.ladder import run_ladder

        out = out or default_folder(spec.claim)
        console.print(f"lab {spec.claim}: a ladder of {len(ladder)} labs at {', '.join(map(str, sorted(ladder)))} "
                      f"steps over {seeds or spec.seeds or 3} seed(s); folder {out}", highlight=False, markup=False)
        folder, results = run_ladder(spec, options, ladder, out)
        _show(folder, results, MARKDOWN)
        return
    lab = prepare(spec, options, out)
    trainings = sum(j.kind != "convert" for j in lab.jobs)
    cost = f", about {spec.cost['cpu_minutes']} CPU-minutes at full size" if spec.cost.get("cpu_minutes") else ""
    console.print(f"lab {spec.claim}: {trainings} trainings and {len(lab.jobs) - trainings} conversions over "
                  f"{len(lab.seeds)} seed(s){cost}; folder {lab.folder}", highlight=False, markup=False)
    results = write_report(lab.folder, run_lab(lab), spec)
    _show(lab.folder, results, MARKDOWN)


@app.command("family")
def family(folders: Annotated[list[Path], typer.Argument(help="Lab folders (or ladders) whose verdicts form one "
                                                          "family.")]) -> None:
    """Holm's family-wise view over every tested verdict line of the labs given (a record's), beside each lab's
    own: which verdict words survive once every comparison of the record is counted."""
    from ..lab.family import record_family, render_record_family

    console.print(render_record_family(record_family(list(folders))), highlight=False, markup=False)


@app.command("report")
def report(folder: Annotated[Path, typer.Argument(help="A lab folder (holding results.json).")]) -> None:
    """Rebuild results.md, the verdicts and the plots of a lab folder (or of every rung of a --steps ladder and
    the ladder's summary) from its results.json."""
    from ..lab.ladder import LADDER_FILE, report_ladder
    from ..lab.report import MARKDOWN, report_folder

    _show(folder, report_ladder(folder) if (folder / LADDER_FILE).is_file() else report_folder(folder), MARKDOWN)


def _show(folder: Path, results: dict, markdown: str) -> None:
    console.print((folder / markdown).read_text(encoding="utf-8"), highlight=False, markup=False)
    written = ", ".join(str(folder / name) for name in ["results.json", markdown, *results.get("plots", [])])
    console.print(f"wrote {written}", highlight=False, markup=False)
