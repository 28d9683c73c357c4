"""How big the evidence is: parameters, tokens seen, tokens per parameter, epochs and precision of each run.

A verdict at 0.9M parameters and 0.6 tokens per parameter says what happens at that scale, not at the
scale of the paper it quotes; results.md opens with these figures so no reader has to guess them. They
come from what each training left: its final checkpoint's config (precision as the run resolved it),
its metrics.jsonl (input tokens consumed, the trainer's own count) and its training text's token cache
(epochs = tokens seen / tokens of the training text)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..layout import CONFIG
from .paper import short_count
from .plan import LM_KINDS

if TYPE_CHECKING:
    from .jobs import Lab


def tokens_seen(metrics_path) -> int | None:
    """The trainer's count of input tokens consumed, from the last metrics row that has one."""
    from ..checkpoints.run_record import read_metrics

    if not metrics_path.is_file():
        return None
    counts = [row["tokens"] for row in read_metrics(metrics_path) if "tokens" in row]
    return int(counts[-1]) if counts else None


def run_scale(lab: Lab, rows: dict) -> dict:
    """{name: {kind, params, tokens, train_tokens, precision, steps}} for every training of the first seed
    (seeds of one variant differ only in their seed)."""
    from ..checkpoints.record import CheckpointRecord
    from ..tokenization.shards import prepare_tokens
    from ..tokenization.train import load_tokenizer
    from .jobs import checkpoint_of

    label, seed, out = next(iter(lab.evals)), lab.seeds[0], {}
    for job in (j for j in lab.jobs if j.seed == seed and j.kind in LM_KINDS):
        checkpoint, recipe = checkpoint_of(lab, job), lab.recipes[job.key]
        has_checkpoint = (checkpoint / CONFIG).is_file()  # not after a divergence
        tokenizer = checkpoint if has_checkpoint else recipe.tokenizer.path
        train = prepare_tokens(recipe.data.train, load_tokenizer(tokenizer), lab.folder / "data",
                               text_field=recipe.data.text_field, show_progress=False)
        params = [s["params"] for s in rows[job.name]["scores"][label].values() if "params" in s]  # any seed's
        out[job.name] = {"kind": job.kind, "params": params[0] if params else None,
                         "tokens": tokens_seen(lab.folder / job.folder / "metrics.jsonl"),
                         "train_tokens": train.num_tokens, "steps": recipe.train.max_steps,
                         "precision": CheckpointRecord.read(checkpoint).precision if has_checkpoint else None}
    return out


def scale_lines(results: dict) -> list[str]:
    """The scale table of results.md (empty for a lab written before it was recorded)."""
    scale = results.get("scale")
    if not scale:
        return []
    out = ["| run | kind | parameters | steps | tokens seen | tokens / parameter | epochs | precision |",
           "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, s in scale.items():
        tokens = s["tokens"]
        per_param = f"{tokens / s['params']:.3g}" if tokens and s["params"] else "-"
        epochs = f"{tokens / s['train_tokens']:.3g}" if tokens and s["train_tokens"] else "-"
        out.append(f"| {name} | {s['kind']} | {short_count(s['params']) if s['params'] else '-'} | {s['steps']:,} | "
                   f"{short_count(tokens) if tokens else '-'} | {per_param} | {epochs} | {s['precision'] or '-'} |")
    return out
