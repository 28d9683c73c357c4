"""What a lab runs: the spec's variants and seeds expanded into jobs, and every job's recipe resolved.

Jobs come in dependency order: trainings from scratch (the spec's variants, plus a from-scratch baseline
for every key/value head count a conversion produces), then conversions of the `convert.from` variant,
then uptraining of each conversion for a fraction of the original steps together with its control, the
`convert.from` model trained for the same extra steps (an uptrained GQA model must beat more training of
the model it came from, not only the conversion it started at). Under `sweep` each variant is trained at
every value of the swept key (`sweep_runs`). Last, a `downstream` block fine-tunes every trained variant once
per head (rows VARIANT+HEAD), starting from that seed's final checkpoint. Every recipe is loaded here, before
any compute is spent, so a bad key in any variant is one error naming the variant."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ..errors import ConfigError
from ..tokenization.sources import is_mixture
from ..trainer.recipe import Recipe, load_recipe
from .spec import LabSpec, conversion_name, downstream_rows, scratch_names, sweep_runs, uptrain_suffix

# --quick: the engine, not the science. Tiny model, tokenizer and run; applied after the spec's own `set`,
# before the variants' overrides (so a variant still differs from the reference in what it is about). A spec's own
# `quick` list comes after QUICK and again after each variant's overrides, e.g. to cap the steps of a variant
# that trains longer (a small batch over as many tokens).
# --quick for the fine-tuning of a `downstream` block: a few updates on short examples (the model is the
# checkpoint's, already tiny).
QUICK_DOWNSTREAM = ("data.seq_len=32", "train.max_steps=8", "train.batch_size=8", "train.log_every=4",
                    "train.eval_every=8", "train.save_every=8", "schedule.warmup_steps=1", "eval.batch_size=16")
QUICK = ("model.d_model=32", "model.n_layers=1", "model.n_heads=4", "model.max_seq_len=64", "data.seq_len=32",
         "tokenizer.vocab_size=320", "tokenizer.max_train_mb=0.1", "train.max_steps=8", "train.batch_size=4",
         "train.log_every=4", "train.eval_every=4", "train.save_every=8", "schedule.warmup_steps=2",
         "eval.batches=2", "eval.batch_size=4")


@dataclass
class LabOptions:
    """What `tfkit lab run` was asked for; stored in the lab folder so a resumed lab runs the same plan."""
    seeds: int = 3  # verdict.MIN_SEEDS: fewer give numbers and no verdict word
    steps: int | None = None  # train.max_steps of every run from scratch
    data: str | None = None  # data.train of the base recipe
    evals: list[str] = field(default_factory=list)  # held-out texts; empty = the spec's, else data.valid
    sets: list[str] = field(default_factory=list)  # --set overrides of the base recipe
    jobs: int = 1  # trainings run at the same time
    quick: bool = False

    def to_dict(self) -> dict:
        return {"seeds": self.seeds, "steps": self.steps, "data": self.data, "evals": self.evals,
                "sets": self.sets, "quick": self.quick}


LM_KINDS = ("train", "uptrain")  # jobs that train a language model: scored on text, with curves and a scale


@dataclass
class Job:
    """One run of the lab: a training (`train`, `uptrain`, `finetune`) or a conversion (`convert`) for one seed."""
    name: str  # the row of the results table
    seed: int
    kind: str  # train | convert | uptrain | finetune (LM_KINDS: those that train a language model)
    overrides: list[str] = field(default_factory=list)  # the variant's own, on top of the base
    source: str | None = None  # name of the job whose checkpoint this one starts from
    kv_heads: int | None = None
    method: str | None = None
    fraction: float | None = None

    @property
    def key(self) -> str:
        return f"{self.name}/seed-{self.seed}"

    @property
    def folder(self) -> str:
        """Relative to the lab folder: runs/NAME/seed-S (a run folder) or converted/NAME/seed-S (a checkpoint)."""
        safe = re.sub(r"[^\w.+%-]", "_", self.name)
        return f"{'converted' if self.kind == 'convert' else 'runs'}/{safe}/seed-{self.seed}"


def seed_values(base_seed: int, n: int) -> list[int]:
    return [base_seed + i for i in range(n)]


def plan_jobs(spec: LabSpec, seeds: list[int]) -> list[Job]:
    """Every job of the lab, a job always after the ones it starts from."""
    conv, up = spec.convert or {}, spec.uptrain or {}
    trains = [(n, o) for runs in sweep_runs(spec).values() for n, o in runs.items()]
    trains += [(n, [f"model.n_kv_heads={k}"]) for k, n in scratch_names(spec).items() if n not in spec.variants]
    jobs = [Job(name, s, "train", list(o)) for s in seeds for name, o in trains]
    for s in seeds:
        for k in conv.get("kv_heads", []):
            for m in conv.get("methods", []):
                jobs.append(Job(conversion_name(k, m), s, "convert", source=conv["from"], kv_heads=k, method=m))
    for s in seeds:
        for f in up.get("fractions", []):
            for k in conv.get("kv_heads", []):
                for m in conv.get("methods", []):
                    jobs.append(Job(conversion_name(k, m) + uptrain_suffix(f), s, "uptrain",
                                    [f"model.n_kv_heads={k}"], source=conversion_name(k, m), kv_heads=k, fraction=f))
            jobs.append(Job(f"{conv['from']}{uptrain_suffix(f)}", s, "uptrain", [], source=conv["from"], fraction=f))
    for s in seeds:
        jobs += [Job(name, s, "finetune", overrides, source=variant)
                 for name, (variant, overrides) in downstream_rows(spec).items()]
    return jobs


def base_overrides(spec: LabSpec, options: LabOptions) -> list[str]:
    """The overrides every recipe of the lab gets, in order: spec, --quick, --data, --steps, --set."""
    out = list(spec.set)
    if options.quick:
        out += [*QUICK, *spec.quick]
    if options.data:
        out.append(f"data.train={options.data}")
    if options.steps:
        out.append(f"train.max_steps={options.steps}")
    return out + list(options.sets)


def job_recipe(spec: LabSpec, options: LabOptions, job: Job, by_name: dict[str, Job]) -> Recipe:
    """The recipe of a training job: base, lab overrides, the variant's (a job that starts from another
    also gets its source's, and uptraining its steps and the spec's uptrain.set)."""
    if job.kind == "finetune":  # its own recipe, from the variant's checkpoint (its path is set when it runs)
        downstream = spec.downstream or {}
        quick = list(QUICK_DOWNSTREAM) if options.quick else []
        return load_recipe(spec.recipe_path(downstream["recipe"]),
                           [*downstream["set"], *quick, *job.overrides, f"train.init_from={job.source}"])
    chain, extra = [], []
    if job.kind == "uptrain":
        source = by_name[job.source]
        root = by_name[source.source] if source.kind == "convert" else source  # the model trained from scratch
        steps = load_recipe(spec.base_path(), base_overrides(spec, options) + root.overrides).train.max_steps
        chain = root.overrides
        extra = [f"train.max_steps={max(1, round(job.fraction * steps))}", *(spec.uptrain or {}).get("set", [])]
    tail = spec.quick if options.quick else []  # after the variant's own: a spec can shorten what a variant lengthens
    return load_recipe(spec.base_path(), base_overrides(spec, options) + chain + job.overrides + extra + tail)


def resolve_recipes(spec: LabSpec, options: LabOptions, jobs: list[Job]) -> dict[str, Recipe]:
    """job key -> recipe for every training job; one ConfigError naming each variant whose recipe fails."""
    by_name = {j.name: j for j in jobs}
    recipes, problems = {}, []
    for job in jobs:
        if job.kind == "convert":
            continue
        try:
            recipes[job.key] = job_recipe(spec, options, job, by_name)
            for key in ("train", "valid"):  # a lab's rows compare on one corpus, read as one
                if is_mixture(getattr(recipes[job.key].data, key)):
                    raise ConfigError(f"data.{key}: a list of sources; a lab trains and scores every variant on "
                                      "one corpus (a file, glob, folder or stdlib:...)")
        except ConfigError as exc:
            line = f"variant {job.name}: {exc}"
            if line not in problems:
                problems.append(line)
    if problems:
        raise ConfigError(f"{spec.path}: " + "; ".join(problems))
    return recipes
