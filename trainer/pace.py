"""How fast this machine trains a candidate shape: real updates, timed (what `tfkit plan` measures).

A plan cannot be read off a spec sheet: a CPU's speed on a tiny model depends on its caches, its vector units
and on who else is running; a GPU's on its kernels at that shape. So each candidate is built as the run would
build it (the recipe's objective, optimizer, precision, fused head) and stepped by the trainer's own
`train_step` on one fixed batch of random tokens (the data pipeline is the run's business, not the shape's;
a seq2seq batch is padded as the run's rows are: trainer/pair_lengths.py): one update to warm up (the
optimizer's state is allocated there), then timed ones.

How many. Two or three timed updates were too few: on a host loaded at 4x its cores their median moved by as
much as the error it was meant to measure, and plans flipped between neighbouring widths from run to run
(benchmarks/RESULTS.md, "Planning a run", pass 2). So updates are timed until both MIN_TIMED of them and
FLOOR seconds of them have run (at most MAX_TIMED), and the pace is their median: a tiny model's update of
5 ms is timed ~100 times, a large one's of 2 s three times, so every candidate costs about FLOOR seconds or
three updates, and a plan of five or six candidates stays seconds, not minutes. The median, not the mean:
an update the scheduler or the allocator stalled is the neighbours', not the shape's.

The clock. On a CPU the updates are timed in CPU time of this process (`time.process_time`), not wall time:
on a machine shared with other jobs the wall time of a few updates swings with their load, and the
comparison between candidates would measure the neighbours. The wall time is recorded beside it, and the
plan turns CPU time into the wall time a run will see by the share of a CPU this process got over *all*
the measured updates (trainer/budget.py `cpu_share`), an average that smooths the neighbours out. On a GPU the
work is off the CPU, so the wall clock (after a synchronize) is the one measured, and its peak memory is read from the
allocator. Tests give the plan a fake `measure` instead (trainer/plan.py), so nothing there depends on how
fast the machine is.
"""

from __future__ import annotations

import dataclasses
import gc
import statistics
import time
from dataclasses import dataclass

import torch
from torch import Tensor

from ..models import build_model
from ..models.config import ModelConfig
from ..models.head_config import HeadConfig
from ..models.heads import SequenceClassifier
from .distributed import DistInfo
from .loop import Loop, StopFlag, replay, run_window
from .objectives import IGNORE, LossModule, count_inputs, freeze_unreached
from .optim import build_optimizer, grad_scaler
from .pair_lengths import pair_lengths, sample_rows
from .parallel import apply_activation_checkpointing
from .recipe import Recipe
from .step import Update

MASK_ID = 4  # mlm: any id stands for [MASK] in random tokens
MASK_PROB = 0.15  # mlm: the share of positions chosen, where the caller does not give the recipe's
MIN_TIMED = 3  # timed updates, at least
FLOOR = 1.0  # seconds of timed updates (CPU time on a CPU), at least
MAX_TIMED = 200  # timed updates, at most (a tiny model's update takes milliseconds)


@dataclass(frozen=True)
class Pace:
    """One candidate's measured update: seconds per update on the measured clock and on the wall."""

    seconds: float  # per update: CPU time of this process (CPU), wall time (GPU); median of the timed updates
    wall: float  # per update, wall time, median
    tokens: int  # input tokens per update as the loop counts them (the real source + target tokens for seq2seq)
    peak_bytes: int | None = None  # GPU: the allocator's peak during the updates; None on a CPU
    # tokens per update that carry a loss: every one of a causal LM's, the chosen ones of an MLM's, a seq2seq pair's
    # target; None = all of `tokens` (what the law's data term counts, trainer/plan.py)
    predicted: int | None = None

    @property
    def learned_from(self) -> int:
        """Tokens per update that carry a loss (`predicted`, or every input token where not measured)."""
        return self.tokens if self.predicted is None else self.predicted


def synthetic_batch(cfg: ModelConfig, objective: str, batch: int, seq_len: int, seed: int = 0,
                    lengths: list[tuple[int, int]] | None = None, mask_prob: float = MASK_PROB) -> dict[str, Tensor]:
    """A batch of random tokens in the objective's layout (ARCHITECTURE.md, "Batches"): what a real batch
    costs, whatever its text. seq2seq rows hold `lengths` (source, target) real tokens, drawn as the run
    draws its rows (trainer/pair_lengths.py), the rest padding; full rows without them."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, cfg.vocab_size, (batch, seq_len + 1), generator=g)  # (B, T+1)
    if objective == "clm":
        return {"input_ids": ids[:, :-1].contiguous(), "labels": ids[:, 1:].contiguous()}
    if objective == "seq2seq":
        rows = sample_rows(lengths, batch, seed) if lengths else [(seq_len, seq_len)] * batch
        position = torch.arange(seq_len)  # (T,)
        src_mask = position < torch.tensor([s for s, _ in rows])[:, None]  # (B, T)
        tgt_mask = position < torch.tensor([t for _, t in rows])[:, None]  # (B, T)
        src, tgt = ids[:, 1:].masked_fill(~src_mask, 0), ids[:, :-1].masked_fill(~tgt_mask, 0)  # (B, T) each
        labels = ids[:, 1:].masked_fill(~tgt_mask, IGNORE)
        return {"src_ids": src, "src_mask": src_mask, "tgt_ids": tgt, "tgt_mask": tgt_mask, "labels": labels}
    x = ids[:, :seq_len]  # (B, T) mlm: a fixed number of masked positions per row
    k = max(1, round(mask_prob * seq_len))
    positions = torch.rand(batch, seq_len, generator=g).argsort(dim=1)[:, :k].sort(dim=1).values  # (B, K)
    masked = torch.zeros(batch, seq_len, dtype=torch.bool).scatter_(1, positions, True)
    return {"input_ids": x.masked_fill(masked, MASK_ID), "token_type_ids": torch.zeros_like(x),
            "labels": x.masked_fill(~masked, IGNORE), "mlm_positions": positions, "mlm_labels": x.gather(1, positions)}


class _FixedBatch:
    """A dataset whose every batch is the same tensors: the update without the data pipeline."""

    def __init__(self, batch: dict[str, Tensor]) -> None:
        self._batch = batch

    def batch(self, i: int, batch_size: int, rank: int = 0, world_size: int = 1) -> dict[str, Tensor]:
        return self._batch


def measure_pace(recipe: Recipe, cfg: ModelConfig, device: torch.device, lengths: list[tuple[int, int]] | None = None,
                 floor: float = FLOOR, min_timed: int = MIN_TIMED, batch: dict[str, Tensor] | None = None,
                 head: HeadConfig | None = None) -> Pace:
    """Seconds per update of `cfg` trained as `recipe` says (its micro-batch, accumulation, objective,
    optimizer and precision; eager: a compiled run is faster than measured), on `device`: the median of at
    least `min_timed` updates and `floor` seconds of them (module doc). `lengths`: a seq2seq run's rows
    (trainer/pair_lengths.py; read from the corpus when not given). A fine-tuning run's micro-batch is given
    whole (`batch`, trainer/finetune_plan.py), and its model is `cfg`'s body under `head`."""
    t = recipe.train
    micro = t.batch_size // t.grad_accum
    if recipe.objective.name == "seq2seq" and lengths is None and batch is None:
        lengths = pair_lengths(recipe)
    train = dataclasses.replace(t, max_steps=MAX_TIMED + 1, log_every=1 << 30, eval_every=1 << 30,
                                save_every=1 << 30)
    recipe = dataclasses.replace(recipe, train=train)
    torch.manual_seed(t.seed)
    model = build_model(cfg) if head is None else SequenceClassifier(build_model(cfg), head)
    model = model.to(device)
    freeze_unreached(model, recipe.objective.name)
    if t.activation_checkpointing:
        apply_activation_checkpointing(model)
    module = LossModule(model, recipe.objective)
    update = Update.of(recipe, model, module, build_optimizer(model, recipe.optim, device),
                       grad_scaler(t.precision, device), DistInfo(device=device))
    if batch is None:
        batch = synthetic_batch(cfg, recipe.objective.name, micro, recipe.data.seq_len, lengths=lengths,
                                mask_prob=recipe.objective.mask_prob)
    data = _FixedBatch(batch)
    loop = Loop(recipe, update, data, log=lambda row: None, save=lambda state: None, validate=lambda step: {})
    stop = StopFlag()  # never entered: no signal handlers
    cuda = device.type == "cuda"
    clock = time.perf_counter if cuda else time.process_time
    seconds, walls = [], []
    try:
        for k in range(MAX_TIMED + 1):
            if len(seconds) >= min_timed and sum(seconds) >= floor:
                break
            if cuda:
                torch.cuda.synchronize(device)
                if k == 1:
                    torch.cuda.reset_peak_memory_stats(device)
            started, wall = clock(), time.perf_counter()
            list(replay(loop, run_window(loop, stop, 1)))  # reads the update's record: it has ended
            if k:  # the first update allocates the optimizer state: a warm-up
                seconds.append(clock() - started)
                walls.append(time.perf_counter() - wall)
        peak = torch.cuda.max_memory_allocated(device) if cuda else None
    finally:
        if loop.loader is not None:
            loop.loader.close()
        del loop, update, module, model
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
    tokens = count_inputs(batch) * t.grad_accum  # every micro-batch of the update is this one
    predicted = int((batch["labels"] != IGNORE).sum()) * t.grad_accum if head is None else None
    return Pace(statistics.median(seconds), statistics.median(walls), tokens, peak, predicted)
