"""The split of an update over processes (trainer/batch_plan.py): at any process count every update consumes the
same rows of the dataset, read through the datasets' own rank slicing; a resume keeps the rows a process computes
at once and accumulates more; a count that cannot split the batches is refused, naming the counts that can."""

import numpy as np
import pytest
import torch

from tfkit.errors import ConfigError
from tfkit.tokenization.batches import PureDataset
from tfkit.trainer.batch_plan import plan_batches


class Rows(PureDataset):
    """A dataset whose rows are their example numbers, batched as every tfkit dataset is (PureDataset.batch)."""

    def __init__(self, n: int = 1000, seed: int = 7) -> None:
        self.num_examples, self.seed = n, seed

    def _rows(self, idx: np.ndarray, keys) -> dict[str, torch.Tensor]:
        return {"input_ids": torch.as_tensor(idx).view(-1, 1)}


def update_rows(plan, update: int) -> list[list[int]]:
    """The example numbers each (process, micro-batch) of `update` computes."""
    data = Rows()
    first = update * plan.data_batches
    return [data.batch(*part)["input_ids"].view(-1).tolist() for rank in range(plan.world_size)
            for part in plan.parts(first, rank)]


@pytest.mark.parametrize("batch_size, grad_accum", [(8, 1), (8, 2), (12, 3), (16, 4)])
def test_every_process_count_consumes_the_same_rows_per_update(batch_size, grad_accum):
    one = plan_batches(batch_size, grad_accum, 1)
    for update in range(3):
        reference = sorted(sum(update_rows(one, update), []))
        assert len(reference) == batch_size == len(set(reference))
        for world in [w for w in (2, 3, 4, 6, 8) if (batch_size // grad_accum) % w == 0]:
            chunks = update_rows(plan_batches(batch_size, grad_accum, world), update)
            assert sorted(sum(chunks, [])) == reference, (world, update)


def test_a_fresh_run_splits_each_global_micro_batch_as_before():
    plan = plan_batches(8, 2, 2)
    assert (plan.rows, plan.steps) == (2, 2)
    assert plan.parts(10, 1) == [(10, 4, 1, 2), (11, 4, 1, 2)]  # dataset.batch(i, 4, rank 1, world 2), i = 10, 11


def test_a_resume_on_fewer_processes_keeps_the_rows_and_accumulates_more():
    four = plan_batches(8, 1, 4)
    assert (four.rows, four.steps) == (2, 1)
    two, one = plan_batches(8, 1, 2, kept_rows=four.rows), plan_batches(8, 1, 1, kept_rows=four.rows)
    assert (two.rows, two.steps, one.rows, one.steps) == (2, 2, 2, 4)
    assert "4 micro-batch(es) of 2 sequences per process" in one.describe()
    assert plan_batches(8, 1, 8, kept_rows=2).rows == 1  # more processes: fewer rows each, never more than before


def test_a_count_that_cannot_split_the_batch_names_the_counts_that_can():
    with pytest.raises(ConfigError) as caught:
        plan_batches(12, 2, 4)
    message = str(caught.value)
    assert "cannot be split evenly over 4 processes" in message and "counts that work: 1, 2, 3, 6" in message
    with pytest.raises(ConfigError, match="eval.batch_size=6"):
        plan_batches(8, 1, 4, eval_batch=6)
