"""Which probe runs on which checkpoints, and how its values are kept (results.json's `probes`).

The measurements themselves are in probes.py (attention reliance, flash = naive, the mask leak, activation
memory, training speed on a GPU, decode speed, the largest attention logit) and mechanisms.py (attention entropy, max probability
and score spread per layer; the relative update of the residual stream per block). Probes that read one
batch (PER_BATCH) measure each probed run's every seed on the first evaluation batch of the lab's first eval
text, under the layout the checkpoint trained with; their values are {run: {seed: value}}, a value being a
number or, for per-layer probes, {stat: [one number per layer]} / [one number per block]. The lengths
probe is not here: it is a scored column (scoring.py, lengths.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import mechanisms, probes as measure
from .gates import divergence
from .jobs import checkpoint_of, job_named, scoring_recipe
from .plan import Job
from .scoring import first_batch, score_job

if TYPE_CHECKING:
    from .jobs import Lab
    from .progress import LabProgress

# probe key in the spec -> the name its values are kept under in results.json
PER_BATCH = {"flash_equality": "flash_max_diff", "mask_leak": "mask_leak", "attention_logits": "attention_logits",
             "attention": "attention", "residual_update": "residual_update"}
MEASURES = {"flash_equality": measure.flash_max_diff, "mask_leak": measure.mask_leak,
            "attention_logits": measure.attention_logits, "attention": mechanisms.attention_stats,
            "residual_update": mechanisms.residual_updates}


def probe_units(lab: Lab) -> int:
    """Units of work the probes add to the lab's progress bar."""
    p, spec = lab.spec.probes, lab.spec
    runs = sum(len(spec.probed_runs(key)) for key in PER_BATCH if key in p)
    decode = len(spec.probed_runs("decode_speed")) if "decode_speed" in p else 0
    return len(lab.seeds) * (("attention_reliance" in p) + runs) + ("memory" in p) + decode + ("train_speed" in p)


def _probed(lab: Lab, name: str, seeds: list[int]) -> list[Job]:
    """The jobs of run `name` a probe measures: those of `seeds` that left a checkpoint (not a divergence)."""
    jobs = [job_named(lab, name, seed) for seed in seeds]
    return [j for j in jobs if j.kind == "convert" or not divergence(lab.folder / j.folder)]


def run_probes(lab: Lab, rows: dict, progress: LabProgress) -> dict:
    """The spec's probes (module doc); {probe name: {"values": ...}} as results.json keeps them."""
    p, out = lab.spec.probes, {}
    if "attention_reliance" in p:
        cfg = p["attention_reliance"] or {}
        name = cfg.get("run", lab.spec.reference)
        threshold = float(cfg.get("threshold", 0.25))
        ablated_name = f"{name}-no-attn"
        values: dict = {}
        for job in _probed(lab, name, lab.seeds):
            started, seed = progress.clock(), job.seed
            folder = lab.folder / "probes" / ablated_name / f"seed-{seed}"
            measure.ablate_attention(checkpoint_of(lab, job), folder)
            probe_job = Job(ablated_name, seed, "probe")
            scores, fresh = score_job(lab, probe_job, folder, scoring_recipe(lab, job))
            row = rows.setdefault(ablated_name, {"kind": "probe", "scores": {}})
            for label, value in scores.items():
                row["scores"].setdefault(label, {})[str(seed)] = value
                base = rows[name]["scores"][label][str(seed)]["loss"]
                values.setdefault(label, {})[str(seed)] = value["loss"] - base
            progress.step(f"probe attention reliance {job.key}", started if fresh else None)
        out["attention_reliance"] = {"run": name, "threshold": threshold, "values": values}
    for key, name in PER_BATCH.items():
        if key not in p:
            continue
        values = {}
        for run in lab.spec.probed_runs(key):
            for job in _probed(lab, run, lab.seeds):
                started, seed = progress.clock(), job.seed
                recipe, label = scoring_recipe(lab, job), next(iter(lab.evals))
                batch = first_batch(checkpoint_of(lab, job), lab.evals[label], recipe, lab.folder / "data")
                values.setdefault(run, {})[str(seed)] = MEASURES[key](checkpoint_of(lab, job), batch)
                progress.step(f"probe {name} {job.key}", started)
        out[name] = {"values": values}
    if "memory" in p:
        cfg = p["memory"] or {}
        lengths = [64, 128] if lab.options.quick else list(cfg.get("seq_lens", [256, 512, 1024, 2048]))
        for job in _probed(lab, cfg.get("run", lab.spec.reference), lab.seeds)[:1]:  # its architecture, once
            started = progress.clock()
            out["memory"] = {"run": job.name, **measure.activation_memory(checkpoint_of(lab, job), lengths)}
            progress.step(f"probe activation memory {job.key}", started)
    if "train_speed" in p:  # a GPU's figure (probes.train_speed): on a CPU it records why it did not run
        cfg = p["train_speed"] or {}
        lengths = [64, 128] if lab.options.quick else list(cfg.get("seq_lens", [1024, 2048, 4096]))
        for job in _probed(lab, cfg.get("run", lab.spec.reference), lab.seeds)[:1]:  # its architecture, once
            started = progress.clock()
            out["train_speed"] = {"run": job.name, **measure.train_speed(checkpoint_of(lab, job), lengths)}
            progress.step(f"probe training speed {job.key}", started)
    if "decode_speed" in p:
        cfg, out["decode_speed"] = p["decode_speed"] or {}, {"values": {}}
        sizes = [1, 2] if lab.options.quick else [int(b) for b in cfg.get("batch_sizes", [1, 8])]
        new_tokens = 4 if lab.options.quick else int(cfg.get("new_tokens", 32))
        for run in lab.spec.probed_runs("decode_speed"):  # one seed's weights: speed does not depend on them
            for job in _probed(lab, run, lab.seeds)[:1]:
                started = progress.clock()
                out["decode_speed"]["values"][run] = measure.decode_speed(
                    checkpoint_of(lab, job), sizes, int(cfg.get("context", 128)), new_tokens)
                progress.step(f"probe decode speed {job.key}", started)
    return out
