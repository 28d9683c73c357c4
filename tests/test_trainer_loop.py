"""The training loop on a synthetic dataset: accumulation is exact, NaN steps are skipped and counted,
too many in a row stop the run with a TfkitError, and SIGTERM stops cleanly after the current step."""

import math
import os
import signal

import pytest
import torch

from tfkit.errors import TfkitError
from tfkit.trainer import objectives
from tfkit.trainer.loop import TrainingDiverged, run_loop

from helpers import poison_loss, tiny_loop


def test_gradient_accumulation_reproduces_the_full_batch():
    full, rows_full, _ = tiny_loop(["train.max_steps=6", "train.batch_size=8", "train.grad_accum=1"])
    run_loop(full)
    accum, rows_accum, _ = tiny_loop(["train.max_steps=6", "train.batch_size=8", "train.grad_accum=4"])
    run_loop(accum)
    losses = [r["loss"] for r in rows_full], [r["loss"] for r in rows_accum]
    print("full batch:", losses[0], "\naccumulated:", losses[1])
    assert losses[0][-1] < losses[0][0]
    assert losses[0] == pytest.approx(losses[1], abs=1e-5)
    for a, b in zip(full.update.model.parameters(), accum.update.model.parameters()):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    assert accum.state.batches == 4 * full.state.batches == 24


def test_non_finite_steps_are_skipped_counted_and_logged(monkeypatch):
    poison_loss(monkeypatch, {2, 3})
    loop, rows, _ = tiny_loop(["train.max_steps=6", "train.batch_size=4", "train.max_bad_steps=3"])
    before = {n: p.detach().clone() for n, p in loop.update.model.named_parameters()}
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
    assert all(torch.isfinite(p).all() for p in loop.update.model.parameters())
    assert any(not torch.equal(before[n], p) for n, p in loop.update.model.named_parameters())


def test_too_many_bad_steps_in_a_row_stop_the_run(monkeypatch):
    poison_loss(monkeypatch, set(range(3, 100)))
    loop, rows, _ = tiny_loop(["train.max_steps=20", "train.batch_size=4", "train.max_bad_steps=4"])
    with pytest.raises(TrainingDiverged, match=r"4 updates in a row.*train.max_bad_steps=4.*at step 3") as err:
        run_loop(loop, last_checkpoint=lambda: "runs/x/checkpoints/step-2")
    assert isinstance(err.value, TfkitError)
    assert "step-2" in str(err.value)
    assert loop.state.step == 3 and loop.state.bad_steps == 4
    assert all(torch.isfinite(p).all() for p in loop.update.model.parameters())


def test_sigterm_finishes_the_current_step_then_stops(capsys):
    said = []

    def stop_at_step_3(step):
        if step == 3:
            os.kill(os.getpid(), signal.SIGTERM)
            said.append(capsys.readouterr().err)  # what the user saw the moment the signal came
        return {"val_loss": 0.0, "val_ppl": 1.0, "val_accuracy": 0.0}

    loop, rows, _ = tiny_loop(["train.max_steps=10", "train.batch_size=4", "train.eval_every=3"], validate=stop_at_step_3)
    previous = signal.getsignal(signal.SIGTERM)
    state = run_loop(loop)
    assert state.step == 3 and state.interrupted == signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) is previous  # handlers restored
    assert said == ["\nstopping: finishing the update in progress, then saving a checkpoint and exiting (under a load "
                    "this takes seconds); a second Ctrl-C stops at once, and the last checkpoint stays whole\n"]


def test_bf16_autocast_trains_with_fp32_weights():
    fp32, rows32, _ = tiny_loop(["train.max_steps=3", "train.batch_size=4"])
    run_loop(fp32)
    bf16, rows16, _ = tiny_loop(["train.max_steps=3", "train.batch_size=4", "train.precision=bf16"])
    run_loop(bf16)
    assert all(p.dtype == torch.float32 for p in bf16.update.model.parameters())
    l32, l16 = [r["loss"] for r in rows32], [r["loss"] for r in rows16]
    assert l16 == pytest.approx(l32, abs=0.05) and l16 != l32  # close, but the matmuls did run in bf16


def test_fp16_overflow_skips_the_update_lowers_the_scale_and_is_not_divergence():
    """A loss scale so large that the fp16 gradients overflow: those updates are skipped as "fp16 overflow"
    (not counted towards max_bad_steps), the scaler halves its scale each time, and training then proceeds."""
    loop, rows, _ = tiny_loop(["train.max_steps=3", "train.batch_size=4", "train.precision=fp16", "train.max_bad_steps=2"])
    loop.update.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**32)
    state = run_loop(loop)
    skipped = [r for r in rows if r.get("skipped")]
    assert len(skipped) > 2  # more than max_bad_steps, and still no TrainingDiverged
    assert all(r["reason"] == "fp16 overflow" and r["grad_norm"] is None for r in skipped)
    assert all(math.isfinite(r["loss"]) for r in rows)
    assert state.step == 3 and state.bad_steps == 0 and loop.update.scaler.get_scale() == 2.0 ** (32 - len(skipped))
    assert all(p.dtype == torch.float32 and torch.isfinite(p).all() for p in loop.update.model.parameters())
    applied = [r for r in rows if not r.get("skipped")]
    assert [r["step"] for r in applied] == [1, 2, 3] and all(math.isfinite(r["grad_norm"]) for r in applied)


def test_fp16_non_finite_loss_is_a_bad_step_and_training_goes_on(monkeypatch):
    """A NaN loss under fp16 is skipped and counted like any bad step, and the next update runs (the loss
    scaler must be told about the skipped step, or its next unscale_ raises)."""
    poison_loss(monkeypatch, {1})
    loop, rows, _ = tiny_loop(["train.max_steps=4", "train.batch_size=4", "train.precision=fp16"])
    loop.update.scaler = torch.amp.GradScaler("cpu")
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
    loop, rows, _ = tiny_loop(["train.max_steps=3", "train.batch_size=4", "train.precision=fp16", "train.max_bad_steps=2"])
    loop.update.scaler = torch.amp.GradScaler("cpu", init_scale=4.0)
    with pytest.raises(TrainingDiverged, match="2 updates in a row"):
        run_loop(loop)
    assert all(math.isfinite(r["loss"]) for r in rows) and loop.state.step == 0
    assert [r["reason"] for r in rows] == ["fp16 overflow"] * 3 + ["non-finite loss or gradient norm"] * 2
    assert loop.update.scaler.get_scale() == 4.0 / 2**5  # halved after every overflow: 4, 2, 1 were tried, then 0.5, 0.25


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

    loop, rows, _ = tiny_loop(["train.max_steps=4", "train.batch_size=4", "train.log_every=2", "train.eval_every=1",
                           "train.save_every=1"],
                          validate=slow(100.0, {"val_loss": 0.0, "val_ppl": 1.0, "val_accuracy": 0.0}))
    loop.save = slow(100.0)
    batch = loop.dataset.batch
    loop.dataset.batch = lambda *args, **kwargs: (slow(1.0)(), batch(*args, **kwargs))[1]
    run_loop(loop)
    rates = [r["tokens_per_sec"] for r in rows if "tokens_per_sec" in r]
    assert rates == [4 * 16 * 2 / 2.0] * 2  # 2 updates of 4 x 16 tokens per row, 1 s each


def test_a_log_row_carries_the_means_of_the_updates_since_the_last_one():
    """One batch's accuracy jumps about (0.34, then 0.9): each row also holds the loss and accuracy over the
    predicted tokens of every update since the row before, and the printed line shows those."""
    every, each, _ = tiny_loop(["train.max_steps=6", "train.batch_size=4"])  # a row per update
    run_loop(every)
    third, third_rows, _ = tiny_loop(["train.max_steps=6", "train.batch_size=4", "train.log_every=3"])
    run_loop(third)
    assert [r["step"] for r in third_rows] == [3, 6]
    for row, updates in zip(third_rows, (each[0:3], each[3:6])):
        assert row["loss"] == updates[-1]["loss"]  # the update's own, as before
        # every update predicts the same number of tokens here (full rows): the token-weighted mean is the mean
        assert row["loss_mean"] == pytest.approx(sum(u["loss"] for u in updates) / 3, rel=1e-9)
        assert row["accuracy_mean"] == pytest.approx(sum(u["accuracy"] for u in updates) / 3, rel=1e-9)
    assert all(r["loss_mean"] == r["loss"] for r in each)
