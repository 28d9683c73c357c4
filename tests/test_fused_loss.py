"""The fused, chunked linear + cross-entropy equals `F.cross_entropy(h @ W.T + b)`: loss sum, correct count
and the gradients wrt the hidden rows, the weight and the bias, in every corner the objectives reach."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tfkit.models.config import ModelConfig
from tfkit.models import build_model
from tfkit.trainer.fused_loss import linear_cross_entropy
from tfkit.trainer.objectives import IGNORE, clm_loss, seq2seq_loss

ATOL = 1e-5


def _inputs(N: int, D: int, V: int, ignored: float, bias: bool, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(N, D, generator=g, dtype=torch.float64).float().requires_grad_()
    w = (torch.randn(V, D, generator=g) * 0.5).requires_grad_()
    b = (torch.randn(V, generator=g) * 0.5).requires_grad_() if bias else None
    y = torch.randint(0, V, (N,), generator=g)
    y[torch.rand(N, generator=g) < ignored] = IGNORE
    return h, w, b, y


def _reference(h, w, b, y, ls):
    logits = F.linear(h, w, b)  # (N, V)
    loss = F.cross_entropy(logits, y, reduction="sum", ignore_index=IGNORE, label_smoothing=ls)
    correct = ((logits.argmax(-1) == y) & (y != IGNORE)).sum()
    return loss, correct


def _grads(loss, tensors):
    return torch.autograd.grad(loss, [t for t in tensors if t is not None])


@pytest.mark.parametrize("N,chunk", [(37, 8), (64, 64), (50, 1000), (5, 1)])
@pytest.mark.parametrize("ls", [0.0, 0.1])
@pytest.mark.parametrize("bias", [False, True])
def test_matches_cross_entropy(N, chunk, ls, bias):
    h, w, b, y = _inputs(N, 16, 97, ignored=0.3, bias=bias)
    ref_loss, ref_correct = _reference(h, w, b, y, ls)
    loss, correct = linear_cross_entropy(h, w, b, y, label_smoothing=ls, chunk_rows=chunk)
    assert correct.dtype == torch.int64 and int(correct) == int(ref_correct)
    torch.testing.assert_close(loss, ref_loss, atol=ATOL, rtol=1e-6)
    # A scale on the loss (1 / token count, a GradScaler) must reach every gradient.
    for got, want in zip(_grads(loss * 0.37, (h, w, b)), _grads(ref_loss * 0.37, (h, w, b))):
        torch.testing.assert_close(got, want, atol=ATOL, rtol=1e-5)


def test_correct_count_is_not_trivial():
    """Logits made to favour the labels on some rows: the count must be exactly those rows."""
    h, w, b, y = _inputs(40, 16, 33, ignored=0.0, bias=False)
    w_eye = torch.zeros(33, 16)
    w_eye[:16] = torch.eye(16) * 50.0
    y = h.detach().argmax(-1)  # rows whose largest feature is the label win by a wide margin
    y[::3] = (y[::3] + 1) % 33  # every third row now predicted wrong
    y[1] = IGNORE  # a right prediction that must not be counted
    _, correct = linear_cross_entropy(h, w_eye, None, y, chunk_rows=7)
    assert int(correct) == 40 - len(range(0, 40, 3)) - 1


def test_all_rows_ignored():
    h, w, b, _ = _inputs(12, 8, 20, ignored=0.0, bias=True)
    y = torch.full((12,), IGNORE)
    loss, correct = linear_cross_entropy(h, w, b, y, label_smoothing=0.1, chunk_rows=5)
    assert float(loss.detach()) == 0.0 and int(correct) == 0
    for grad in _grads(loss, (h, w, b)):
        assert torch.count_nonzero(grad) == 0


def test_without_grad_gives_the_loss():
    h, w, b, y = _inputs(30, 8, 20, ignored=0.2, bias=True)
    with torch.no_grad():
        loss, correct = linear_cross_entropy(h, w, b, y, chunk_rows=7)
        ref_loss, ref_correct = _reference(h, w, b, y, 0.0)
    assert not loss.requires_grad
    torch.testing.assert_close(loss, ref_loss, atol=ATOL, rtol=1e-6)
    assert int(correct) == int(ref_correct)


def test_bf16_autocast_close_to_unfused():
    """Under autocast the matmuls run in bf16 and the reductions in fp32, as F.linear + F.cross_entropy do."""
    h, w, b, y = _inputs(64, 32, 50, ignored=0.1, bias=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, _ = linear_cross_entropy(h, w, b, y, chunk_rows=24)
        ref_loss, _ = _reference(h, w, b, y, 0.0)
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, ref_loss.float(), rtol=2e-3, atol=0.0)
    grads, ref_grads = _grads(loss, (h, w, b)), _grads(ref_loss, (h, w, b))
    for got, want in zip(grads, ref_grads):
        assert got.dtype == torch.float32
        torch.testing.assert_close(got, want.float(), rtol=0.05, atol=2e-2)


def _tiny(arch: str) -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = ModelConfig(arch=arch, vocab_size=61, d_model=32, n_layers=2, n_heads=4, max_seq_len=32,
                      dropout=0.0, tie_embeddings=True)
    return build_model(cfg)


@pytest.mark.parametrize("ls", [0.0, 0.1])
@pytest.mark.parametrize("arch", ["gpt", "transformer"])
def test_objective_fused_equals_unfused(arch, ls):
    model = _tiny(arch)
    g = torch.Generator().manual_seed(1)
    labels = torch.randint(0, 61, (3, 11), generator=g)
    labels[0, :4] = IGNORE
    if arch == "gpt":
        batch = {"input_ids": torch.randint(0, 61, (3, 11), generator=g), "labels": labels}
        loss_fn = clm_loss
    else:
        batch = {"src_ids": torch.randint(0, 61, (3, 9), generator=g),
                 "tgt_ids": torch.randint(0, 61, (3, 11), generator=g), "labels": labels}
        loss_fn = seq2seq_loss
    results = []
    for fused in (False, True):
        model.zero_grad()
        out = loss_fn(model, batch, label_smoothing=ls, fused=fused)
        (out.loss_sum / 29.0).backward()
        results.append((out, {n: p.grad.clone() for n, p in model.named_parameters()}))
    (ref, ref_grads), (got, got_grads) = results
    torch.testing.assert_close(got.loss_sum, ref.loss_sum, atol=ATOL, rtol=1e-6)
    assert int(got.correct) == int(ref.correct) and int(got.count) == int(ref.count) == 29
    assert ref_grads.keys() == got_grads.keys()
    for name in ref_grads:
        torch.testing.assert_close(got_grads[name], ref_grads[name], atol=ATOL, rtol=1e-5, msg=name)


def test_model_forward_still_returns_logits():
    model = _tiny("gpt")
    ids = torch.randint(0, 61, (2, 7))
    hidden = model(ids, head=False)  # (B, T, C)
    assert hidden.shape == (2, 7, 32)
    torch.testing.assert_close(model(ids), model.lm_head(hidden))
