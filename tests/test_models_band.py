"""Sliding windows a chunk of queries at a time (models/band.py): the same attention as SDPA over the dense
band mask, forward and backward, causal and bidirectional, MHA and grouped K/V, at lengths the window
does and does not divide; and the model takes that path only where it saves work."""

import pytest
import torch
import torch.nn.functional as F

from tfkit.models.attention import self_attention_mask
from tfkit.models.band import banded_attention, worth_banding


@pytest.mark.parametrize("length, window", [(64, 16), (100, 16), (257, 64), (40, 1)])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
@pytest.mark.parametrize("kv_heads", [4, 1], ids=["mha", "mqa"])
def test_chunks_equal_the_dense_band(length, window, causal, kv_heads):
    torch.manual_seed(length + window)
    q = torch.randn(2, 4, length, 8, requires_grad=True)  # (B, H, T, D)
    k, v = (torch.randn(2, kv_heads, length, 8, requires_grad=True) for _ in range(2))  # (B, H_kv, T, D)
    pos = torch.arange(length)
    dense = (pos[:, None] - pos[None, :]).abs() < window  # (T, T)
    if causal:
        dense &= pos[None, :] <= pos[:, None]
    got = banded_attention(q, k, v, window, causal, 0.0, None, kv_heads != 4)  # (B, H, T, D)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=dense, enable_gqa=kv_heads != 4)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    weights = torch.randn_like(got)
    grads = torch.autograd.grad((got * weights).sum(), (q, k, v))
    expected_grads = torch.autograd.grad((expected * weights).sum(), (q, k, v))
    for g, e in zip(grads, expected_grads):
        torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-5)


def test_the_mask_offers_the_band_only_when_it_is_nothing_but_a_window():
    assert self_attention_mask(64, causal=True, window=16).band == (16, True)
    assert self_attention_mask(64, causal=False, window=16).band == (16, False)
    assert self_attention_mask(64, causal=True).band is None
    assert self_attention_mask(64, causal=True, window=16, doc_ids=torch.zeros(1, 64, dtype=torch.long)).band is None
    assert self_attention_mask(64, causal=True, window=16, key_padding=torch.ones(1, 64, dtype=torch.bool)).band is None
    assert self_attention_mask(16, causal=True, window=16).band is None  # as wide as the sequence: no window
    assert worth_banding(64, 16) and not worth_banding(63, 16)


@pytest.mark.parametrize("arch", ["gpt", "bert"])
def test_a_windowed_model_takes_the_chunks_and_equals_its_naive_path(arch, monkeypatch):
    """A model whose sequence is 6 windows long: the fused path goes through the chunks (counted) and gives
    the naive path's outputs and gradients."""
    from helpers import tiny_cfg

    from tfkit.models import band, build_model
    from tfkit.models import attention as attention_module

    calls = []
    monkeypatch.setattr(attention_module, "banded_attention", lambda *a: calls.append(1) or band.banded_attention(*a))
    torch.manual_seed(0)
    cfg = tiny_cfg(arch, window=8, max_seq_len=48, n_kv_heads=2)
    flash = build_model(cfg)
    naive = build_model(tiny_cfg(arch, window=8, max_seq_len=48, n_kv_heads=2, attention="naive"))
    naive.load_state_dict(flash.state_dict())
    ids = torch.randint(0, 61, (2, 48))
    outs = [m.encode(ids) if arch == "bert" else m(ids, head=False) for m in (flash, naive)]  # (B, T, C)
    torch.testing.assert_close(outs[0], outs[1], atol=1e-5, rtol=1e-5)
    for out in outs:
        out.square().sum().backward()
    for (name, p), q in zip(flash.named_parameters(), naive.parameters()):
        if p.grad is not None:
            torch.testing.assert_close(p.grad, q.grad, atol=1e-4, rtol=1e-4, msg=name)
    assert len(calls) == cfg.n_layers
