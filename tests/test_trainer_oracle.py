"""An oracle for the training loop outside tfkit: the same tiny GPT trained by a plain PyTorch loop written
here (AdamW with decay on matrices only, warmup + cosine, gradient clipping, gradient accumulation, fp32,
a non-finite update skipped) and by `tfkit pretrain` on the same batches gives the same loss curve and the
same final weights (torchtitan checks its trainer by loss curves the same way)."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from typer.testing import CliRunner

from tfkit.checkpoints.run_record import read_metrics
from tfkit.checkpoints.weights import load_model
from tfkit.cli.main import app
from tfkit.models import ModelConfig, build_model
from tfkit.trainer import data as trainer_data
from tfkit.trainer import run as trainer_run

SEED, STEPS, BATCH, ACCUM, SEQ = 1337, 24, 8, 2, 16
LR, MIN_LR, WARMUP, WEIGHT_DECAY, BETAS, EPS, CLIP = 3e-3, 3e-4, 4, 0.1, (0.9, 0.95), 1e-8, 0.5
VOCAB = 400  # tokenizer.vocab_size: the run's tokenizer is trained on the English fixture, the batches are ours
IDS = 32  # the batches use ids 0..IDS-1, a vocabulary a 24-step model learns to narrow down to
POISON = VOCAB - 1  # a batch holding this id is made non-finite by the hook below (on both sides)
POISONED_MICRO_BATCH = 19  # the second micro-batch of the 10th update attempt


class Batches:
    """Micro-batch i is a pure function of i (rows with learnable structure: every odd token repeats the
    one before), as tfkit's datasets are; validation batches come from rows training never sees."""

    def batch(self, i: int, batch_size: int, rank: int = 0, world_size: int = 1) -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(1000 + i)
        rows = torch.randint(0, IDS, (batch_size, SEQ + 1), generator=g)  # (B, T+1)
        rows[:, 1::2] = rows[:, 0::2][:, : rows[:, 1::2].shape[1]]
        if i == POISONED_MICRO_BATCH:
            rows[0, 0] = POISON
        return {"input_ids": rows[:, :-1], "labels": rows[:, 1:]}

    def eval_batches(self, n: int, batch_size: int, rank: int = 0, world_size: int = 1):
        for k in range(n):
            yield self.batch(1_000_000 + k, batch_size, rank, world_size)


def poison_hook(model: nn.Module) -> nn.Module:
    """Token embeddings become NaN for a batch that holds POISON: that update's loss and gradients are
    non-finite (decided on the device, read by nobody)."""
    model.embed.tok.register_forward_hook(
        lambda module, args, out: out * torch.where((args[0] == POISON).any(), math.nan, 1.0))
    return model


def lr_at(step: int) -> float:
    """Linear warmup to LR over WARMUP steps (reaching it at step WARMUP - 1), then half a cosine to MIN_LR."""
    if step < WARMUP:
        return LR * (step + 1) / WARMUP
    progress = (step - WARMUP) / (STEPS - WARMUP)
    return MIN_LR + 0.5 * (LR - MIN_LR) * (1 + math.cos(math.pi * progress))


def plain_pytorch(cfg: ModelConfig) -> tuple[list[float], nn.Module]:
    """The loop as a PyTorch user writes it; returns the loss of every update attempt and the model."""
    torch.manual_seed(SEED)
    model = poison_hook(build_model(cfg))  # tfkit's initial weights: the same seed, the same constructor
    embeddings = {id(p) for m in model.modules() if isinstance(m, nn.Embedding) for p in m.parameters()}
    params = list(model.parameters())  # shared (tied) tensors once
    decay = [p for p in params if p.ndim >= 2 and id(p) not in embeddings]
    no_decay = [p for p in params if p.ndim < 2 or id(p) in embeddings]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": WEIGHT_DECAY},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=LR, betas=BETAS, eps=EPS)
    data, losses, step, consumed = Batches(), [], 0, 0
    while step < STEPS:
        micro = [data.batch(consumed + j, BATCH // ACCUM) for j in range(ACCUM)]
        consumed += ACCUM  # a skipped update's batches are not retried
        tokens = sum(b["labels"].numel() for b in micro)
        total = 0.0
        for b in micro:
            logits = model(b["input_ids"])  # (B, T, V)
            loss_sum = F.cross_entropy(logits.flatten(0, 1), b["labels"].flatten(), reduction="sum")
            (loss_sum / tokens).backward()
            total += loss_sum.item()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP).item()
        if math.isfinite(total) and math.isfinite(norm):  # else skipped: no update, the schedule stays
            for group in optimizer.param_groups:
                group["lr"] = lr_at(step)
            optimizer.step()
            step += 1
        optimizer.zero_grad(set_to_none=True)
        losses.append(total / tokens)
    return losses, model


def test_tfkit_pretrain_matches_a_plain_pytorch_loop(english_file, tmp_path, monkeypatch):
    monkeypatch.setattr(trainer_data, "build_datasets", lambda *args: (Batches(), Batches()))
    built = trainer_run.build_model
    monkeypatch.setattr(trainer_run, "build_model", lambda cfg: poison_hook(built(cfg)))
    run = tmp_path / "run"
    settings = [
        f"data.train={english_file}", f"data.seq_len={SEQ}", f"tokenizer.vocab_size={VOCAB}",
        "tokenizer.max_train_mb=0.1", "model.d_model=32", "model.n_layers=2", "model.n_heads=4",
        "model.max_seq_len=32", "model.dropout=0.0", f"optim.lr={LR}", f"optim.weight_decay={WEIGHT_DECAY}",
        f"optim.beta1={BETAS[0]}", f"optim.beta2={BETAS[1]}", f"optim.eps={EPS}", f"optim.grad_clip={CLIP}",
        "schedule.name=cosine", f"schedule.warmup_steps={WARMUP}", f"schedule.min_lr={MIN_LR}",
        f"train.max_steps={STEPS}", f"train.batch_size={BATCH}", f"train.grad_accum={ACCUM}", f"train.seed={SEED}",
        "train.log_every=1", "train.eval_every=1000", "train.save_every=1000", "train.precision=fp32",
        "train.device=cpu", "train.threads=1", "eval.batches=1", "eval.sample_prompt=null", "log.progress=false",
        "log.plot=false", "log.tensorboard=false"]
    done = CliRunner().invoke(app, ["pretrain", "gpt-tiny", "--run-dir", str(run),
                                    *[a for s in settings for a in ("--set", s)]])
    assert done.exit_code == 0, done.output
    rows = [r for r in read_metrics(run / "metrics.jsonl") if "loss" in r]
    tfkit_losses = [math.nan if r["loss"] is None else r["loss"] for r in rows]
    assert [r["step"] for r in rows if r.get("skipped")] == [10]  # the poisoned attempt tried to become step 10

    trained, cfg = load_model(run)
    losses, model = plain_pytorch(cfg)
    print("plain PyTorch:", losses, "\ntfkit:", tfkit_losses)
    assert len(losses) == len(tfkit_losses) == STEPS + 1 and math.isnan(losses[9])
    assert losses[-1] < losses[0] - 1.0  # it learned: the comparison is not between two idle runs
    assert tfkit_losses == pytest.approx(losses, rel=1e-5, nan_ok=True)
    expected = dict(model.named_parameters())
    for name, param in trained.named_parameters():
        torch.testing.assert_close(param, expected[name], rtol=1e-4, atol=1e-5, msg=name)
