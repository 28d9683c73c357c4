"""`tfkit eval CKPT --set model.KEY=VALUE`: a trained checkpoint under another setting of its model.

Some model keys change only how the weights are used, not which weights there are: the attention path
(`model.attention=naive`), the score scale (`model.attn_scale`), dropout, the norm epsilon, RoPE's base,
switching between position schemes that hold no weights. Evaluating a checkpoint under such a setting is
how a lab shows what a design choice does to a trained model. Whether a value keeps the weights is not
listed by hand: the model the new config describes is built on the meta device (no memory, no init) and
its tensors' names and shapes are compared with the checkpoint's. A value that adds, drops or reshapes a
tensor is refused, one line naming the key, the value and the first tensor that differs.
"""

from __future__ import annotations

import dataclasses

import yaml
from torch import nn

from ..checkpoints.meta import assign_weights, parameters_on_meta
from ..errors import ConfigError
from ..models import build_model
from ..models.config import ModelConfig


def parse_model_overrides(items: list[str]) -> list[tuple[str, object]]:
    """`model.KEY=VALUE` strings -> [(KEY, value)], each value read as YAML (`0.125` a number, `none` text).
    Only model keys: the evaluation's own settings are evaluate's parameters (seq_len, batch_size)."""
    fields = {f.name for f in dataclasses.fields(ModelConfig)}
    out: list[tuple[str, object]] = []
    for item in items:
        key, sep, text = item.partition("=")
        section, _, name = key.strip().partition(".")
        if not sep or section != "model" or not name:
            raise ConfigError(f"overrides {item!r}: expected model.KEY=VALUE, e.g. overrides model.attention=naive",
                              params=("overrides",))
        if name not in fields:
            raise ConfigError(f"overrides {item}: model.{name} is not a model key (see `tfkit recipes keys model`)",
                              params=("overrides",))
        try:
            out.append((name, yaml.safe_load(text)))
        except yaml.YAMLError:
            out.append((name, text))
    return out


Layout = dict[str, tuple[tuple[int, ...], str]]  # tensor name -> (shape, the first name of the tensor it is)


def _shapes(model: nn.Module) -> Layout:
    """Each tensor's shape and which tensor it is: names of one tensor (a tied embedding, a block shared across
    layers) share their first name, so a setting that would tie tensors the checkpoint holds apart is seen."""
    first: dict[int, str] = {}
    return {name: (tuple(t.shape), first.setdefault(id(t), name))
            for name, t in model.state_dict(keep_vars=True).items()}


def _first_difference(have: Layout, want: Layout) -> str | None:
    """The first tensor the two layouts disagree on, said as the checkpoint would see it; None if equal. Tensors
    the new layout holds apart where the checkpoint ties them are no difference (each gets the same values)."""
    for name in sorted(have.keys() | want.keys()):
        if name not in want:
            return f"it has no {name}, which the checkpoint holds"
        if name not in have:
            return f"it needs {name}, which the checkpoint lacks"
        if have[name][0] != want[name][0]:
            return f"{name} would be {list(want[name][0])} but the checkpoint's is {list(have[name][0])}"
        tied_to = want[name][1]
        if tied_to in have and have[name][1] != have[tied_to][1]:
            return f"{name} would be the same tensor as {tied_to}, which the checkpoint holds apart"
    return None


def with_model_overrides(model: nn.Module, cfg: ModelConfig, items: list[str]) -> tuple[nn.Module, ModelConfig]:
    """The loaded `model` rebuilt under its config with `items` applied, holding the same tensors (no copy).

    Each override is checked alone first, so a refusal names the key that changes the weights; then all of
    them together (a combination can be invalid, e.g. rope with an odd head size, and a key can be valid
    only with another, e.g. model.rope_factor with model.rope_scaling)."""
    if not items:
        return model, cfg
    values = parse_model_overrides(items)
    have, base = _shapes(model), cfg.to_dict()
    for item, (name, value) in zip(items, values):
        _check_one(item, name, value, base, have)
    given = " ".join(f"overrides {i}" for i in items)
    new_cfg = _config({**base, **dict(values)}, given)  # the last value of a key given twice
    new_model, difference = _build_on_meta(new_cfg, have)
    if difference:
        raise ConfigError(f"{given}: together they change the model's weights ({difference}); only settings "
                          "that keep every weight can be evaluated", params=("overrides",))
    device = next(model.parameters()).device
    assign_weights(new_model, model.state_dict(), "the checkpoint", f"the {new_cfg.arch} model with the overrides")
    return new_model.to(device).train(model.training), new_cfg


def _check_one(item: str, name: str, value: object, base: dict, have: Layout) -> None:
    try:
        config = _config({**base, name: value}, f"overrides {item}")
    except ConfigError:
        return  # valid only with another key (model.rope_factor with model.rope_scaling): checked together
    _, difference = _build_on_meta(config, have)
    if difference:
        raise ConfigError(f"overrides {item}: model.{name}={value} changes the model's weights ({difference}); only "
                          "keys that keep every weight (e.g. model.attention, model.attn_scale) can be evaluated",
                          params=("overrides",))


def _build_on_meta(cfg: ModelConfig, have: Layout) -> tuple[nn.Module, str | None]:
    """The model of `cfg` with its parameters on the meta device (no memory), and the first parameter whose
    shape or tying differs from `have` (None when every weight keeps its shape and stays apart where it was)."""
    with parameters_on_meta():
        model = build_model(cfg)
    return model, _first_difference(have, _shapes(model))


def _config(values: dict, source: str) -> ModelConfig:
    """`ModelConfig.from_dict`'s one ConfigError naming every invalid value, which `source` (the overrides
    given) begins."""
    try:
        return ModelConfig.from_dict(values, source=source)
    except ConfigError as exc:
        raise ConfigError(str(exc), params=("overrides",)) from None
