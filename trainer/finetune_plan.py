"""`tfkit plan` of a fine-tuning recipe: the micro-batch and accumulation that fit, and what the budget trains.

A fine-tuning run's model is its checkpoint's (train.init_from: a tfkit run or checkpoint, or an imported
HuggingFace folder), so nothing of the shape is planned (`model.size: auto` with init_from stays refused):
the plan reads the checkpoint's config.json (no weights), keeps train.batch_size, and takes the fewest
micro-batches of it whose update fits the device's memory (trainer/fits.py; a train.grad_accum given by
--set is kept). It then times that micro-batch's update on this machine (trainer/pace.py) on rows laid out
as the run lays out its labelled examples: each example's length estimated from its text's UTF-8 bytes
(trainer/pair_lengths.py's BYTES_PER_TOKEN) plus the family's special tokens, cut to data.seq_len, padded or
packed as task.packing says (tokenization/task_batches.py). From the pace it predicts the updates and
epochs the budget trains, with every validation example scored at the budget's VALIDATIONS + 1 points and
every train.eval_every updates (forward only, EVAL_COST of a training row: trainer/budget.py's Validation).
The recipe's own length (train.max_steps or train.epochs) is kept: the plan says whether it fits the budget.
Tests pass a fake `measure`, so nothing there depends on the machine.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError, TfkitError
from ..models.config import ModelConfig
from .budget import EVAL_COST, Validation, cpu_share, fmt_seconds, planned_budget, update_seconds
from .fits import default_memory_limit, fitting_accum
from .memory import MemoryEstimate, gib
from .pair_lengths import BYTES_PER_TOKEN
from .recipe import Recipe
from .resources import count_parameters

SPECIALS = 3  # tokens a layout adds around a text or a pair ([CLS] .. [SEP] .. [SEP], or a GPT's ends)
SAMPLE_EXAMPLES = 2000  # examples whose lengths the synthetic rows are drawn from

# (recipe, cfg, micro-batch, head) -> trainer.pace.Pace
FinetuneMeasure = Callable[[Recipe, ModelConfig, dict, object], object]


@dataclass(frozen=True)
class FinetunePlan:
    """A fine-tuning recipe's micro-batch and accumulation, and what they predict for the budget."""

    recipe: Recipe  # as given, with the fitting train.grad_accum and the budget as train.max_time
    source: Path | None  # the checkpoint the model is read from; None: random weights (the control)
    params: int
    memory: MemoryEstimate
    seconds: float  # wall seconds per update the run will see
    tokens: int  # per update, as the loop counts them
    updates: int  # in the budget
    examples: int  # training examples
    budget: float
    memory_limit: int
    device: str

    @property
    def epochs(self) -> float:
        return self.updates * self.recipe.train.batch_size / max(self.examples, 1)

    def sets(self) -> list[str]:
        t = self.recipe.train
        return [f"train.grad_accum={t.grad_accum}", f"train.max_time={t.max_time}"]

    def text(self) -> str:
        r, t = self.recipe, self.recipe.train
        where = f"from {self.source}" if self.source else "from random weights (train.init_from: null)"
        own = (f"train.epochs={t.epochs:g}" if t.epochs else f"train.max_steps={t.max_steps:,}")
        needed = (math.ceil(t.epochs * self.examples / t.batch_size) if t.epochs else t.max_steps)
        ends = (f"the recipe's {own} ({needed:,} updates) ends first" if needed <= self.updates else
                f"the budget ends it after {self.updates:,} of the recipe's {needed:,} updates ({own})")
        return "\n".join([
            f"plan for {r.name} (fine-tuning): {fmt_seconds(self.budget)} of training on {self.device}, memory limit "
            f"{gib(self.memory_limit)} per device",
            f"  model      {r.model.arch} d_model {r.model.d_model}, {r.model.n_layers} "
            f"layer{'s' * (r.model.n_layers != 1)} {where}: "
            f"{self.params / 1e6:.2f}M parameters ({'the checkpoint' if self.source else 'the recipe'}'s: not planned)",
            f"  batch      {t.batch_size} examples of up to {r.data.seq_len} tokens, micro-batch "
            f"{t.batch_size // t.grad_accum} x {t.grad_accum} accumulated (the fewest micro-batches that fit)",
            f"  memory     {self.memory.line()} predicted peak per device",
            f"  speed      {self.tokens / self.seconds:,.0f} tokens/s predicted ({self.seconds:.3g} s per update)",
            f"  updates    {self.updates:,} in the budget: {self.epochs:.2f} epochs of {self.examples:,} training "
            f"examples; {ends}"])


def plan_finetune(recipe: Recipe, budget: float | None = None, memory_limit: int | None = None,
                  measure: FinetuneMeasure | None = None, device: str = "cpu") -> FinetunePlan:
    """The plan of fine-tuning recipe `recipe` in `budget` seconds (else its train.max_time) under
    `memory_limit` bytes per device (else this machine's), timed by `measure` (else trainer.pace.measure_pace)."""
    budget = planned_budget(recipe, budget)
    recipe = dataclasses.replace(recipe, train=dataclasses.replace(
        recipe.train, max_time=recipe.train.max_time or f"{budget:g}s"))
    kind = device.split(":")[0]
    limit = default_memory_limit(device) if memory_limit is None else memory_limit
    source, recipe, cfg = finetune_model(recipe)
    t = recipe.train
    fixed = t.grad_accum if "train.grad_accum" in recipe.overrides else None
    accum, memory = fitting_accum(recipe, cfg, t.batch_size, limit, 1, kind, fixed)
    if memory.peak > limit:
        raise ConfigError(f"memory: the model of {source or 'the recipe'} ({count_parameters(cfg) / 1e6:.2f}M "
                          f"parameters) needs {gib(memory.peak)} per device at micro-batch "
                          f"{t.batch_size // accum}, above the limit of {gib(limit)}", params=("memory",))
    recipe = dataclasses.replace(recipe, train=dataclasses.replace(t, grad_accum=accum))
    from ..tokenization.labelled import Columns, load_labelled  # noqa: PLC0415 - reads the data: only when planned

    d, k = recipe.data, recipe.task
    labelled = load_labelled(d.train, d.valid, columns=Columns(k.text, k.text_pair, k.label), task=recipe.head_task,
                             header=k.header, valid_fraction=d.valid_fraction, seed=t.seed)
    micro = t.batch_size // accum
    batch, head = task_batch(recipe, cfg, labelled, micro)
    pace = (measure or _real_measure(device))(recipe, cfg, batch, head)
    seconds = update_seconds(pace, cpu_share([pace], kind))
    validation = Validation.of(len(labelled.valid) * EVAL_COST, t.eval_every)  # each scores every valid example
    updates = max(0, validation.updates(budget / seconds, t.batch_size))
    return FinetunePlan(recipe, source, count_parameters(cfg), memory, seconds, pace.tokens, updates,
                        len(labelled.train), budget, limit, kind)


def finetune_model(recipe: Recipe) -> tuple[Path | None, Recipe, ModelConfig]:
    """(the checkpoint, the recipe with its model, the model config) of a fine-tuning run, from the
    checkpoint's config.json and its weights' header (trainer/source.py, as the run reads them; a config.json
    that declares more blocks than the weights hold is refused, never estimated); the recipe's own model
    without train.init_from."""
    from ..checkpoints.folders import resolve_checkpoint  # noqa: PLC0415
    from ..checkpoints.record import CheckpointRecord  # noqa: PLC0415
    from ..checkpoints.weights import check_depth  # noqa: PLC0415
    from .source import source_model  # noqa: PLC0415

    if not recipe.train.init_from:
        return None, recipe, recipe.model.config(recipe.model.vocab_size or recipe.tokenizer.vocab_size)
    source = resolve_checkpoint(recipe.train.init_from)
    check_depth(CheckpointRecord.read(source).model, source)  # as the run does: config.json against the weights
    recipe = source_model(recipe, source)
    return source, recipe, recipe.model.config()


def example_lengths(labelled, seq_len: int) -> list[int]:
    """Tokens of each sampled training example as the run lays it out: its text (and pair) from their UTF-8
    bytes, the layout's specials, cut to the row."""
    train = labelled.train
    pairs = train.pairs or [""] * len(train.texts)
    out = []
    for text, pair in zip(train.texts[:SAMPLE_EXAMPLES], pairs[:SAMPLE_EXAMPLES]):
        size = len(text.encode("utf-8", "replace")) + len(pair.encode("utf-8", "replace"))
        out.append(min(seq_len, max(1, round(size / BYTES_PER_TOKEN)) + SPECIALS))
    return out


def task_batch(recipe: Recipe, cfg: ModelConfig, labelled, micro: int):
    """(a micro-batch of random tokens laid out as the run's, its head): `micro` examples of lengths drawn
    from the data, padded or packed (tokenization/task_batches.py)."""
    from ..models.head_config import HeadConfig  # noqa: PLC0415
    from ..tokenization.task_batches import PACKABLE, Encoded, TaskDataset  # noqa: PLC0415

    lengths = random.Random(recipe.train.seed).choices(example_lengths(labelled, recipe.data.seq_len), k=micro)
    rng = random.Random(0)
    rows = [[rng.randrange(5, cfg.vocab_size) for _ in range(n)] for n in lengths]
    regression = recipe.head_task == "regression"
    targets = [0.0 if regression else i % max(2, len(labelled.labels or ())) for i in range(micro)]
    packed = recipe.task.packing and cfg.arch in PACKABLE
    data = TaskDataset(Encoded(rows, None, list(range(micro))), targets, recipe.data.seq_len, 0, recipe.train.seed,
                       regression, packed=packed)
    head = HeadConfig(task=recipe.head_task, labels=tuple(labelled.labels or ()), pooling=recipe.task.pooling,
                      dropout=recipe.task.dropout)
    return data.batch(0, micro), head


def _real_measure(device: str) -> FinetuneMeasure:
    import torch  # noqa: PLC0415

    from .pace import measure_pace  # noqa: PLC0415

    return lambda recipe, cfg, batch, head: measure_pace(recipe, cfg, torch.device(device), batch=batch, head=head)


def check_finetune_fits(recipe: Recipe, device: str, processes: int = 1) -> None:
    """A run from a checkpoint (fine-tuning, or pretraining on from train.init_from) whose hand-given batch does
    not fit is refused before training (trainer/fits.py's `check_fits`, on the checkpoint's model); a checkpoint
    that cannot be read, or a recipe it contradicts, is left to the run to report in its own words."""
    from .fits import check_fits  # noqa: PLC0415

    try:
        _, resolved, cfg = finetune_model(recipe)
    except TfkitError:
        return
    check_fits(resolved, device, processes, cfg=cfg)
