"""The lab engine: one spec, many runs, one folder of results.

What the hand-made comparisons needed and this does every time:
- one tokenizer per distinct tokenizer setting, trained once (`tokenizers/`), and one token cache
  (`data/`) shared by every run and every evaluation, so variants differ only in what the spec changes;
- paired seeds: seed i of every variant uses the same `train.seed`, hence the same batches
  (batch k is a pure function of the seed and k) and a difference per seed, not only of means;
- every checkpoint scored on the same tokens of every eval text (`evaluate` with one fixed seed and the
  same cache; the data fingerprint of each score proves it);
- resume: a training whose final checkpoint exists, a conversion that was published, a score that was
  written are never redone; an interrupted training continues from its last checkpoint.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path

from ..errors import ConfigError
from ..files import staged_folder, write_atomic
from ..jsonfile import read_json
from ..layout import CHECKPOINTS, CONFIG
from ..progress import console as output_console
from ..progress import progress_bar
from ..trainer.recipe import Recipe, load_recipe
from .documents import document_figures
from .downstream import METRIC as TASK_METRIC
from .downstream import check_recipes, final_scores, task_label
from .gates import check_runs, diverged_scores, divergence, record_divergence
from .plan import Job, LabOptions, base_overrides, plan_jobs, resolve_recipes, seed_values
from .probing import probe_units, run_probes
from .scale import run_scale
from .scoring import eval_label, labels, pick_best, read_curves, score_job
from .spec import LabSpec

LAB_FILE = "lab.json"
SPEC_COPY = "spec.yaml"


@dataclass
class Lab:
    spec: LabSpec
    options: LabOptions
    folder: Path
    jobs: list[Job]
    recipes: dict[str, Recipe]  # job key -> recipe, for trainings
    evals: dict[str, str]  # label -> corpus spec
    seeds: list[int]


def default_folder(claim: str) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path("labs") / f"{claim}-{stamp}"


def prepare(spec: LabSpec, options: LabOptions, out: Path | None = None) -> Lab:
    """Check everything (spec, every recipe, the options, the folder) before any compute; one error."""
    if options.seeds < 1:
        raise ConfigError(f"seeds: got {options.seeds}, expected a positive integer", params=("seeds",))
    if options.jobs < 1:
        raise ConfigError(f"jobs: got {options.jobs}, expected a positive integer", params=("jobs",))
    try:
        base = load_recipe(spec.base_path(), base_overrides(spec, options))
    except ConfigError as exc:
        raise ConfigError(f"{spec.path}: base {spec.base}: {exc}", params=exc.params) from None
    seeds = seed_values(base.train.seed, options.seeds)
    jobs = plan_jobs(spec, seeds)
    recipes = resolve_recipes(spec, options, jobs)
    texts = options.evals or spec.eval or default_evals(base.data.valid)
    if not texts:
        raise ConfigError(f"{spec.path}: no held-out text to score on: pass evals FILE (data.valid is null)",
                          params=("evals",))
    evals: dict[str, str] = {}
    for text in texts:
        label, n = eval_label(text), 2
        while label in evals:
            label, n = f"{eval_label(text)}-{n}", n + 1
        evals[label] = text
    for factor in spec.probes.get("lengths") or []:
        for key, recipe in recipes.items():
            if recipe.objective.name != "clm":
                raise ConfigError(f"{spec.path}: probes.lengths: splits each row at the training length, which only a "
                                  f"causal model computes as on a 1x row; {key} trains "
                                  f"objective.name={recipe.objective.name}")
            if factor * recipe.data.seq_len > recipe.model.max_seq_len:
                raise ConfigError(f"{spec.path}: probes.lengths: {factor}x data.seq_len={recipe.data.seq_len} exceeds "
                                  f"model.max_seq_len={recipe.model.max_seq_len} of {key}; raise model.max_seq_len")
    if spec.own_masking:
        for key, recipe in recipes.items():
            if recipe.objective.name != "mlm":
                raise ConfigError(f"{spec.path}: own_masking: scores each model under the masking it trained with, "
                                  f"but {key} trains objective.name={recipe.objective.name}; it needs mlm")
    if spec.whole_documents:
        for key, recipe in recipes.items():
            if recipe.objective.name != "clm":
                raise ConfigError(f"{spec.path}: whole_documents: scores documents with causal sliding windows, but "
                                  f"{key} trains objective.name={recipe.objective.name}; it needs clm")
    _check_conversions(spec, recipes, jobs)
    check_recipes(spec.path, jobs, recipes)
    folder = Path(out) if out else default_folder(spec.claim)
    _claim_folder(folder, spec, options)
    return Lab(spec, options, folder, jobs, recipes, evals, seeds)


def default_evals(valid: str | None) -> list[str]:
    """The eval texts of a lab that names none: the held-out slice of its own data (the base recipe's
    data.valid) and one other text, so a verdict says whether it holds beyond the text it was read on.
    Beside stdlib:docs (prose) the other text is stdlib:code:valid: the Python source of the same held-out
    files, never trained on (the stdlib split is per file), prose among code, a shift of distribution
    without a leak. Beside stdlib:code it is stdlib:docs:valid, and beside a user's own text the built-in
    prose, stdlib:docs:valid; both are on every machine tfkit runs on."""
    if not valid:
        return []
    other = "stdlib:code:valid" if valid.startswith("stdlib:docs") else "stdlib:docs:valid"
    return [valid] if other == valid else [valid, other]


def _check_conversions(spec: LabSpec, recipes: dict[str, Recipe], jobs: list[Job]) -> None:
    """A head count the source model cannot be regrouped into fails now, not after its training."""
    from ..models.convert import check_regrouping

    for job in (j for j in jobs if j.kind == "convert"):
        source = recipes[f"{job.source}/seed-{job.seed}"]
        try:
            check_regrouping(source.model.config(), job.kv_heads, job.method)
        except ConfigError as exc:
            raise ConfigError(f"{spec.path}: convert.kv_heads: {exc}") from None


def _claim_folder(folder: Path, spec: LabSpec, options: LabOptions) -> None:
    """A new folder, or a lab of the same claim and options (which is then continued, never mixed)."""
    claim_folder(folder, spec, {"claim": spec.claim, "options": options.to_dict()}, LAB_FILE)


def claim_folder(folder: Path, spec: LabSpec, record: dict, marker_name: str) -> None:
    """Make `folder` hold `record` in its marker file `marker_name` (with a copy of the spec), or accept it
    when it holds the same record already (a lab, or a ladder of labs, continued); anything else is one
    error, so a user's folder is never written into and two labs are never mixed."""
    marker = folder / marker_name
    if marker.is_file():
        found = read_json(marker, ConfigError)
        if not isinstance(found.get("options"), dict):
            raise ConfigError(f"{marker}: damaged, expected the claim and options of a lab (no options object); "
                              "restore it, or run the lab into another out folder", params=("out",))
        if found != record:
            raise ConfigError(f"{folder}: holds a lab of {found.get('claim')!r} with options {found.get('options')}, "
                              f"not {record['options']}; continue it with the same options or choose another out",
                              params=("out",))
        return
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise ConfigError(f"out {folder}: exists and is not a lab folder (no {marker_name}); choose another out",
                          params=("out",))
    folder.mkdir(parents=True, exist_ok=True)
    write_atomic(folder / SPEC_COPY, spec.path.read_text(encoding="utf-8"))
    write_atomic(marker, json.dumps(record, indent=2) + "\n")


def _tokenizer_key(recipe: Recipe) -> str:
    t = recipe.tokenizer
    material = json.dumps([{k: v for k, v in vars(t).items() if k != "path"}, recipe.data.train,
                           recipe.data.text_field], sort_keys=True, default=str)
    return f"{t.kind}-{t.vocab_size}-{hashlib.sha256(material.encode()).hexdigest()[:8]}"


def _log(lab: Lab, name: str) -> Path:
    path = lab.folder / "logs" / f"{name.replace('/', '_')}.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def share_data(lab: Lab) -> None:
    """Train each distinct tokenizer once and point every recipe at it and at the lab's token cache; set
    what every run of a lab shares (its seed, quiet logs, no sample, one kept checkpoint)."""
    from ..tokenization.shards import prepare_tokens
    from ..tokenization.train import load_tokenizer
    from ..trainer.data import is_pair_data, prepare_tokenizer

    shared: set[tuple[str, str]] = set()
    tuned = {j.key for j in lab.jobs if j.kind == "finetune"}
    for key, recipe in lab.recipes.items():
        job_seed = int(key.rsplit("seed-", 1)[1])
        recipe.log.progress = recipe.log.tensorboard = recipe.log.plot = False
        recipe.train.seed = job_seed
        recipe.train.keep_last = 1
        if key in tuned:  # labelled data, read by the task's own reader; the checkpoint's tokenizer
            recipe.train.keep_best = False  # scored at its final step, as every other row
            _share_cores(lab, recipe)
            continue
        recipe.data.cache_dir = str(lab.folder / "data")
        if not recipe.tokenizer.path and not recipe.train.init_from:
            folder = lab.folder / "tokenizers" / _tokenizer_key(recipe)
            if not (folder / "tokenizer.json").is_file():
                with open(_log(lab, f"tokenizer-{folder.name}"), "a", encoding="utf-8") as log, \
                        contextlib.redirect_stdout(log), staged_folder(folder) as tmp:
                    prepare_tokenizer(recipe, tmp, None, output_console())
            recipe.tokenizer.path = str(folder)
        d = recipe.data
        for text in (d.train, d.valid):  # tokenized once here, not by each (maybe concurrent) run
            if text and (recipe.tokenizer.path, text) not in shared and not is_pair_data(text, d.source_field):
                shared.add((recipe.tokenizer.path, text))
                prepare_tokens(text, load_tokenizer(recipe.tokenizer.path), d.cache_dir, text_field=d.text_field,
                               show_progress=False)
        recipe.eval.sample_prompt = None
        _share_cores(lab, recipe)


def _share_cores(lab: Lab, recipe: Recipe) -> None:
    if lab.options.jobs > 1:  # the cores shared between the concurrent trainings
        recipe.train.threads = max(1, (os.cpu_count() or 1) // lab.options.jobs)


def final_checkpoint(run_dir: Path, steps: int) -> Path:
    return run_dir / CHECKPOINTS / f"step-{steps}"


def train_job(recipe: Recipe, run_dir: Path, log_path: Path) -> tuple[int, float]:
    """One training (fresh, or continued from its last checkpoint); its output goes to `log_path`. One the
    trainer stops on non-finite updates is recorded in its folder (gates.record_divergence), not raised.
    Returns (the signal that interrupted it or 0, seconds). Module-level: worker processes run it."""
    from ..evaluation.metrics import task_scores
    from ..trainer.loop import TrainingDiverged
    from ..trainer.run import pretrain

    started, interrupted = time.perf_counter(), 0
    scorer = task_scores if recipe.head_task else None  # a downstream fine-tuning validates its task's scores
    with open(log_path, "a", encoding="utf-8") as log, contextlib.redirect_stdout(log):
        try:
            interrupted = pretrain(recipe, run_dir=run_dir, resume="auto", scorer=scorer).interrupted
        except TrainingDiverged as exc:
            print(f"lab: {exc}")
            record_divergence(run_dir, str(exc))
    return interrupted, time.perf_counter() - started


class Progress:
    """One bar over the whole lab (on a terminal) and one plain line per finished unit of work."""

    def __init__(self, total: int) -> None:
        self.total, self.done, self.console = total, 0, output_console()
        self.bar = progress_bar(total=total, unit="job", desc="lab")

    def step(self, what: str, started: float | None) -> None:
        self.done += 1
        self.bar.update(1)
        took = "done before" if started is None else f"{time.perf_counter() - started:.1f} s"
        self.bar.clear()
        self.console.print(f"[{self.done:>3}/{self.total}] {what}: {took}", highlight=False, markup=False)

    def close(self) -> None:
        self.bar.close()


def _train_phase(lab: Lab, jobs: list[Job], progress: Progress, timing: dict) -> None:
    pending = []
    for job in jobs:
        recipe, run_dir = lab.recipes[job.key], lab.folder / job.folder
        if job.kind in ("uptrain", "finetune"):
            recipe.train.init_from = str(checkpoint_of(lab, _started_from(lab, job)))
        if (final_checkpoint(run_dir, recipe.train.max_steps) / CONFIG).is_file() or divergence(run_dir):
            progress.step(f"{job.kind} {job.key}", None)
        else:
            pending.append((job, recipe, run_dir))
    if lab.options.jobs > 1 and len(pending) > 1:
        with ProcessPoolExecutor(min(lab.options.jobs, len(pending)), mp_context=get_context("spawn")) as pool:
            futures = [(job, pool.submit(train_job, recipe, run_dir, _log(lab, job.key)))
                       for job, recipe, run_dir in pending]
            for job, future in futures:
                _finished(job, *future.result(), progress, timing, lab)
        return
    for job, recipe, run_dir in pending:
        _finished(job, *train_job(recipe, run_dir, _log(lab, job.key)), progress, timing, lab)


def _finished(job: Job, interrupted: int, seconds: float, progress: Progress, timing: dict, lab: Lab) -> None:
    if interrupted:
        progress.close()
        progress.console.print(f"lab interrupted during {job.key}; continue it with: tfkit lab run "
                               f"{lab.spec.path} --out {lab.folder} (and the same options)", highlight=False)
        raise KeyboardInterrupt
    timing[job.key] = seconds
    progress.step(f"{job.kind} {job.key}", time.perf_counter() - seconds)


def _started_from(lab: Lab, job: Job) -> Job:
    """The job whose checkpoint `job` (a conversion or an uptraining) starts from; one that diverged left
    none, which stops the lab with its reason."""
    source = job_named(lab, job.source, job.seed)
    message = "" if source.kind == "convert" else divergence(lab.folder / source.folder)
    if message:
        raise ConfigError(f"lab {lab.folder}: {job.kind} {job.key} starts from {source.key}, which diverged "
                          f"({message}); it has no checkpoint to start from")
    return source


def checkpoint_of(lab: Lab, job: Job) -> Path:
    """The checkpoint a finished job left: the final step of a run, or a converted folder."""
    if job.kind == "convert":
        return lab.folder / job.folder
    return final_checkpoint(lab.folder / job.folder, lab.recipes[job.key].train.max_steps)


def _convert(lab: Lab, job: Job, progress: Progress) -> None:
    from ..checkpoints.convert import convert_checkpoint

    out = lab.folder / job.folder
    if (out / CONFIG).is_file():
        progress.step(f"convert {job.key}", None)
        return
    started = time.perf_counter()
    convert_checkpoint(checkpoint_of(lab, _started_from(lab, job)), out, job.kv_heads, job.method, seed=job.seed)
    progress.step(f"convert {job.key}", started)


def scoring_recipe(lab: Lab, job: Job) -> Recipe:
    """The recipe whose eval settings score `job`: its own, or (a conversion) its source's."""
    while job.kind == "convert":
        job = job_named(lab, job.source, job.seed)
    return lab.recipes[job.key]


def run(lab: Lab) -> dict:
    """Train, convert, score and probe every job of the lab; returns the results (results.json)."""
    share_data(lab)
    units = len(lab.jobs) * 2 + probe_units(lab)  # each job is trained or converted, then scored
    progress, timing = Progress(units), {}
    try:
        _train_phase(lab, [j for j in lab.jobs if j.kind == "train"], progress, timing)
        for job in (j for j in lab.jobs if j.kind == "convert"):
            _convert(lab, job, progress)
        _train_phase(lab, [j for j in lab.jobs if j.kind == "uptrain"], progress, timing)
        _train_phase(lab, [j for j in lab.jobs if j.kind == "finetune"], progress, timing)
        rows: dict = {}
        for job in lab.jobs:
            started, message = time.perf_counter(), job.kind != "convert" and divergence(lab.folder / job.folder)
            if message:  # no checkpoint: its scores say so (gates.diverged_scores)
                columns = [task_label(lab.recipes[job.key])] if job.kind == "finetune" else labels(lab)
                scores, fresh = {label: diverged_scores(message) for label in columns}, False
            elif job.kind == "finetune":  # the task's held-out examples, as its trainer scored them last
                recipe = lab.recipes[job.key]
                scores = {task_label(recipe): final_scores(lab.folder / job.folder, recipe.train.max_steps)}
                fresh = False
            else:
                scores, fresh = score_job(lab, job, checkpoint_of(lab, job), scoring_recipe(lab, job))
            row = rows.setdefault(job.name, {"kind": job.kind, "scores": {}})
            for label, value in scores.items():
                row["scores"].setdefault(label, {})[str(job.seed)] = value
            progress.step(f"score {job.key}", started if fresh else None)
        sweep = pick_best(lab, rows)
        probes = run_probes(lab, rows, progress)
        gates, scale = check_runs(lab, rows, sweep), run_scale(lab, rows)
        documents = document_figures(lab) if lab.spec.whole_documents else {}
    finally:
        progress.close()
    s, tuned = lab.spec, next((lab.recipes[j.key] for j in lab.jobs if j.kind == "finetune"), None)
    downstream = {} if tuned is None else {"label": task_label(tuned), "metric": TASK_METRIC,
                                           "data": tuned.data.valid or f"{tuned.data.train} (held-out share)"}
    return {"claim": s.claim, "title": s.title, "source": s.source, "spec": str(s.path), "metric": s.metric,
            "reference": s.reference, "seeds": lab.seeds, "options": lab.options.to_dict(), "evals": lab.evals,
            "rows": rows, "curves": read_curves(lab), "probes": probes, "gates": gates, "scale": scale, "sweep": sweep,
            "documents": documents, "timing_s": timing, "cost": s.cost, "downstream": downstream}


def job_named(lab: Lab, name: str, seed: int) -> Job:
    return next(j for j in lab.jobs if j.name == name and j.seed == seed)
