"""`tfkit plan` and `model.size: auto`: the model, batch and learning rate for a time budget on this machine.

The plan walks the width dial (trainer/sizing.py) from its smallest rung up. For each shape it predicts the
peak memory per device from the keys (trainer/memory.py) and takes the largest micro-batch of the recipe's
batch that fits (train.grad_accum the rest); it measures a few updates of the shape on this machine
(trainer/pace.py, CPU time of this process on a CPU), turns them into the updates and tokens the budget
trains once the run's validations are paid for (budget.Validation), and predicts the loss those tokens give that
size (sizing.predicted_loss; the data counted are the tokens that carry a loss, Pace.predicted: an MLM learns
from its chosen tokens only). The shape of the lowest
predicted loss wins: the compute-optimal size *at this machine's own cost of each size*. The walk stops two
rungs after the predicted loss stopped falling, or at a shape that fits fewer than MIN_UPDATES updates, so
a plan measures a handful of shapes (seconds, not minutes). Where the planned shape fits fewer than
sizing.TARGET_UPDATES updates, the batch is halved and the walk made once more (`plan_recipe`); the run still
validates the rows of the recipe's batch (`eval_rows`), so its validation loss is comparable. The planned
updates are a prediction: train.max_time ends the run, train.max_steps is a cap of STEPS_CAP times them. A run
planned to repeat its corpus more than sizing.KEEP_BEST_EPOCHS times keeps its best validated weights
(train.keep_best; sizing's module doc says why), unless --set gave train.keep_best.

Keys given by hand win over the plan: a d_model in the recipe file or --set leaves one rung, a given
n_layers or n_heads is kept at every rung (null leaves them free); a train.grad_accum given by --set is kept,
a train.batch_size given by --set is never halved, and a train.max_steps given by --set caps the run (the
file's train keys are what the plan replaces). The learning rate follows the width (sizing.scaled_lr) unless optim.lr was given
by hand for a given d_model. Tests pass a fake `measure` (a pace per shape), so no test depends on the speed
of the machine.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import ConfigError, DataError
from ..models.config import ModelConfig
from ..tokenization.corpus import resolve_files
from ..tokenization.stdlib_corpus import source_files
from .budget import EVAL_COST, Validation, cpu_share, fmt_seconds, planned_budget, update_seconds
from .finetune_plan import check_finetune_fits
from .fits import check_fits, default_memory_limit, fitting_accum
from .memory import MemoryEstimate, gib
from .pair_lengths import BYTES_PER_TOKEN
from .recipe import Recipe
from .sections import AUTO_SIZE
from .resources import count_parameters
from .sizing import (KEEP_BEST_EPOCHS, MIN_BATCH, MIN_UPDATES, OVERFIT_EPOCHS, TARGET_UPDATES, Shape, ladder,
                     predicted_loss, scaled_lr)

Measure = Callable[[Recipe, ModelConfig], "Pace"]  # noqa: F821 - trainer.pace.Pace, imported with torch
PATIENCE = 2  # rungs measured past the best predicted loss before the walk stops
STEPS_CAP = 2  # train.max_steps of a planned run, in planned updates: a cap only (`resolve`)
DOCS_BYTES = 1.6e6  # the built-in docs corpus, stdlib:docs (recipes/quickstart.yaml's tokenizer note)
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
    unique: float | None = None  # tokens of distinct text in data.train (`unique_tokens`), None when unknown

    @property
    def shape(self) -> Shape:
        return self.chosen.shape

    def sets(self) -> list[str]:
        """The --set items that make the recipe this plan's (what `tfkit plan` prints to copy)."""
        m, t = self.recipe.model, self.recipe.train
        return ["model.size=null", f"model.d_model={m.d_model}", f"model.n_layers={m.n_layers}",
                f"model.n_heads={m.n_heads}", f"optim.lr={self.recipe.optim.lr:.4g}",
                f"train.batch_size={t.batch_size}", f"train.grad_accum={t.grad_accum}",
                f"train.max_steps={t.max_steps}", f"train.max_time={t.max_time}",
                f"eval.batch_size={self.recipe.eval.batch_size}", f"train.keep_best={str(t.keep_best).lower()}"]

    def text(self) -> str:
        c, r = self.chosen, self.recipe
        clock = "CPU time of this process" if self.device == "cpu" else "wall time"
        epochs = f", {c.tokens / self.unique:.1f} epochs of data.train" if self.unique else ""
        lines = [f"plan for {r.name}: {fmt_seconds(self.budget)} of training on {self.device}, "
                 f"memory limit {gib(self.memory_limit)} per device",
                 f"  model      {c.shape}: {c.params / 1e6:.2f}M parameters",
                 f"  batch      {c.batch_size} sequences of {r.data.seq_len} tokens, micro-batch "
                 f"{c.batch_size // c.grad_accum} x {c.grad_accum} accumulated",
                 f"  updates    {c.updates:,} ({c.tokens / 1e6:.2f}M tokens, {c.tokens / max(c.params, 1):.1f} "
                 f"tokens per parameter{epochs})",
                 f"  speed      {c.tokens_per_second:,.0f} tokens/s predicted ({c.seconds:.3g} s per update; measured "
                 f"in {clock}, CPU share {self.share:.2f})",
                 f"  memory     {c.memory.line()} predicted peak per device",
                 f"  optim.lr   {r.optim.lr:.3g}",
                 "  why        the lowest loss predicted by L(N, D) = 1.82 + 482/N^0.348 + 2085/D^0.366 (Besiroglu et "
                 "al. 2024's refit of Chinchilla, Hoffmann et al. 2022) at the tokens this machine trains each size "
                 f"in the budget, tokens past {OVERFIT_EPOCHS} epochs of a corpus counted as none; the learning rate "
                 "scaled as (d_model/128)^-0.5 (nanochat's AdamW rule)",
                 "  candidates (shape, parameters, micro-batch, s/update, updates, L(N, D): the law's loss, which "
                 "ranks sizes; its nats are the refit's large-vocabulary text, not this run's):"]
        for k in self.candidates:
            mark = " <- planned" if k.shape == c.shape else ""
            lines.append(f"    {k.shape}: {k.params / 1e6:.2f}M, {k.batch_size // k.grad_accum}, {k.seconds:.3g}, "
                         f"{k.updates:,}, {k.loss:.3f}{mark}")
        return "\n".join(lines + [f"  note: {n}" for n in self.notes])


def unique_tokens(spec) -> float | None:
    """The tokens of distinct text a corpus holds, from its size (BYTES_PER_TOKEN); None when unknown. stdlib:code
    is the standard library's sources, whose size is this Python's (their files' sizes, without reading them); a
    file, folder or glob is its files' sizes (`resolve_files`, as the run reads them)."""
    if not isinstance(spec, str):
        return None
    if spec.startswith("stdlib:docs"):
        return DOCS_BYTES / BYTES_PER_TOKEN
    if spec.startswith("stdlib:code"):
        return sum(path.stat().st_size for _, path in source_files()) / BYTES_PER_TOKEN
    try:
        return sum(path.stat().st_size for path in resolve_files(spec)) / BYTES_PER_TOKEN
    except DataError:  # the run says what is wrong with the corpus; the plan only goes without its size
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
    `cpu_budget`: the budget counts CPU time of this process, as the measurement does (experiments).

    The batch: where the planned shape fits fewer than TARGET_UPDATES updates at the recipe's batch (or even
    the smallest fits fewer than MIN_UPDATES), the batch is halved, down to MIN_BATCH sequences and never a
    train.batch_size given by --set, and the walk made again (sizing.TARGET_UPDATES says why)."""
    budget = planned_budget(recipe, budget)
    walk = _Walk(recipe, budget, default_memory_limit(device) if memory_limit is None else memory_limit,
                 measure or _real_measure(device), device.split(":")[0], processes, cpu_budget)
    batch, notes, found = recipe.train.batch_size, [], None
    while True:
        measured, refused = walk.run(batch)
        if measured:
            found = (batch, walk.chosen(measured, batch))
        short = (found[1][1].updates < TARGET_UPDATES if measured  # else the last plan found stands, or none:
                 else found is None and refused is not None and refused[0] == "time")  # even the smallest too slow
        if not (short and walk.can_halve(batch)):
            break
        # an update's time is about its batch's: jump to the batch that should fit TARGET_UPDATES, then halve on
        halvings = math.ceil(math.log2(TARGET_UPDATES / max(found[1][1].updates, 1))) if measured else 1
        for _ in range(max(1, halvings)):
            if walk.can_halve(batch):
                batch //= 2
    if found is None:
        _refuse(budget, walk.limit, refused, walk.fixed, walk.validation, recipe.train.batch_size)
    batch, (share, chosen, candidates) = found
    if batch != recipe.train.batch_size:
        notes.append(f"train.batch_size halved from {recipe.train.batch_size} to {batch}, the largest batch at which "
                     f"the planned model should fit {TARGET_UPDATES:,} updates or more in {fmt_seconds(budget)} here "
                     f"(or the floor, {MIN_BATCH}): a short run is held back by its updates more than by its tokens "
                     "(trainer/sizing.py, TARGET_UPDATES); optim.lr scaled by the square root of the batch "
                     "(Malladi et al. 2022's rule for Adam)")
    if "train.max_steps" in walk.given and recipe.train.max_steps < chosen.updates:
        notes.append(f"train.max_steps={recipe.train.max_steps:,} was given by hand and wins: the run stops "
                     f"there, before the {chosen.updates:,} updates planned")
        chosen = dataclasses.replace(chosen, updates=recipe.train.max_steps)
    keep_best = recipe.train.keep_best
    if walk.unique and chosen.tokens > KEEP_BEST_EPOCHS * walk.unique and "train.keep_best" not in walk.given:
        keep_best = True
        notes.append(f"the run repeats data.train {chosen.tokens / walk.unique:.0f} times, past the "
                     f"{KEEP_BEST_EPOCHS} epochs within which repeated text is worth about as much as fresh: "
                     "train.keep_best=true, so best/ holds the weights of its lowest validation loss, which eval and "
                     "generate take (a small corpus's validation can climb late in a run; trainer/sizing.py)")
    if batch != recipe.train.batch_size and "optim.lr" not in walk.given:
        optim = dataclasses.replace(recipe.optim, lr=recipe.optim.lr * (batch / recipe.train.batch_size) ** 0.5)
        recipe = dataclasses.replace(recipe, optim=optim)
    recipe = dataclasses.replace(recipe, train=dataclasses.replace(recipe.train, keep_best=keep_best))
    resolved = resolve(recipe, chosen, walk.given, budget)
    return Plan(resolved, chosen, candidates, budget, walk.limit, share, walk.kind, tuple(notes), walk.unique)


@dataclass
class _Walk:
    """The walk up the dial at one batch size (module doc): every shape that fits memory measured, smallest
    first, until PATIENCE rungs past the best predicted loss or a shape that fits too few updates."""

    recipe: Recipe
    budget: float
    limit: int
    measure: Measure
    kind: str
    processes: int
    cpu_budget: bool

    def __post_init__(self) -> None:
        self.clock = "budget-cpu" if self.cpu_budget else self.kind
        self.given = given_keys(self.recipe)
        self.fixed = {k: getattr(self.recipe.model, k) if f"model.{k}" in self.given else None
                      for k in FIXED_MODEL_KEYS}
        self.fixed_accum = self.recipe.train.grad_accum if "train.grad_accum" in self.given else None
        self.vocab = self.recipe.model.vocab_size or self.recipe.tokenizer.vocab_size
        self.unique = unique_tokens(self.recipe.data.train)

    def validation(self, c: Candidate) -> Validation:
        """What the run's evaluations cost, in training sequences: the budget.VALIDATIONS + 1 a budget always makes,
        and one per train.eval_every updates besides, each eval.batches batches of `eval_rows` rows."""
        r = self.recipe
        return Validation.of(r.eval.batches * EVAL_COST * eval_rows(r, c), r.train.eval_every)

    def chosen(self, measured: list, batch: int) -> tuple[float, Candidate, tuple[Candidate, ...]]:
        """(the CPU share, the candidate of the lowest predicted loss, every candidate) of a walk at `batch`."""
        share = cpu_share([p for _, p in measured], self.clock)
        candidates = tuple(_scored(c, p, share, self.budget, self.validation(c), self.unique) for c, p in measured)
        return share, min(candidates, key=lambda c: c.loss), candidates

    def can_halve(self, batch: int) -> bool:
        half = batch // 2
        return ("train.batch_size" not in self.given and half >= MIN_BATCH
                and (self.fixed_accum is None or half % self.fixed_accum == 0))

    def run(self, batch: int) -> tuple[list, tuple[str, Candidate, float] | None]:
        """(measured candidates with their paces, why the walk stopped before any shape: memory or time)."""
        measured: list[tuple[Candidate, object]] = []
        refused = None
        best, since_best = math.inf, 0
        for shape in ladder(self.fixed):
            cfg = _config(self.recipe, shape, self.vocab)
            if cfg is None:
                continue
            accum, memory = fitting_accum(self.recipe, cfg, batch, self.limit, self.processes, self.kind,
                                          self.fixed_accum)
            candidate = Candidate(shape, count_parameters(cfg), batch, accum, memory)
            if memory.peak > self.limit:
                refused = refused or ("memory", candidate, 0.0)
                break  # every larger rung needs more
            pace = self.measure(_with(self.recipe, shape, batch, accum), cfg)
            share = cpu_share([p for _, p in measured] + [pace], self.clock)
            scored = _scored(candidate, pace, share, self.budget, self.validation(candidate), self.unique)
            if scored.updates < MIN_UPDATES:
                refused = refused or ("time", candidate, scored.seconds)
                break  # a larger shape is slower still
            measured.append((candidate, pace))
            since_best += 1
            if scored.loss < best:
                best, since_best = scored.loss, 0
            if since_best >= PATIENCE:
                break
        return measured, refused


def eval_rows(recipe: Recipe, c: Candidate) -> int:
    """The rows of each validation batch of a run planned as `c`: eval.batch_size, else the micro-batch the
    recipe's own batch has at the candidate's accumulation. A run validates eval.batches batches of its
    micro-batch, so without this a batch the plan halved from 16 to 4 would validate a quarter of the rows:
    runs of one recipe would be scored on other rows on a slower machine (the quickstart's 40 spread rows of
    stdlib:docs:valid read 0.07 above the whole set; benchmarks/RESULTS.md, "Quickstart")."""
    return recipe.eval.batch_size or recipe.train.batch_size // c.grad_accum


def _scored(c: Candidate, pace, share: float, budget: float, validation: Validation,
            unique: float | None) -> Candidate:
    seconds = update_seconds(pace, share)
    updates = validation.updates(budget / seconds, c.batch_size)
    tokens = updates * pace.tokens
    return dataclasses.replace(c, seconds=seconds, updates=updates, tokens=tokens,
                               loss=predicted_loss(c.params, updates * pace.learned_from, unique))


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
    """The recipe `pretrain` runs: the chosen shape, micro-batch and learning rate for its width, validated on
    the rows of the recipe's own batch (`eval_rows`). The planned updates are a prediction (`Recipe.planned`),
    and train.max_time, not they, ends the run: train.max_steps is STEPS_CAP times them (a machine faster
    during the run than while measured trains on to the budget's end instead of stopping early), or the value
    --set gave."""
    lr = recipe.optim.lr
    if not ("optim.lr" in given and "model.d_model" in given):
        lr = scaled_lr(lr, chosen.shape.d_model)
    planned = _with(recipe, chosen.shape, chosen.batch_size, chosen.grad_accum)
    max_time = recipe.train.max_time if recipe.train.max_time is not None else f"{budget:g}s"
    cap = recipe.train.max_steps if "train.max_steps" in given else max(STEPS_CAP * chosen.updates, 1)
    return dataclasses.replace(planned, optim=dataclasses.replace(recipe.optim, lr=lr), planned=chosen.updates,
                               train=dataclasses.replace(planned.train, max_steps=cap, max_time=max_time),
                               eval=dataclasses.replace(recipe.eval, batch_size=eval_rows(recipe, chosen)))


def _refuse(budget: float, limit: int, refused: tuple[str, Candidate, float] | None, fixed: dict,
            validation: Callable[[Candidate], Validation], batch: int) -> None:
    """One line: why no shape fits, and what the smallest would need (at the smallest batch tried, where the
    recipe's `batch` was halved)."""
    hand = ", ".join(f"model.{k}={v}" for k, v in fixed.items() if v is not None)
    wins = f" ({hand} given by hand: a given key wins over the plan)" if hand else ""
    if refused is None:
        raise ConfigError(f"model: no shape of the dial fits the keys given by hand ({hand or 'none'})")
    why, c, seconds = refused
    if why == "memory":
        raise ConfigError(f"memory: the smallest model the plan may choose{wins}, {c.shape} at micro-batch "
                          f"{c.batch_size // c.grad_accum}, needs {gib(c.memory.peak)} per device, above the limit "
                          f"of {gib(limit)}", params=("memory",))
    need = seconds * validation(c).needs(MIN_UPDATES, c.batch_size)
    halved = f", halved from train.batch_size={batch}" if c.batch_size != batch else ""
    raise ConfigError(f"train.max_time: {fmt_seconds(budget)} trains fewer than {MIN_UPDATES} updates of the "
                      f"smallest model{wins} ({c.shape}, batch {c.batch_size}{halved}, {seconds:.3g} s per update "
                      f"here); it needs at least {fmt_seconds(math.ceil(need))}")


def _real_measure(device: str) -> Measure:
    """trainer.pace.measure_pace on `device`; a seq2seq corpus's row lengths read once for every candidate."""
    import torch  # noqa: PLC0415

    from .pace import measure_pace  # noqa: PLC0415
    from .pair_lengths import pair_lengths  # noqa: PLC0415

    lengths: dict[str, list] = {}

    def measure(recipe: Recipe, cfg: ModelConfig):
        if recipe.objective.name == "seq2seq" and "rows" not in lengths:
            lengths["rows"] = pair_lengths(recipe)
        return measure_pace(recipe, cfg, torch.device(device), lengths=lengths.get("rows"))
    return measure


def plan_for_run(recipe: Recipe, device: str, processes: int, show: Callable[[str], None]) -> Recipe:
    """The recipe a run trains: with model.size: auto, the plan's (shown with `show` first); else as given,
    once its predicted peak memory fits the device (`check_fits`). A plan is made on one process: ranks that
    each measured would choose apart."""
    if recipe.model.size != AUTO_SIZE:
        if recipe.train.init_from or recipe.head_task:  # the model is train.init_from's (or a task's control)
            check_finetune_fits(recipe, device, processes)
        else:
            check_fits(recipe, device, processes)
        return recipe
    if processes > 1:
        raise ConfigError("model.size: auto is planned on one process; run `tfkit plan RECIPE --out FILE` and "
                          "start torchrun with FILE, the plan's keys written out")
    plan = plan_recipe(recipe, device=device)
    show(plan.text())
    return plan.recipe


