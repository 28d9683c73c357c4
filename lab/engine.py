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
from concurrent.futures import ProcessPoolExecutor, as_completed
from multiprocessing import get_context
from pathlib import Path

from ..errors import ConfigError
from ..files import staged_folder, write_atomic
from ..jsonfile import read_json
from ..layout import CONFIG
from ..progress import console as output_console
from ..trainer.recipe import Recipe, load_recipe
from .documents import document_figures
from .downstream import METRIC as TASK_METRIC, check_downstream, final_scores, task_label
from .inloop_columns import check_task_columns, final_task_scores
from .gates import check_runs, divergence, diverged_scores, record_divergence
from .jobs import Lab, checkpoint_of, final_checkpoint, job_named, log_path, scoring_recipe
from .plan import Job, LabOptions, base_overrides, plan_jobs, resolve_recipes, seed_values
from .probing import probe_units, run_probes
from .progress import LabProgress, Training
from .scale import run_scale
from .scoring import eval_label, labels, pick_best, read_curves, score_job
from .spec import LabSpec

LAB_FILE = "lab.json"
SPEC_COPY = "spec.yaml"


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
    check_downstream(spec.path, jobs, recipes)  # its recipe, labelled files and labels, before any training
    check_task_columns(spec.path, recipes)  # eval.tasks / eval.probe of the trainings (inloop_columns.py)
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
                with open(log_path(lab, f"tokenizer-{folder.name}"), "a", encoding="utf-8") as log, \
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


def train_job(recipe: Recipe, run_dir: Path, log_path: Path) -> tuple[int, float]:
    """One training (fresh, or continued from its last checkpoint); its output goes to `log_path`. One the
    trainer stops on non-finite updates is recorded in its folder (gates.record_divergence), not raised.
    Returns (the signal that interrupted it or 0, seconds). Module-level: worker processes run it."""
    from ..evaluation.inloop import build_downstream
    from ..evaluation.metrics import task_scores
    from ..trainer.loop import TrainingDiverged
    from ..trainer.run import pretrain

    started, interrupted = time.perf_counter(), 0
    scorer = task_scores if recipe.head_task else None  # a downstream fine-tuning validates its task's scores
    with open(log_path, "a", encoding="utf-8") as log, contextlib.redirect_stdout(log):
        try:
            interrupted = pretrain(recipe, run_dir=run_dir, resume="auto", scorer=scorer,
                                   downstream=build_downstream(recipe)).interrupted
        except TrainingDiverged as exc:
            print(f"lab: {exc}")
            record_divergence(run_dir, str(exc))
    return interrupted, time.perf_counter() - started


def trainings(lab: Lab) -> list[Training]:
    """The trainings this `lab run` trains, in the order it trains them: every train, uptrain and fine-tuning
    job that has neither its final checkpoint nor a recorded divergence (a continued lab redoes nothing)."""
    order = ("train", "uptrain", "finetune")
    jobs = sorted((j for j in lab.jobs if j.kind in order), key=lambda j: order.index(j.kind))
    out = []
    for job in jobs:
        steps, run_dir = lab.recipes[job.key].train.max_steps, lab.folder / job.folder
        if not ((final_checkpoint(run_dir, steps) / CONFIG).is_file() or divergence(run_dir)):
            out.append(Training(job.key, job.kind, len(out) + 1, steps, run_dir))
    return out


def _train_phase(lab: Lab, jobs: list[Job], progress: LabProgress, timing: dict) -> None:
    pending = []
    for job in jobs:
        recipe, run_dir = lab.recipes[job.key], lab.folder / job.folder
        if job.kind in ("uptrain", "finetune"):
            recipe.train.init_from = str(checkpoint_of(lab, _started_from(lab, job)))
        if job.key in progress.pending:
            pending.append((job, recipe, run_dir))
        else:
            progress.step(f"{job.kind} {job.key}", None)
    workers = min(lab.options.jobs, len(pending))
    if workers > 1:
        with ProcessPoolExecutor(workers, mp_context=get_context("spawn")) as pool:
            futures = {pool.submit(train_job, recipe, run_dir, log_path(lab, job.key)): job
                       for job, recipe, run_dir in pending}
            queued = [job for job, _, _ in pending]
            for job in queued[:workers]:  # the pool starts them in this order, the next when one ends
                progress.begin(job.key)
            for future in as_completed(futures):
                _finished(futures[future], *future.result(), progress, timing, lab)
                if len(queued) > workers:
                    progress.begin(queued.pop(workers).key)
        return
    for job, recipe, run_dir in pending:
        progress.begin(job.key)
        _finished(job, *train_job(recipe, run_dir, log_path(lab, job.key)), progress, timing, lab)


def _finished(job: Job, interrupted: int, seconds: float, progress: LabProgress, timing: dict, lab: Lab) -> None:
    if interrupted:
        progress.close()
        progress.print(f"lab interrupted during {job.key}; continue it with: tfkit lab run "
                       f"{lab.spec.path} --out {lab.folder} (and the same options)")
        raise KeyboardInterrupt
    timing[job.key] = seconds
    progress.finish(job.key, seconds)


def _started_from(lab: Lab, job: Job) -> Job:
    """The job whose checkpoint `job` (a conversion or an uptraining) starts from; one that diverged left
    none, which stops the lab with its reason."""
    source = job_named(lab, job.source, job.seed)
    message = "" if source.kind == "convert" else divergence(lab.folder / source.folder)
    if message:
        raise ConfigError(f"lab {lab.folder}: {job.kind} {job.key} starts from {source.key}, which diverged "
                          f"({message}); it has no checkpoint to start from")
    return source


def _convert(lab: Lab, job: Job, progress: LabProgress) -> None:
    from ..checkpoints.convert import convert_checkpoint

    out = lab.folder / job.folder
    if (out / CONFIG).is_file():
        progress.step(f"convert {job.key}", None)
        return
    started = progress.clock()
    convert_checkpoint(checkpoint_of(lab, _started_from(lab, job)), out, job.kv_heads, job.method, seed=job.seed)
    progress.step(f"convert {job.key}", started)


def run(lab: Lab, progress: LabProgress | None = None) -> dict:
    """Train, convert, score and probe every job of the lab; returns the results (results.json). `progress`
    shows it (lab/progress.py; tests pass one on a fake clock)."""
    units = len(lab.jobs) * 2 + probe_units(lab)  # each job is trained or converted, then scored
    progress, timing = progress or LabProgress(units, trainings(lab), lab.options.jobs), {}
    started = progress.clock()
    progress.print("lab: the tokenizers and token caches every run shares (logs/ keeps their output) ...")
    share_data(lab)
    progress.print(f"lab: tokenizers and token caches ready: {progress.clock() - started:.1f} s")
    try:
        with progress.watch():
            _train_phase(lab, [j for j in lab.jobs if j.kind == "train"], progress, timing)
            for job in (j for j in lab.jobs if j.kind == "convert"):
                _convert(lab, job, progress)
            _train_phase(lab, [j for j in lab.jobs if j.kind == "uptrain"], progress, timing)
            _train_phase(lab, [j for j in lab.jobs if j.kind == "finetune"], progress, timing)
        rows: dict = {}
        for job in lab.jobs:
            started, message = progress.clock(), job.kind != "convert" and divergence(lab.folder / job.folder)
            if message:  # no checkpoint: its scores say so (gates.diverged_scores)
                columns = [task_label(lab.recipes[job.key])] if job.kind == "finetune" else labels(lab)
                scores, fresh = {label: diverged_scores(message) for label in columns}, False
            elif job.kind == "finetune":  # the task's held-out examples, as its trainer scored them last
                recipe = lab.recipes[job.key]
                scores = {task_label(recipe): final_scores(lab.folder / job.folder, recipe.train.max_steps)}
                fresh = False
            else:
                scores, fresh = score_job(lab, job, checkpoint_of(lab, job), scoring_recipe(lab, job))
                if job.kind != "convert":  # what its training scored in the loop: columns task:NAME
                    recipe = lab.recipes[job.key]
                    scores = {**scores, **final_task_scores(lab.folder / job.folder, recipe.train.max_steps, recipe)}
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

