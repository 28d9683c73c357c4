"""The training loop on a synthetic dataset: accumulation is exact, NaN steps are skipped and counted,
too many in a row stop the run with a TfkitError, and SIGTERM stops cleanly after the current step."""

import math
import os
import signal

import pytest
import torch

from tfkit.errors import TfkitError
from tfkit.models import build_model
from tfkit.models.config import ModelConfig
from tfkit.trainer import objectives
from tfkit.trainer.distributed import DistInfo
from tfkit.trainer.loop import Loop, TrainingDiverged, run_loop
from tfkit.trainer.objectives import LossModule
from tfkit.trainer.optim import build_optimizer, grad_scaler
from tfkit.trainer.recipe import load_recipe



class RowDataset:
    """Row r of the global stream is a pure function of (seed, r); batch i of size B holds rows i*B..i*B+B-1,
    so one batch of 8 equals two consecutive batches of 4 (what makes accumulation comparable)."""

    def __init__(self, seed: int = 0, seq_len: int = 16, vocab: int = 48) -> None:
        self.seed, self.seq_len, self.vocab = seed, seq_len, vocab

    def row(self, r: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + r)
        x = torch.randint(0, self.vocab, (self.seq_len + 1,), generator=g)
        x[1::2] = x[0::2][: len(x[1::2])]  # learnable: every odd token repeats the previous one
        return x

    def batch(self, i, batch_size, rank=0, world_size=1):
        per = batch_size // world_size
        rows = torch.stack([self.row(i * batch_size + rank * per + k) for k in range(per)])  # (B/world, T+1)
        return {"input_ids": rows[:, :-1], "labels": rows[:, 1:]}


def _loop(overrides, rows=None, validate=lambda step: {"val_loss": 0.0, "val_ppl": 1.0, "val_accuracy": 0.0}):
    recipe = load_recipe("gpt-tiny", ["schedule.warmup_steps=2", "train.log_every=1", "log.progress=false",
                                      "train.eval_every=1000", "train.save_every=1000", *overrides])
    torch.manual_seed(0)
    model = build_model(ModelConfig(arch="gpt", vocab_size=48, d_model=32, n_layers=2, n_heads=4, max_seq_len=32))
    info = DistInfo()
    rows = [] if rows is None else rows
    saves = []
    loop = Loop(recipe, model, LossModule(model, recipe.objective), build_optimizer(model, recipe.optim, info.device),
                grad_scaler("fp32", info.device), RowDataset(), info, rows.append, saves.append, validate)
    return loop, rows, saves


def test_gradient_accumulation_reproduces_the_full_batch():
    full, rows_full, _ = _loop(["train.max_steps=6", "train.batch_size=8", "train.grad_accum=1"])
    run_loop(full)
    accum, rows_accum, _ = _loop(["train.max_steps=6", "train.batch_size=8", "train.grad_accum=4"])
    run_loop(accum)
    losses = [r["loss"] for r in rows_full], [r["loss"] for r in rows_accum]
    print("full batch:", losses[0], "\naccumulated:", losses[1])
    assert losses[0][-1] < losses[0][0]
    assert losses[0] == pytest.approx(losses[1], abs=1e-5)
    for a, b in zip(full.model.parameters(), accum.model.parameters()):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    assert accum.state.batches == 4 * full.state.batches == 24


def _poison(monkeypatch, bad_calls):
    """Make the loss NaN on the given (0-based) calls of compute_loss: a hooked loss."""
    original, calls = objectives.compute_loss, [0]

    def hooked(model, batch, objective):
        out = original(model, batch, objective)
        calls[0] += 1
        if calls[0] - 1 in bad_calls:
            out.loss_sum = out.loss_sum * float("nan")
        return out

    monkeypatch.setattr(objectives, "compute_loss", hooked)


def test_non_finite_steps_are_skipped_counted_and_logged(monkeypatch):
    _poison(monkeypatch, {2, 3})
    loop, rows, _ = _loop(["train.max_steps=6", "train.batch_size=4", "train.max_bad_steps=3"])
    before = {n: p.detach().clone() for n, p in loop.model.named_parameters()}
    state = run_loop(loop)
    skipped = [r for r in rows if r.get("skipped")]
    assert [r["step"] for r in skipped] == [3, 3]  # both attempts tried to become update 3
    assert all(r["loss"] is None for r in skipped)
    assert state.step == 6 and state.bad_steps == 2 and state.bad_in_a_row == 0
    assert state.batches == 8  # the poisoned batches are consumed, not retried
    good = [r for r in rows if not r.get("skipped")]
    assert [r["step"] for r in good] == [1, 2, 3, 4, 5, 6]
    assert [r["lr"] for r in good][2] == loop.recipe.optim.lr  # update 3 still gets lr_at(2), the peak
    assert all(math.isfinite(r["loss"]) for r in good)
    assert all(torch.isfinite(p).all() for p in loop.model.parameters())
    assert any(not torch.equal(before[n], p) for n, p in loop.model.named_parameters())


def test_too_many_bad_steps_in_a_row_stop_the_run(monkeypatch):
    _poison(monkeypatch, set(range(3, 100)))
    loop, rows, _ = _loop(["train.max_steps=20", "train.batch_size=4", "train.max_bad_steps=4"])
    with pytest.raises(TrainingDiverged, match=r"4 updates in a row.*train.max_bad_steps=4.*at step 3") as err:
        run_loop(loop, last_checkpoint=lambda: "runs/x/checkpoints/step-2")
    assert isinstance(err.value, TfkitError)
    assert "step-2" in str(err.value)
    assert loop.state.step == 3 and loop.state.bad_steps == 4
    assert all(torch.isfinite(p).all() for p in loop.model.parameters())


def test_sigterm_finishes_the_current_step_then_stops():
    def stop_at_step_3(step):
        if step == 3:
            os.kill(os.getpid(), signal.SIGTERM)
        return {"val_loss": 0.0, "val_ppl": 1.0, "val_accuracy": 0.0}

    loop, rows, _ = _loop(["train.max_steps=10", "train.batch_size=4", "train.eval_every=3"], validate=stop_at_step_3)
    previous = signal.getsignal(signal.SIGTERM)
    state = run_loop(loop)
    assert state.step == 3 and state.interrupted == signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) is previous  # handlers restored


def test_bf16_autocast_trains_with_fp32_weights():
    fp32, rows32, _ = _loop(["train.max_steps=3", "train.batch_size=4"])
    run_loop(fp32)
    bf16, rows16, _ = _loop(["train.max_steps=3", "train.batch_size=4", "train.precision=bf16"])
    run_loop(bf16)
    assert all(p.dtype == torch.float32 for p in bf16.model.parameters())
    l32, l16 = [r["loss"] for r in rows32], [r["loss"] for r in rows16]
    assert l16 == pytest.approx(l32, abs=0.05) and l16 != l32  # close, but the matmuls did run in bf16
