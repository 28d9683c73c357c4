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


def test_fp16_overflow_skips_the_update_lowers_the_scale_and_is_not_divergence():
    """A loss scale so large that the fp16 gradients overflow: those updates are skipped as "fp16 overflow"
    (not counted towards max_bad_steps), the scaler halves its scale each time, and training then proceeds."""
    loop, rows, _ = _loop(["train.max_steps=3", "train.batch_size=4", "train.precision=fp16", "train.max_bad_steps=2"])
    loop.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**32)
    state = run_loop(loop)
    skipped = [r for r in rows if r.get("skipped")]
    assert len(skipped) > 2  # more than max_bad_steps, and still no TrainingDiverged
    assert all(r["reason"] == "fp16 overflow" and r["grad_norm"] is None for r in skipped)
    assert all(math.isfinite(r["loss"]) for r in rows)
    assert state.step == 3 and state.bad_steps == 0 and loop.scaler.get_scale() == 2.0 ** (32 - len(skipped))
    assert all(p.dtype == torch.float32 and torch.isfinite(p).all() for p in loop.model.parameters())
    applied = [r for r in rows if not r.get("skipped")]
    assert [r["step"] for r in applied] == [1, 2, 3] and all(math.isfinite(r["grad_norm"]) for r in applied)


def test_fp16_non_finite_loss_is_a_bad_step_and_training_goes_on(monkeypatch):
    """A NaN loss under fp16 is skipped and counted like any bad step, and the next update runs (the loss
    scaler must be told about the skipped step, or its next unscale_ raises)."""
    _poison(monkeypatch, {1})
    loop, rows, _ = _loop(["train.max_steps=4", "train.batch_size=4", "train.precision=fp16"])
    loop.scaler = torch.amp.GradScaler("cpu")
    state = run_loop(loop)
    assert [r["reason"] for r in rows if r.get("skipped")] == ["non-finite loss or gradient norm"]
    assert state.step == 4 and state.bad_steps == 1 and state.bad_in_a_row == 0


def test_fp16_overflows_below_a_loss_scale_of_one_are_divergence(monkeypatch):
    """Gradients that overflow fp16 even unscaled would halve the scale forever (an endless run of skipped
    "fp16 overflow" updates); once the scale is below 1 they count as bad steps and the run stops."""
    original = objectives.compute_loss

    def huge(model, batch, objective):  # finite in fp32, but its gradients overflow the fp16 matmuls
        out = original(model, batch, objective)
        out.loss_sum = out.loss_sum * 1e10
        return out

    monkeypatch.setattr(objectives, "compute_loss", huge)
    loop, rows, _ = _loop(["train.max_steps=3", "train.batch_size=4", "train.precision=fp16", "train.max_bad_steps=2"])
    loop.scaler = torch.amp.GradScaler("cpu", init_scale=4.0)
    with pytest.raises(TrainingDiverged, match="2 updates in a row"):
        run_loop(loop)
    assert all(math.isfinite(r["loss"]) for r in rows) and loop.state.step == 0
    assert [r["reason"] for r in rows] == ["fp16 overflow"] * 3 + ["non-finite loss or gradient norm"] * 2
    assert loop.scaler.get_scale() == 4.0 / 2**5  # halved after every overflow: 4, 2, 1 were tried, then 0.5, 0.25


def test_tokens_per_sec_leaves_out_validation_and_checkpoint_time(monkeypatch):
    """On a fake clock where each update takes 1 s and each validation or save 100 s, the logged rate is
    the tokens of the logged updates over their 1 s each."""
    from tfkit.trainer import loop as loop_module

    clock = [0.0]
    monkeypatch.setattr(loop_module.time, "perf_counter", lambda: clock[0])

    def slow(seconds, result=None):
        def call(*args, **kwargs):
            clock[0] += seconds
            return result
        return call

    loop, rows, _ = _loop(["train.max_steps=4", "train.batch_size=4", "train.log_every=2", "train.eval_every=1",
                           "train.save_every=1"],
                          validate=slow(100.0, {"val_loss": 0.0, "val_ppl": 1.0, "val_accuracy": 0.0}))
    loop.save = slow(100.0)
    batch = loop.dataset.batch
    loop.dataset.batch = lambda *args, **kwargs: (slow(1.0)(), batch(*args, **kwargs))[1]
    run_loop(loop)
    rates = [r["tokens_per_sec"] for r in rows if "tokens_per_sec" in r]
    assert rates == [4 * 16 * 2 / 2.0] * 2  # 2 updates of 4 x 16 tokens per row, 1 s each
