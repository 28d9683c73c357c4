"""`tfkit plan` and `model.size: auto`: the model, batch and learning rate for a time budget on this machine.

The plan walks the width dial (trainer/sizing.py) from its smallest rung up. For each shape it predicts the
peak memory per device from the keys (trainer/memory.py) and takes the largest micro-batch of the recipe's
batch that fits (train.grad_accum the rest); it measures a few updates of the shape on this machine
(trainer/pace.py, CPU time of this process on a CPU), turns them into the updates and tokens the budget
trains, and predicts the loss those tokens give that size (sizing.predicted_loss). The shape of the lowest
predicted loss wins: the compute-optimal size *at this machine's own cost of each size*. The walk stops two
rungs after the predicted loss stopped falling, or at a shape that fits fewer than MIN_UPDATES updates, so
a plan measures a handful of shapes (seconds, not minutes).

Keys given by hand win over the plan: a d_model in the recipe file or --set leaves one rung, a given
n_layers or n_heads is kept at every rung (null leaves them free); a train.grad_accum given by --set is kept,
and a train.max_steps given by --set caps the planned updates (the file's train keys are what the plan
replaces). The learning rate follows the width (sizing.scaled_lr) unless optim.lr was given
by hand for a given d_model. Tests pass a fake `measure` (a pace per shape), so no test depends on the speed
of the machine.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import ConfigError
from ..models.config import ModelConfig
from .budget import VALIDATIONS, parse_duration
from .memory import Layout, MemoryEstimate, estimate_memory, gib
from .recipe import Recipe
from .sections import AUTO_SIZE
from .resources import count_parameters
from .sizing import MIN_UPDATES, Shape, ladder, predicted_loss, scaled_lr

Measure = Callable[[Recipe, ModelConfig], "Pace"]  # noqa: F821 - trainer.pace.Pace, imported with torch
EVAL_COST = 1 / 3  # a validation batch (forward only) costs about a third of a training micro-batch
# a run's updates over measure_pace's on one fixed batch (the data pipeline's batches, the loop's windows): fitted
# on the GPT rows of benchmarks/plan.py's first pass (0.73-0.86), its BERT and encoder-decoder rows the check
RUN_SPEED = 0.8
PATIENCE = 2  # rungs measured past the best predicted loss before the walk stops
BYTES_PER_TOKEN = 4.0  # of UTF-8 text per token, to count a corpus's unique tokens from its size
STDLIB_BYTES = {"stdlib:docs": 1.6e6}  # the built-in docs corpus (recipes/quickstart.yaml's tokenizer note)
FIXED_MODEL_KEYS = ("d_model", "n_layers", "n_heads", "n_kv_heads")


@dataclass(frozen=True)
class Candidate:
    """One shape as the plan sees it: its memory at the chosen micro-batch and, once measured, its pace."""

    shape: Shape
    params: int
    batch_size: int
    grad_accum: int
    memory: MemoryEstimate
    seconds: float = math.nan  # wall seconds per update the run will see (measured, scaled by the CPU share)
    updates: int = 0
    tokens: int = 0
    loss: float = math.inf  # the law's predicted loss (sizing.predicted_loss)

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.updates / self.seconds if self.updates else 0.0


@dataclass(frozen=True)
class Plan:
    """The chosen candidate, every one measured, and the resolved recipe that `pretrain` runs."""

    recipe: Recipe
    chosen: Candidate
    candidates: tuple[Candidate, ...]
    budget: float  # seconds of training
    memory_limit: int
    share: float  # CPU seconds per wall second this process got while measuring (1.0 on a GPU)
    device: str
    notes: tuple[str, ...] = ()

    @property
    def shape(self) -> Shape:
        return self.chosen.shape

    def sets(self) -> list[str]:
        """The --set items that make the recipe this plan's (what `tfkit plan` prints to copy)."""
        m, t = self.recipe.model, self.recipe.train
        return [f"model.size=null", f"model.d_model={m.d_model}", f"model.n_layers={m.n_layers}",
                f"model.n_heads={m.n_heads}", f"optim.lr={self.recipe.optim.lr:.4g}",
                f"train.batch_size={t.batch_size}", f"train.grad_accum={t.grad_accum}",
                f"train.max_steps={t.max_steps}", f"train.max_time={t.max_time}"]

    def text(self) -> str:
        c, r = self.chosen, self.recipe
        clock = "CPU time of this process" if self.device == "cpu" else "wall time"
        lines = [f"plan for {r.name}: {fmt_seconds(self.budget)} of training on {self.device}, "
                 f"memory limit {gib(self.memory_limit)} per device",
                 f"  model      {c.shape}: {c.params / 1e6:.2f}M parameters",
                 f"  batch      {c.batch_size} sequences of {r.data.seq_len} tokens, micro-batch "
                 f"{c.batch_size // c.grad_accum} x {c.grad_accum} accumulated",
                 f"  updates    {c.updates:,} ({c.tokens / 1e6:.2f}M tokens, {c.tokens / max(c.params, 1):.1f} "
                 "tokens per parameter)",
                 f"  speed      {c.tokens_per_second:,.0f} tokens/s predicted ({c.seconds:.3g} s per update; measured "
                 f"in {clock}, CPU share {self.share:.2f})",
                 f"  memory     {c.memory.line()} predicted peak per device",
                 f"  optim.lr   {r.optim.lr:.3g}",
                 "  why        the lowest loss predicted by L(N, D) = 1.82 + 482/N^0.348 + 2085/D^0.366 (Besiroglu et "
                 "al. 2024's refit of Chinchilla, Hoffmann et al. 2022) at the tokens this machine trains each size "
                 "in the budget; the learning rate scaled as (d_model/128)^-0.5 (nanochat's AdamW rule)",
                 "  candidates (shape, parameters, micro-batch, s/update, updates, L(N, D): the law's loss, which "
                 "ranks sizes; its nats are the refit's large-vocabulary text, not this run's):"]
        for k in self.candidates:
            mark = " <- planned" if k.shape == c.shape else ""
            lines.append(f"    {k.shape}: {k.params / 1e6:.2f}M, {k.batch_size // k.grad_accum}, {k.seconds:.3g}, "
                         f"{k.updates:,}, {k.loss:.3f}{mark}")
        return "\n".join(lines + [f"  note: {n}" for n in self.notes])


def fmt_seconds(seconds: float) -> str:
    return f"{seconds / 3600:.3g} h" if seconds >= 7200 else f"{seconds / 60:.3g} min" if seconds >= 120 \
        else f"{seconds:.3g} s"


def layout_of(recipe: Recipe, grad_accum: int, batch_size: int, processes: int, device: str) -> Layout:
    """How `recipe` lays its updates out (memory.Layout) at a given batch and accumulation."""
    t, fused = recipe.train, recipe.objective.fused_loss
    precision = t.precision if t.precision != "auto" else "fp32" if device == "cpu" else "bf16"  # optim's auto
    return Layout(micro_batch=max(1, batch_size // grad_accum // processes), seq_len=recipe.data.seq_len,
                  objective=recipe.objective.name, optimizer=recipe.optim.name, precision=precision,
                  grad_accum=grad_accum, activation_checkpointing=t.activation_checkpointing, processes=processes,
                  distributed=t.distributed, fused_loss=fused == "on" or (fused == "auto" and device == "cpu"),
                  device=device)


def fitting_accum(recipe: Recipe, cfg: ModelConfig, batch_size: int, limit: int, processes: int, device: str,
                  fixed: int | None = None) -> tuple[int, MemoryEstimate]:
    """The fewest micro-batches of `batch_size` whose update fits `limit` (or `fixed`), with its estimate."""
    options = [fixed] if fixed else [a for a in range(1, batch_size + 1) if batch_size % a == 0]
    for accum in options:
        memory = estimate_memory(cfg, layout_of(recipe, accum, batch_size, processes, device))
        if memory.peak <= limit:
            return accum, memory
    return options[-1], memory


def unique_tokens(spec) -> float | None:
    """The tokens of distinct text a corpus holds, from its size (BYTES_PER_TOKEN); None when unknown."""
    if isinstance(spec, str):
        for name, size in STDLIB_BYTES.items():
            if spec.startswith(name):
                return size / BYTES_PER_TOKEN
        if os.path.isfile(spec):
            return os.path.getsize(spec) / BYTES_PER_TOKEN
    return None


def given_keys(recipe: Recipe) -> set[str]:
    """The keys the plan keeps: model keys the file or --set wrote (a null one leaves the plan free), and the
    train keys --set gave (a bundled recipe's file writes out every train key: those the plan replaces)."""
    model = {k for k in recipe.given if k.startswith("model.")}
    return model | set(recipe.overrides)


def plan_recipe(recipe: Recipe, budget: float | None = None, memory_limit: int | None = None,
                measure: Measure | None = None, device: str = "cpu", processes: int = 1,
                cpu_budget: bool = False) -> Plan:
    """The plan for `recipe` in `budget` seconds (else its train.max_time) under `memory_limit` bytes per device
    (else this machine's), each shape timed by `measure` (else trainer.pace.measure_pace on `device`).
    `cpu_budget`: the budget counts CPU time of this process, as the measurement does (experiments)."""
    if budget is None:
        if recipe.train.max_time is None:
            raise ConfigError("train.max_time: a plan is made for a time budget: give one (e.g. 10m)")
        budget = parse_duration(recipe.train.max_time)
    if memory_limit is None:
        memory_limit = default_memory_limit(device)
    if measure is None:
        measure = _real_measure(device)
    kind = device.split(":")[0]
    clock = "budget-cpu" if cpu_budget else kind
    given = given_keys(recipe)
    fixed = {k: getattr(recipe.model, k) if f"model.{k}" in given else None for k in FIXED_MODEL_KEYS}
    fixed_accum = recipe.train.grad_accum if "train.grad_accum" in given else None
    vocab = recipe.model.vocab_size or recipe.tokenizer.vocab_size
    unique = unique_tokens(recipe.data.train)
    t = recipe.train
    validation = (VALIDATIONS + 1) * recipe.eval.batches * EVAL_COST * (recipe.eval.batch_size or t.batch_size)
    measured: list[tuple[Candidate, object]] = []
    refused: tuple[str, Candidate, float] | None = None  # why the walk stopped before any shape: memory or time
    best, since_best = math.inf, 0
    for shape in ladder(fixed):
        cfg = _config(recipe, shape, vocab)
        if cfg is None:
            continue
        accum, memory = fitting_accum(recipe, cfg, t.batch_size, memory_limit, processes, kind, fixed_accum)
        candidate = Candidate(shape, count_parameters(cfg), t.batch_size, accum, memory)
        if memory.peak > memory_limit:
            refused = refused or ("memory", candidate, 0.0)
            break  # every larger rung needs more
        pace = measure(_with(recipe, shape, t.batch_size, accum), cfg)
        scored = _scored(candidate, pace, _share([p for _, p in measured] + [pace], clock), budget, validation, unique)
        if scored.updates < MIN_UPDATES:
            refused = refused or ("time", candidate, scored.seconds)
            break  # a larger shape is slower still
        measured.append((candidate, pace))
        since_best += 1
        if scored.loss < best:
            best, since_best = scored.loss, 0
        if since_best >= PATIENCE:
            break
    if not measured:
        _refuse(budget, memory_limit, refused, fixed, validation)
    share = _share([p for _, p in measured], clock)
    candidates = tuple(_scored(c, p, share, budget, validation, unique) for c, p in measured)
    chosen = min(candidates, key=lambda c: c.loss)
    notes = []
    if "train.max_steps" in given and recipe.train.max_steps < chosen.updates:
        notes.append(f"train.max_steps={recipe.train.max_steps:,} was given by hand and wins: the run stops "
                     f"there, before the {chosen.updates:,} updates planned")
        chosen = dataclasses.replace(chosen, updates=recipe.train.max_steps)
    resolved = resolve(recipe, chosen, given, budget)
    return Plan(resolved, chosen, candidates, budget, memory_limit, share, kind, tuple(notes))


def _scored(c: Candidate, pace, share: float, budget: float, validation: float, unique: float | None) -> Candidate:
    seconds = pace.seconds / share / RUN_SPEED
    updates = int(budget / seconds - validation / c.batch_size)
    tokens = updates * pace.tokens
    return dataclasses.replace(c, seconds=seconds, updates=updates, tokens=tokens,
                               loss=predicted_loss(c.params, tokens, unique))


def _share(paces: list, device: str) -> float:
    """CPU seconds per wall second over every measured update (trainer.pace.Pace.share); 1.0 on a GPU."""
    cpu, wall = sum(p.seconds for p in paces), sum(p.wall for p in paces)
    return cpu / wall if device == "cpu" and cpu > 0 and wall > 0 else 1.0


def _config(recipe: Recipe, shape: Shape, vocab: int) -> ModelConfig | None:
    """The model config of `shape` under the recipe's other model keys; None for a shape they rule out
    (heads that do not divide the width)."""
    model = dataclasses.replace(recipe.model, size=None, **shape.keys())
    cfg = model.config(vocab)
    return None if cfg.problems("model") else cfg


def _with(recipe: Recipe, shape: Shape, batch_size: int, accum: int) -> Recipe:
    return dataclasses.replace(recipe, model=dataclasses.replace(recipe.model, size=None, **shape.keys()),
                               train=dataclasses.replace(recipe.train, batch_size=batch_size, grad_accum=accum))


def resolve(recipe: Recipe, chosen: Candidate, given: set[str], budget: float) -> Recipe:
    """The recipe `pretrain` runs: the chosen shape, micro-batch, updates, and the learning rate for its width."""
    lr = recipe.optim.lr
    if not ("optim.lr" in given and "model.d_model" in given):
        lr = scaled_lr(lr, chosen.shape.d_model)
    planned = _with(recipe, chosen.shape, chosen.batch_size, chosen.grad_accum)
    max_time = recipe.train.max_time if recipe.train.max_time is not None else f"{budget:g}s"
    return dataclasses.replace(planned, optim=dataclasses.replace(recipe.optim, lr=lr),
                               train=dataclasses.replace(planned.train, max_steps=max(chosen.updates, 1),
                                                         max_time=max_time))


def _refuse(budget: float, limit: int, refused: tuple[str, Candidate, float] | None, fixed: dict,
            validation: float) -> None:
    """One line: why no shape fits, and what the smallest would need."""
    hand = ", ".join(f"model.{k}={v}" for k, v in fixed.items() if v is not None)
    wins = f" ({hand} given by hand: a given key wins over the plan)" if hand else ""
    if refused is None:
        raise ConfigError(f"model: no shape of the dial fits the keys given by hand ({hand or 'none'})")
    why, c, seconds = refused
    if why == "memory":
        raise ConfigError(f"memory: the smallest model the plan may choose{wins}, {c.shape} at micro-batch "
                          f"{c.batch_size // c.grad_accum}, needs {gib(c.memory.peak)} per device, above the limit "
                          f"of {gib(limit)}", params=("memory",))
    need = seconds * (MIN_UPDATES + validation / c.batch_size)
    raise ConfigError(f"train.max_time: {fmt_seconds(budget)} trains fewer than {MIN_UPDATES} updates of the "
                      f"smallest model{wins} ({c.shape}, batch {c.batch_size}, {seconds:.3g} s per update here); "
                      f"it needs at least {fmt_seconds(math.ceil(need))}")


def default_memory_limit(device: str) -> int:
    """The bytes a run may use per device: this machine's memory (a CPU) less a fifth for everything else,
    or the GPU's less its CUDA context."""
    if device == "cpu":
        from ..runtime import machine_memory  # noqa: PLC0415

        return int(machine_memory() * 0.8)
    import torch  # noqa: PLC0415

    from .memory import CUDA_CONTEXT  # noqa: PLC0415

    return torch.cuda.get_device_properties(torch.device(device)).total_memory - CUDA_CONTEXT


def _real_measure(device: str) -> Measure:
    import torch  # noqa: PLC0415

    from .pace import measure_pace  # noqa: PLC0415

    return lambda recipe, cfg: measure_pace(recipe, cfg, torch.device(device))


_MEMORY = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(k|m|g|t)i?b?\s*$", re.IGNORECASE)


def parse_memory(value: str, key: str = "memory") -> int:
    """Bytes in `512MiB`, `8GiB`, `8G` or `1.5TB` (binary units); one line naming `key` otherwise."""
    match = _MEMORY.match(str(value))
    if not match:
        raise ConfigError(f"{key}: got {value!r}, expected a size such as 512MiB or 8GiB", params=(key,))
    number, unit = float(match.group(1)), match.group(2).lower()
    return int(number * 2 ** (10 * "kmgt".index(unit) + 10))


def plan_for_run(recipe: Recipe, device: str, processes: int, show: Callable[[str], None]) -> Recipe:
    """The recipe a run trains: with model.size: auto, the plan's (shown with `show` first); else as given,
    once its predicted peak memory fits the device (`check_fits`). A plan is made on one process: ranks that
    each measured would choose apart."""
    if recipe.model.size != AUTO_SIZE:
        if recipe.head_task is None:  # a fine-tuning run's model is its checkpoint's, known later
            check_fits(recipe, device, processes)
        return recipe
    if processes > 1:
        raise ConfigError("model.size: auto is planned on one process; run `tfkit plan RECIPE --out FILE` and "
                          "start torchrun with FILE, the plan's keys written out")
    plan = plan_recipe(recipe, device=device)
    show(plan.text())
    return plan.recipe


def check_fits(recipe: Recipe, device: str, processes: int = 1, limit: int | None = None) -> None:
    """A recipe given by hand whose predicted peak memory exceeds the device's is refused before training,
    with the accumulation that fits at its batch (or the plan, where none does)."""
    kind = device.split(":")[0]
    limit = default_memory_limit(device) if limit is None else limit
    cfg = recipe.model.config(recipe.model.vocab_size or recipe.tokenizer.vocab_size)
    t = recipe.train
    need = estimate_memory(cfg, layout_of(recipe, t.grad_accum, t.batch_size, processes, kind))
    if need.peak <= limit:
        return
    accum, fits = fitting_accum(recipe, cfg, t.batch_size, limit, processes, kind)
    instead = (f"train.grad_accum={accum} fits (micro-batch {t.batch_size // accum // processes}, {gib(fits.peak)})"
               if fits.peak <= limit else "no micro-batch of this model fits: `tfkit plan RECIPE --time T` "
               "chooses a model that does")
    raise ConfigError(f"model: this run's predicted peak memory is {need.line()} per device at micro-batch "
                      f"{t.batch_size // t.grad_accum // processes}, above the {gib(limit)} this {kind} may use; "
                      f"{instead}")
