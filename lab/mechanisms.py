"""What a mechanism does inside a trained model, per layer, on held-out text: the probes that say *why* a
loss differs, measured in eval mode on the first evaluation batch of the lab's first eval text.

- `attention_stats`: per self-attention layer, the mean over batch rows, heads and queries of
  - entropy: -Σ p log p of the query's attention distribution, in nats (low = peaked, saturated);
  - max_prob: the largest attention weight of the query (1 = one-hot);
  - spread: the standard deviation of the logits the softmax sees (q·k times the score scale, plus
    ALiBi's bias) over the keys the query may see. A softmax of logits spread over tens of units is
    one-hot, and its gradient vanishes: the saturation Vaswani et al. (2017, section 3.2.1) scale the
    scores by 1/sqrt(d_head) against. Spread is the cause, entropy and max_prob the effect.
  Only queries that see at least two keys count (a causal model's first query sees one, whose
  distribution is one-hot whatever the model). Entropy grows with the number of keys seen, so compare
  it between runs on the same batch, not against a fixed number.
- `residual_updates`: per block, the mean over tokens of ||block(x) - x|| / ||x|| (L2 over the model
  width): how much each block changes the residual stream. A block whose update is near 0 does nothing;
  one whose update is near or above 1 rewrites the stream (post-norm blocks, whose output is normalised,
  count the normalisation as part of the update).

Both recompute nothing the model does not: forward hooks read each layer's own input and output, and the
attention statistics rebuild the scores from the layer's input with its own projections, QK-norm and
RoPE (`Attention.queries` / `keys_values`), under the mask the model passed to that layer.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import Tensor, nn

from ..checkpoints.weights import load_model
from ..models.attention import Attention, AttnMask
from ..models.base import Block

STATS = ("entropy", "max_prob", "spread")


def model_inputs(model: nn.Module, batch: dict) -> Tensor:
    """One forward of `batch` under the layout it carries (doc_ids, position_ids of a document-masked
    checkpoint): logits (B, T, V) of a GPT, hidden states (B, T, C) of a BERT's encoder."""
    layout = {k: batch[k] for k in ("doc_ids", "position_ids") if k in batch}
    if hasattr(model, "encode") and "token_type_ids" in batch:  # BERT: the encoder is what attends
        return model.encode(batch["input_ids"], token_type_ids=batch["token_type_ids"], **layout)  # (B, T, C)
    return model(batch["input_ids"], **layout)  # (B, T, V)


def _visible(mask: AttnMask, scores: Tensor) -> Tensor:
    """bool (B|1, 1|H, T, T): which keys each query may see under `mask` (all where it has no tensor)."""
    if mask.tensor is None:
        return torch.ones(1, 1, *scores.shape[-2:], dtype=torch.bool, device=scores.device)
    return mask.tensor if mask.tensor.dtype == torch.bool else mask.tensor.isfinite()


def layer_stats(scores: Tensor, mask: AttnMask) -> dict[str, float]:
    """{entropy, max_prob, spread} of one layer's scaled scores (B, H, T, T) under its mask (module doc)."""
    seen = _visible(mask, scores).expand_as(scores)  # (B, H, T, T)
    logits = scores if mask.tensor is None or mask.tensor.dtype == torch.bool else scores + mask.tensor.float()
    logits = logits.masked_fill(~seen, float("-inf"))  # (B, H, T, T)
    probs = torch.softmax(logits, dim=-1)  # (B, H, T, T), 0 at hidden keys
    n = seen.sum(-1)  # (B, H, T): keys each query sees
    counted = n >= 2  # (B, H, T)
    plogp = torch.where(probs > 0, probs * probs.clamp_min(1e-30).log(), torch.zeros_like(probs))
    entropy = -plogp.sum(-1)  # (B, H, T)
    shown = logits.masked_fill(~seen, 0.0)  # (B, H, T, T)
    mean = shown.sum(-1) / n.clamp_min(1)  # (B, H, T)
    var = ((shown - mean[..., None]) ** 2).masked_fill(~seen, 0.0).sum(-1) / (n - 1).clamp_min(1)  # (B, H, T)
    values = {"entropy": entropy, "max_prob": probs.amax(-1), "spread": var.sqrt()}
    return {k: float(v[counted].mean()) if counted.any() else math.nan for k, v in values.items()}


@torch.no_grad()
def attention_stats(checkpoint: Path, batch: dict) -> dict[str, list[float]]:
    """{entropy: [per layer], max_prob: [...], spread: [...]} of every self-attention layer, in the order the
    forward runs them, on `batch` in eval mode (module doc)."""
    model, _ = load_model(checkpoint)
    model.eval()
    found: dict[str, list[float]] = {k: [] for k in STATS}

    def hook(module: Attention, args: tuple, kwargs: dict, _out) -> None:
        if kwargs.get("context") is not None:  # cross-attention: keys from another sequence
            return
        x, mask = args[0].float(), args[1]  # (B, T, C), AttnMask
        q = module.queries(x, kwargs.get("rope"))  # (B, H, T, D)
        k, _ = module.keys_values(x, kwargs.get("rope"))  # (B, H_kv, T, D)
        k = k.repeat_interleave(module.n_heads // module.n_kv_heads, dim=1)  # (B, H, T, D)
        scores = q @ k.transpose(-2, -1)  # (B, H, T, T)
        scores = scores / math.sqrt(q.shape[-1]) if module.scale is None else scores * module.scale
        for key, value in layer_stats(scores, mask).items():
            found[key].append(value)

    with hooked(model, Attention, hook, with_kwargs=True):
        model_inputs(model, batch)
    return found


@torch.no_grad()
def residual_updates(checkpoint: Path, batch: dict) -> list[float]:
    """Per block, in the order the forward runs them: mean over tokens of ||out - in|| / ||in|| (module doc)."""
    model, _ = load_model(checkpoint)
    model.eval()
    found: list[float] = []

    def hook(_module: Block, args: tuple, out: Tensor) -> None:
        x = args[0].float()  # (B, T, C): the residual stream entering the block
        change = (out.float() - x).norm(dim=-1)  # (B, T)
        found.append(float((change / x.norm(dim=-1).clamp_min(1e-12)).mean()))

    with hooked(model, Block, hook):
        model_inputs(model, batch)
    return found


@contextlib.contextmanager
def hooked(model: nn.Module, kind: type, hook, with_kwargs: bool = False) -> Iterator[None]:
    """`hook` on the forward of every `kind` module of `model` while the block runs, removed however it ends."""
    handles = [m.register_forward_hook(hook, with_kwargs=with_kwargs) for m in model.modules() if isinstance(m, kind)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
