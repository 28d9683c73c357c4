"""A prepared lab and where each of its jobs leaves its output: what every step of the lab reads.

`engine.prepare` checks a spec and builds a `Lab`; the engine trains, converts and scores its jobs, and the
modules that score, gate, probe and measure them (scoring, gates, probing, scale, documents) find a job's
checkpoint and the recipe it is scored with here. This module sits below all of them and below the engine,
so none of them imports the orchestrator back (tests/test_layering.py fails on an import circle)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..layout import CHECKPOINTS
from ..trainer.recipe import Recipe
from .plan import Job, LabOptions
from .spec import LabSpec


@dataclass
class Lab:
    spec: LabSpec
    options: LabOptions
    folder: Path
    jobs: list[Job]
    recipes: dict[str, Recipe]  # job key -> recipe, for trainings
    evals: dict[str, str]  # label -> corpus spec
    seeds: list[int]


def job_named(lab: Lab, name: str, seed: int) -> Job:
    return next(j for j in lab.jobs if j.name == name and j.seed == seed)


def final_checkpoint(run_dir: Path, steps: int) -> Path:
    return run_dir / CHECKPOINTS / f"step-{steps}"


def checkpoint_of(lab: Lab, job: Job) -> Path:
    """The checkpoint a finished job left: the final step of a run, or a converted folder."""
    if job.kind == "convert":
        return lab.folder / job.folder
    return final_checkpoint(lab.folder / job.folder, lab.recipes[job.key].train.max_steps)


def scoring_recipe(lab: Lab, job: Job) -> Recipe:
    """The recipe whose eval settings score `job`: its own, or (a conversion) its source's."""
    while job.kind == "convert":
        job = job_named(lab, job.source, job.seed)
    return lab.recipes[job.key]


def log_path(lab: Lab, name: str) -> Path:
    """logs/NAME.log: where a training's (or a tokenizer's) output goes, created on first use."""
    path = lab.folder / "logs" / f"{name.replace('/', '_')}.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path
