"""Which rows of an update's global batch each process computes, and in how many micro-batches.

The recipe fixes what an update consumes: `train.batch_size` sequences, laid out as `train.grad_accum`
global micro-batches of `batch_size / grad_accum` rows each (update n: batches n*A ... n*A+A-1 of the
dataset, each a pure function of its index). That is the invariant: the token ids of every update are
the same whatever the number of processes, so a run resumed on another process count consumes exactly the
tokens an uninterrupted run would have. What follows the process count is the split: each process computes
`rows` sequences at a time, in `steps` micro-batches, with rows x steps x processes = batch_size.

A fresh run splits each global micro-batch over the processes (`rows = batch_size / grad_accum / processes`,
`steps = grad_accum`). A run resumed on another count keeps the rows each process computed at once (its
memory per process) as far as the new count allows, and the accumulation absorbs the change: 8 sequences
per update on 4 processes of 2 rows each become 2 steps of 2 rows on 2 processes, 4 steps on one.
Chunk k of rank r is the rows [(k*W + r)*rows, +rows) of the update, in the order of its global micro-batches.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError


@dataclass(frozen=True)
class BatchPlan:
    batch_size: int  # sequences per update (train.batch_size): all processes, all micro-batches
    data_batches: int  # global micro-batches an update consumes (train.grad_accum): its token ids
    world_size: int  # processes
    rows: int  # sequences a process computes at once (its micro-batch)

    @property
    def data_rows(self) -> int:
        """Rows of one global micro-batch of the dataset."""
        return self.batch_size // self.data_batches

    @property
    def steps(self) -> int:
        """Micro-batches each process accumulates per update."""
        return self.batch_size // (self.rows * self.world_size)

    def parts(self, first: int, rank: int) -> list[tuple[int, int, int, int]]:
        """`dataset.batch` arguments (index, batch size, part, parts) of this rank's micro-batches of the update
        whose first global micro-batch is `first`: each is `rows` consecutive rows of one global micro-batch."""
        out = []
        for k in range(self.steps):
            batch, offset = divmod((k * self.world_size + rank) * self.rows, self.data_rows)
            out.append((first + batch, self.data_rows, offset // self.rows, self.data_rows // self.rows))
        return out

    def describe(self) -> str:
        per = "process" if self.world_size == 1 else f"process x {self.world_size} processes"
        return f"{self.steps} micro-batch(es) of {self.rows} sequences per {per}"


def plan_batches(batch_size: int, grad_accum: int, world_size: int, eval_batch: int | None = None,
                 kept_rows: int = 0) -> BatchPlan:
    """The split of a recipe's updates over `world_size` processes; `kept_rows` (from a checkpoint, 0 if none)
    the rows each process computed at once before. A count that cannot split the global micro-batches (nor
    the validation batches, which every process computes its share of) is one ConfigError line listing the
    counts that can."""
    data_rows = batch_size // grad_accum
    works = [n for n in range(1, data_rows + 1) if data_rows % n == 0 and (eval_batch is None or eval_batch % n == 0)]
    if world_size not in works:
        evals = "" if eval_batch is None else f" and eval.batch_size={eval_batch}"
        raise ConfigError(f"train.batch_size={batch_size} in train.grad_accum={grad_accum} micro-batches of {data_rows} "
                          f"sequences{evals} cannot be split evenly over {world_size} processes; process counts that "
                          f"work: {', '.join(map(str, works))} (another batch_size or grad_accum changes the tokens "
                          "each update consumes)")
    widest = data_rows // world_size
    rows = widest if kept_rows < 1 else max(d for d in range(1, widest + 1) if widest % d == 0 and d <= kept_rows)
    return BatchPlan(batch_size, grad_accum, world_size, rows)
