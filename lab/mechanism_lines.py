"""results.md sections for what the table's losses do not say: the degradation past the training length
(the lengths probe), each MLM model on its own masking, and the per-layer mechanism probes (attention
entropy, max probability and score spread; the residual stream's relative update per block). Pure
rendering over results.json, as report.py is."""

from __future__ import annotations

from .scoring import OWN, is_degradation
from .stats import mean_sd


def _mean(values: list[float]) -> str:
    return f"{mean_sd(values)[0]:.3f}" if values else "-"


def lengths_lines(results: dict) -> list[str]:
    """Per run and LABEL@Nx column: the loss within the training length, past it, and their difference,
    means over seeds (empty without the lengths probe)."""
    columns = [label for label in dict.fromkeys(k for row in results["rows"].values() for k in row["scores"])
               if is_degradation(label)]
    if not columns:
        return []
    out = ["Columns LABEL@Nx score rows of N x the training length L and split each row at L: within is the loss on "
           "positions 0..L-1 (what the model computes on a 1x row), past the loss on positions L..N·L-1, and the "
           "column holds past - within, so a comparison on it is about degradation past the training length, "
           "with each model's 1x quality taken out. Tokens past L have more context, so a model that "
           "extrapolates perfectly reads slightly below 0; means over seeds, nats per token:", "",
           "| run | column | within | past | past - within |", "| --- | --- | --- | --- | --- |"]
    for name, row in results["rows"].items():
        for label in columns:
            seeds = [s for s in row["scores"].get(label, {}).values() if "past_loss" in s]
            if seeds:
                out.append(f"| {name} | {label} | {_mean([s['within_loss'] for s in seeds])} | "
                           f"{_mean([s['past_loss'] for s in seeds])} | {_mean([s['loss'] for s in seeds])} |")
    return out


def own_masking_lines(results: dict) -> list[str]:
    """What the LABEL@own columns are, with each variant's masking (empty without `own_masking`)."""
    masks = {}
    for name, row in results["rows"].items():
        for label, seeds in row["scores"].items():
            found = [s["masking"] for s in seeds.values() if label.endswith(OWN) and "masking" in s]
            if found:
                masks[name] = found[0]
    if not masks:
        return []
    out = ["Columns LABEL@own score each checkpoint under the masking it trained with (the same fixed seed for "
           "every checkpoint, so rows with the same masking are scored on the same targets); the plain columns "
           "score every checkpoint under one common masking. A loss under another masking is a loss on another "
           "task (more masked tokens leave less context; kept and random replacements change what is predicted), "
           "so @own rows compare each model with its own training task, not with each other:", ""]
    for name, m in masks.items():
        replace = "/".join(f"{v:g}" for v in m["mask_replace"])
        out.append(f"- {name}: {m['mask_prob']:g} of the tokens, [MASK]/random/kept {replace}"
                   + (", whole words" if m.get("whole_word") else ""))
    return out


def _layers(per_seed: list[list[float]]) -> str:
    """'a, b, c': the mean over seeds of each layer's value."""
    return ", ".join(f"{mean_sd(list(layer))[0]:.3g}" for layer in zip(*per_seed))


def mechanism_lines(results: dict) -> list[str]:
    """The attention and residual-update probes as tables, one row per run, one value per layer (mean
    over seeds), first layer first."""
    probes, out = results.get("probes", {}), []
    attention = (probes.get("attention") or {}).get("values", {})
    if attention:
        label = next(iter(results["evals"]))
        out += ["", f"Attention on the first eval batch of {label} (eval mode), per layer, mean over seeds: entropy of "
                "each query's weights (nats), its largest weight, and the standard deviation of the logits it sees "
                "(q·k scaled, plus any ALiBi bias); queries that see one key only are left out.", "",
                "| run | entropy | max probability | score spread |", "| --- | --- | --- | --- |"]
        for run, seeds in attention.items():
            stats = [_layers([v[k] for v in seeds.values()]) for k in ("entropy", "max_prob", "spread")]
            out.append(f"| {run} | " + " | ".join(stats) + " |")
    residual = (probes.get("residual_update") or {}).get("values", {})
    if residual:
        out += ["", "Relative update of the residual stream per block, ||block(x) - x|| / ||x|| averaged over the "
                "tokens of the same batch, mean over seeds:", "", "| run | per block |", "| --- | --- |"]
        out += [f"| {run} | {_layers(list(seeds.values()))} |" for run, seeds in residual.items()]
    return out
