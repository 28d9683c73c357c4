"""Regroup the key/value heads of a checkpoint: MHA -> GQA -> MQA and back (Ainslie et al., 2023).

GQA uptraining starts from a multi-head checkpoint whose K/V projections are *mean-pooled* within each
group of consecutive heads ("GQA: Training Generalized Multi-Query Transformer Models from Multi-Head
Checkpoints", section 2.1), then trains for a small fraction α of the original steps. This module is the
conversion half, written as a pure function from state dict to state dict (STYLE.md point 9): no model,
no files, no global state, so it is trivial to test and to reuse on any weights. `checkpoints/convert.py`
applies it to a checkpoint folder and writes the new one (what `tfkit convert-mqa-to-gqa` runs).

Which old heads form a group is fixed by attention.py: query head h reads KV head h // (n_heads / kv),
i.e. `repeat_interleave` semantics. New KV head n therefore serves query heads n*g_new .. (n+1)*g_new - 1,
and the old KV heads those queries used are its *sources*:
- fewer heads (old % new == 0): the sources are the old heads n*r .. (n+1)*r - 1 (r = old / new), and
  `mean` averages them (the paper), `first` keeps the first one (the paper's weaker baseline);
- more heads (new % old == 0): the source is the single old head n // r (r = new / old), so `mean` and
  `first` both copy it -- the regrouped model computes exactly the same function (MQA -> MHA is lossless);
- `random` ignores the sources and re-initialises K/V with the model's own init (the paper's floor).
Any other pair of counts would mix heads from different groups and is rejected, as is a count that does
not divide n_heads. tfkit's attention keeps q/k/v as separate Linear layers (no fused QKV matrix), so only
`*.k_proj.*` and `*.v_proj.*` change, in every attention block: GPT/BERT self-attention, encoder
self-attention, decoder self-attention and decoder cross-attention alike.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor, nn

from ..errors import CheckpointError, ConfigError
from .config import ModelConfig
from .layers import init_weights

METHODS = ("mean", "first", "random")
KV_PROJECTIONS = ("k_proj", "v_proj")


def is_kv_key(key: str) -> bool:
    """True for the weight or bias of a key or value projection, e.g. `decoder.0.cross_attn.k_proj.bias`."""
    parts = key.rsplit(".", 2)
    return len(parts) == 3 and parts[1] in KV_PROJECTIONS and parts[2] in ("weight", "bias")


def check_regrouping(cfg: ModelConfig, new_kv_heads: int, method: str = "mean") -> None:
    """Raise ConfigError (naming new_kv_heads / method and the counts) unless the regrouping is possible."""
    if method not in METHODS:
        raise ConfigError(f"method: got {method!r}, expected one of {', '.join(METHODS)}", params=("method",))
    if cfg.shared_kv:
        raise ConfigError("model.shared_kv: this model's values are its keys' projection (it has no v_proj); regrouping "
                          "its key heads is not implemented")
    if cfg.shared_qk:
        raise ConfigError("model.shared_qk: this model's keys are its queries' projection (it has no k_proj), so its "
                          "key heads are its query heads and cannot be regrouped")
    old, heads = cfg.kv_heads, cfg.n_heads
    if isinstance(new_kv_heads, bool) or not isinstance(new_kv_heads, int) or new_kv_heads < 1:
        raise ConfigError(f"new_kv_heads: got {new_kv_heads!r}, expected a positive integer", params=("new_kv_heads",))
    if heads % new_kv_heads:
        divisors = [g for g in range(1, heads + 1) if heads % g == 0]
        raise ConfigError(
            f"new_kv_heads {new_kv_heads}: the model's {heads} query heads cannot be split into {new_kv_heads} "
            f"key/value groups (n_heads % kv_heads must be 0; choose one of {', '.join(map(str, divisors))})",
            params=("new_kv_heads",))
    if old % new_kv_heads and new_kv_heads % old:
        raise ConfigError(
            f"new_kv_heads {new_kv_heads}: cannot regroup {old} key/value heads into {new_kv_heads}: each new head "
            f"must pool a whole group of old heads ({old} % kv_heads == 0) or copy one old head "
            f"(kv_heads % {old} == 0)", params=("new_kv_heads",))


def pool_heads(w: Tensor, old: int, new: int, method: str) -> Tensor:
    """Regroup the head rows of one K or V weight (old*D, C) or bias (old*D,) into new*D rows.

    Rows are head-major (row h*D + d is dimension d of head h), as `Attention._heads` views them.
    """
    rows = w.reshape(old, -1, *w.shape[1:])  # (old, D, C) or (old, D)
    if new >= old:  # each new head copies the one old head its queries used: n -> n // (new / old)
        out = rows.repeat_interleave(new // old, dim=0)  # (new, D, ...)
    elif method == "mean":
        out = rows.reshape(new, old // new, *rows.shape[1:]).float().mean(dim=1).to(w.dtype)  # (new, D, ...)
    else:  # first
        out = rows.reshape(new, old // new, *rows.shape[1:])[:, 0]  # (new, D, ...)
    return out.reshape(new * rows.shape[1], *w.shape[1:]).clone()  # (new*D, C) or (new*D,)


def _check_state_dict(state_dict: dict[str, Tensor], cfg: ModelConfig) -> None:
    """The K/V tensors must be those of `cfg`: one k_proj and v_proj per attention block of the family
    (with biases when cfg.bias), each (kv_heads*D, d_model) / (kv_heads*D,). Derived from the config rather
    than by building a model, so a check costs nothing even for a large checkpoint."""
    from . import model_class  # late import: models/__init__ imports this package's modules

    rows = cfg.kv_heads * cfg.head_dim
    problems = []
    for key, tensor in state_dict.items():
        if is_kv_key(key):
            want = (rows, cfg.d_model) if key.endswith(".weight") else (rows,)
            if tuple(tensor.shape) != want:
                problems.append(f"shape of {key} is {tuple(tensor.shape)}, expected {want}")
    blocks = {k.rsplit(".", 2)[0] for k in state_dict if is_kv_key(k)}
    n_blocks = cfg.n_layers * model_class(cfg.arch).attention_layers_per_token
    if len(blocks) != n_blocks:
        problems.append(f"found K/V projections in {len(blocks)} attention blocks, expected {n_blocks}")
    wanted = ("weight", "bias") if cfg.bias else ("weight",)
    missing = sorted(f"{b}.{p}.{w}" for b in blocks for p in KV_PROJECTIONS for w in wanted
                     if f"{b}.{p}.{w}" not in state_dict)
    if missing:
        problems.append(f"missing keys {missing[:3]}")
    if problems:
        raise CheckpointError(f"the weights do not match the {cfg.arch} config with {cfg.n_heads} heads / "
                              f"{cfg.kv_heads} key/value heads: {'; '.join(sorted(problems)[:3])}")


def _random_projection(like: Tensor, key: str, cfg: ModelConfig, rows: int, seed: int) -> Tensor:
    """A freshly initialised (rows, C) weight or (rows,) bias, by the model's own `init_weights`.

    Reusing init_weights (rather than restating it) keeps `random` honest if the init ever changes; the
    projection is rebuilt under a forked RNG so the caller's global random state is untouched.
    """
    name = key.rsplit(".", 2)[1]  # k_proj | v_proj: neither is a residual projection, so std = init_std
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        holder = nn.Module()
        holder.add_module(name, nn.Linear(cfg.d_model, rows, bias=key.endswith(".bias")))
        init_weights(holder, cfg)
    tensor = getattr(holder, name).bias if key.endswith(".bias") else getattr(holder, name).weight
    return tensor.detach().to(device=like.device, dtype=like.dtype)


def regroup_kv_heads(state_dict: dict[str, Tensor], cfg: ModelConfig, new_kv_heads: int, method: str = "mean",
                     generator: torch.Generator | None = None) -> tuple[dict[str, Tensor], ModelConfig]:
    """Regroup every attention block's key/value heads to `new_kv_heads`; returns (new_state_dict, new_cfg).

    state_dict: a model's `state_dict()` (or a safetensors file's tensors) for `cfg`. method: mean | first |
    random (see the module docstring; growing the head count with mean/first replicates heads exactly).
    generator: the random source of `random` (None = torch's global generator). Inputs are never mutated:
    K/V tensors are new, every other tensor is the *same object* as in the input (no copy of the model).
    Raises ConfigError for an impossible regrouping, CheckpointError when the weights do not match `cfg`.
    """
    check_regrouping(cfg, new_kv_heads, method)
    _check_state_dict(state_dict, cfg)
    old, head_dim = cfg.kv_heads, cfg.head_dim
    new_cfg = dataclasses.replace(cfg, n_kv_heads=None if new_kv_heads == cfg.n_heads else new_kv_heads)
    out: dict[str, Tensor] = {}
    for key, tensor in state_dict.items():
        if not is_kv_key(key):
            out[key] = tensor
        elif method == "random":
            seed = int(torch.randint(0, 2**62, (1,), generator=generator))
            out[key] = _random_projection(tensor, key, cfg, new_kv_heads * head_dim, seed)
        else:
            out[key] = pool_heads(tensor.detach(), old, new_kv_heads, method)  # (new*D, C) or (new*D,)
    _check_state_dict(out, new_cfg.validate())
    return out, new_cfg


def attention_params(model: nn.Module) -> int:
    """Parameters of every attention block (q, k, v, o projections): what regrouping shrinks or grows."""
    from .attention import Attention

    return sum(p.numel() for m in model.modules() if isinstance(m, Attention) for p in m.parameters())
