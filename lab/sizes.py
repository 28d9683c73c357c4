"""A ladder of model sizes: the same lab at several widths (`model.d_model`) or depths (`model.n_layers`), every
rung trained for the same tokens per parameter, so a verdict can be read per size and a trend across sizes.

Several claims reverse the literature at 1M parameters and under one token per parameter (tied embeddings, where
the output matrix is a third of the model; BatchNorm in BERT; pre-LN without warmup), and a verdict at one size
cannot say whether it is about the design or about the size. `tfkit lab run CLAIM --sizes 3` (or a spec's
`sizes:` block) runs the lab at each size, each rung an ordinary lab folder (`d_model-64/`), and ladder.py
writes the verdicts side by side with the trend of each paired difference against log2(parameters).

Each rung keeps what a size comparison must keep fixed: the tokens per parameter (the spec's
`sizes.tokens_per_param`, else the base recipe's own at its own size, so the rung at the base size is the
ordinary lab) and the schedule's shape (warmup as the same share of the steps). The steps follow from the
reference variant's parameters at that rung (counted on a model built on the meta device, the vocabulary the
tokenizer is asked for). The learning rate is the recipe's at every rung unless the spec's `sizes.set` says
otherwise for a rung: the report says so, since a rate tuned at one width is not tuned at the others."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from ..errors import ConfigError
from ..trainer.recipe import Recipe, load_recipe
from .plan import LabOptions, base_overrides
from .spec import LabSpec

DEFAULT_FACTORS = (0.5, 1, 2, 4, 8)  # --sizes N without a `sizes:` block: these multiples of the base width


@dataclass(frozen=True)
class SizeRung:
    """One rung: the model key it sets, its value, the overrides that make it (steps and warmup included)."""
    key: str  # d_model | n_layers
    value: int
    overrides: tuple[str, ...]
    params: int  # of the reference variant at this size, as planned (results.json has the measured count)
    steps: int

    @property
    def name(self) -> str:
        return f"{self.key}-{self.value}"


def count_params(recipe: Recipe) -> int:
    """Parameters of the model `recipe` trains, built on the meta device (no memory, no init)."""
    from ..models import build_model

    vocab = recipe.model.vocab_size or recipe.tokenizer.vocab_size
    with torch.device("meta"):
        return build_model(recipe.model.config(vocab)).num_params()


def reference_recipe(spec: LabSpec, options: LabOptions, extra: list[str]) -> Recipe:
    """The recipe of the spec's reference variant (or its first) with `extra` overrides after the lab's own."""
    name = spec.reference if spec.reference in spec.variants else next(iter(spec.variants))
    tail = list(spec.quick) if options.quick else []
    return load_recipe(spec.base_path(), base_overrides(spec, options) + extra + spec.variants[name] + tail)


def size_values(spec: LabSpec, base: Recipe, count: int | None) -> tuple[str, list[int]]:
    """(model key, values) of the ladder: the spec's `sizes:` (its first `count` with --sizes N), else `count`
    multiples of the base width (DEFAULT_FACTORS), each divisible by the head count."""
    if spec.sizes:
        values = spec.sizes["values"]
        if count is not None and not 2 <= count <= len(values):
            raise ConfigError(f"sizes: got {count}, expected 2 to {len(values)} (the rungs {spec.path} lists: "
                              f"{values})", params=("sizes",))
        return spec.sizes["key"], values[:count] if count else values
    if count is None or not 2 <= count <= len(DEFAULT_FACTORS):
        raise ConfigError(f"sizes: got {count}, expected 2 to {len(DEFAULT_FACTORS)} (widths of {DEFAULT_FACTORS} "
                          "times the base d_model)", params=("sizes",))
    d, heads = base.model.d_model, base.model.n_heads
    values = [max(heads, int(d * f) // heads * heads) for f in DEFAULT_FACTORS[:count]]
    if len(set(values)) != len(values):
        raise ConfigError(f"sizes: the widths {values} from d_model {d} and {heads} heads repeat; give the spec a "
                          "sizes block", params=("sizes",))
    return "d_model", values


def size_rungs(spec: LabSpec, options: LabOptions, count: int | None) -> list[SizeRung]:
    """Every rung of the ladder, its steps set for the same tokens per parameter (module doc)."""
    if options.steps:
        raise ConfigError("steps: a ladder of sizes sets each rung's training length from its parameters (tokens per "
                          "parameter); set the spec's sizes.tokens_per_param instead", params=("steps",))
    base = reference_recipe(spec, options, [])
    key, values = size_values(spec, base, count)
    per_step = base.train.batch_size * base.data.seq_len
    ratio = (spec.sizes or {}).get("tokens_per_param") or base.train.max_steps * per_step / count_params(base)
    rungs = []
    for value in values:
        own = [f"model.{key}={value}", *((spec.sizes or {}).get("set", {}).get(value, []))]
        recipe = reference_recipe(spec, options, own)
        params = count_params(recipe)
        steps = max(1, round(ratio * params / (recipe.train.batch_size * recipe.data.seq_len)))
        warmup = round(recipe.schedule.warmup_steps * steps / recipe.train.max_steps)
        rungs.append(SizeRung(key, value, (*own, f"train.max_steps={steps}", f"schedule.warmup_steps={warmup}"),
                              params, steps))
    return rungs


def rung_options(options: LabOptions, rung: SizeRung) -> LabOptions:
    """The options of one rung's lab: the user's --set, then the rung's size, steps and warmup."""
    return dataclasses.replace(options, sets=[*options.sets, *rung.overrides])
