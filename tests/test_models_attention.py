"""Attention written once: flash (SDPA) and naive paths agree, GQA/MQA are MHA with fewer K/V heads,
masks are built right (padding, causal, cache offsets, ALiBi)."""

import pytest
import torch

from tfkit.models import build_model
from tfkit.models.attention import (
    AttnMask, cross_attention_mask, grouped_query_attention, naive_attention, position_mask, self_attention_mask,
)

from helpers import tiny_cfg

ARCHS = ("gpt", "bert", "transformer")
POSITIONS = ("learned", "sinusoidal", "rope", "alibi")
KV_HEADS = {"mha": None, "gqa": 2, "mqa": 1}


def make_inputs(arch: str, padded: bool, B: int = 2, T: int = 7) -> dict:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 61, (B, T), generator=g)
    mask = torch.ones(B, T, dtype=torch.bool)
    if padded:
        mask[1, T - 3:] = False  # right padding on the second row
    if arch == "transformer":
        tgt = torch.randint(1, 61, (B, T - 2), generator=g)
        tgt_mask = torch.ones_like(tgt, dtype=torch.bool)
        if padded:
            tgt_mask[0, -2:] = False
        return dict(src_ids=ids, tgt_ids=tgt, src_mask=mask if padded else None,
                    tgt_mask=tgt_mask if padded else None)
    return dict(input_ids=ids, attention_mask=mask if padded else None)


def forward_backward(model, inputs):
    logits = model(**inputs)
    weights = torch.linspace(-1, 1, logits.numel()).view_as(logits)  # any fixed non-trivial loss
    (logits * weights).sum().backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    assert len(grads) >= len(list(model.parameters())) - 2  # every weight but BERT's pooler gets a gradient
    return logits.detach(), grads


@pytest.mark.parametrize("heads", list(KV_HEADS))
@pytest.mark.parametrize("padded", [False, True], ids=["nomask", "padding"])
@pytest.mark.parametrize("positions", POSITIONS)
@pytest.mark.parametrize("arch", ARCHS)
def test_flash_and_naive_agree_forward_and_backward(arch, positions, padded, heads):
    torch.manual_seed(0)
    flash = build_model(tiny_cfg(arch, positions=positions, n_kv_heads=KV_HEADS[heads], attention="flash"))
    naive = build_model(tiny_cfg(arch, positions=positions, n_kv_heads=KV_HEADS[heads], attention="naive"))
    naive.load_state_dict(flash.state_dict())  # attention impl changes no parameters
    inputs = make_inputs(arch, padded)
    logits_f, grads_f = forward_backward(flash, inputs)
    logits_n, grads_n = forward_backward(naive, inputs)
    torch.testing.assert_close(logits_f, logits_n, atol=1e-5, rtol=1e-5)
    assert grads_f.keys() == grads_n.keys()
    for name in grads_f:
        torch.testing.assert_close(grads_f[name], grads_n[name], atol=1e-5, rtol=1e-4, msg=name)


@pytest.mark.parametrize("arch", ARCHS)
def test_flash_and_naive_agree_llama_style(arch):
    """RMSNorm, SwiGLU, no biases, RoPE, GQA, untied head: the other config choices through both paths."""
    kw = dict(norm="rmsnorm", activation="swiglu", bias=False, positions="rope", n_kv_heads=2,
              tie_embeddings=False, norm_placement="pre")
    flash = build_model(tiny_cfg(arch, attention="flash", **kw))
    naive = build_model(tiny_cfg(arch, attention="naive", **kw))
    naive.load_state_dict(flash.state_dict())
    inputs = make_inputs(arch, padded=True)
    logits_f, grads_f = forward_backward(flash, inputs)
    logits_n, grads_n = forward_backward(naive, inputs)
    torch.testing.assert_close(logits_f, logits_n, atol=1e-5, rtol=1e-5)
    for name in grads_f:
        torch.testing.assert_close(grads_f[name], grads_n[name], atol=1e-5, rtol=1e-4, msg=name)


@pytest.mark.parametrize("arch", ARCHS)
def test_gqa_with_all_heads_equals_mha(arch):
    mha = build_model(tiny_cfg(arch, n_kv_heads=None))
    gqa = build_model(tiny_cfg(arch, n_kv_heads=4))
    gqa.load_state_dict(mha.state_dict())
    inputs = make_inputs(arch, padded=True)
    torch.testing.assert_close(mha(**inputs), gqa(**inputs), atol=0, rtol=0)


def test_kv_projections_are_sized_by_kv_heads():
    cfg = tiny_cfg("gpt", n_kv_heads=1)
    attn = build_model(cfg).blocks[0].attn
    assert attn.q_proj.out_features == 32
    assert attn.k_proj.out_features == attn.v_proj.out_features == cfg.head_dim  # one shared K/V head
    mha, mqa = build_model(tiny_cfg("gpt")), build_model(cfg)
    saved_per_layer = 2 * (32 * 32 + 32 - (32 * 8 + 8))  # K and V projections shrink from 4 heads to 1
    assert mha.num_params() - mqa.num_params() == 2 * saved_per_layer


def test_need_weights_returns_softmax_rows_that_respect_the_mask():
    cfg = tiny_cfg("gpt", attention="flash")
    attn = build_model(cfg).blocks[0].attn
    x = torch.randn(2, 5, 32)
    padding = torch.tensor([[True] * 5, [True, True, True, False, False]])
    mask = self_attention_mask(5, causal=True, key_padding=padding)
    y, weights = attn(x, mask, need_weights=True)
    assert y.shape == (2, 5, 32) and weights.shape == (2, 4, 5, 5)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 4, 5))
    assert torch.all(weights.triu(diagonal=1) == 0)  # no query sees the future
    assert torch.all(weights[1, :, :3, 3:] == 0)  # real queries never see padding keys
    torch.testing.assert_close(attn(x, mask), y, atol=1e-6, rtol=1e-5)  # same output as the fused path


def test_causal_mask_fast_path_only_when_pure():
    assert self_attention_mask(4, causal=True).is_causal
    assert not self_attention_mask(4, causal=True, key_padding=torch.ones(1, 4, dtype=torch.bool)).is_causal
    assert not self_attention_mask(4, causal=True, alibi=torch.ones(2)).is_causal
    assert self_attention_mask(4, causal=False).tensor is None


def test_position_mask_over_a_cache():
    """Queries at positions 3, 4 over cache slots 0..5: query 3 sees keys 0..3, query 4 sees 0..4."""
    mask = position_mask(torch.tensor([3, 4]), torch.arange(6), causal=True)
    expected = torch.tensor([[True, True, True, True, False, False], [True, True, True, True, True, False]])
    assert torch.equal(mask[0, 0], expected)


@pytest.mark.parametrize("kv_heads", [1, 2], ids=["mqa", "gqa"])
@pytest.mark.parametrize("queries", [1, 5], ids=["decode", "prefill"])
@pytest.mark.parametrize("additive", [False, True], ids=["bool", "additive"])
def test_grouped_queries_over_a_cache_equal_the_repeated_heads(kv_heads, queries, additive):
    """CUDA's masked GQA path folds each K/V head's query heads into its rows instead of copying K/V to full
    width; on any input it must give what every query head attending its own copy gives (naive path)."""
    g = torch.Generator().manual_seed(queries + kv_heads)
    q = torch.randn(2, 4, queries, 8, generator=g)  # (B, H, T, D)
    k, v = torch.randn(2, kv_heads, 9, 8, generator=g), torch.randn(2, kv_heads, 9, 8, generator=g)  # (B, H_kv, S, D)
    q_pos = torch.arange(9 - queries, 9) - torch.tensor([[0], [2]])  # (B, T): the second row two slots behind
    mask = torch.arange(9)[None, None, None, :] <= q_pos[:, None, :, None]  # (B, 1, T, S): its cache slots so far
    if additive:  # (B, 1, T, S) bias: 0 where seen, a finite penalty elsewhere
        mask = (~mask).float() * -1e4
    out = grouped_query_attention(q, k, v, mask, 0.0, None)  # (B, H, T, D)
    expected, _ = naive_attention(q, k, v, AttnMask(mask), 0.0, training=False)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_padding_and_causal_combine_and_padding_queries_see_themselves():
    padding = torch.tensor([[False, True, True]])  # left padding
    mask = self_attention_mask(3, causal=True, key_padding=padding).tensor[0, 0]
    expected = torch.tensor([[True, False, False], [False, True, False], [False, True, True]])
    assert torch.equal(mask, expected)


def test_padding_mask_length_must_cover_the_keys():
    with pytest.raises(ValueError, match="expected T=3"):
        self_attention_mask(3, causal=True, key_padding=torch.ones(1, 4, dtype=torch.bool))


def test_alibi_mask_is_a_linear_distance_bias():
    slopes = torch.tensor([0.5, 0.25])
    mask = position_mask(torch.tensor([1, 2, 3]), torch.arange(4), causal=True, alibi=slopes)  # queries 1..3, keys 0..3
    assert mask.shape == (1, 2, 3, 4) and mask.dtype == torch.float32
    assert mask[0, 0, 0, 0] == -0.5 and mask[0, 1, 2, 0] == -0.75 and mask[0, 0, 2, 3] == 0
    assert mask[0, 0, 0, 2] == float("-inf")


def test_cross_attention_mask_and_empty_rows():
    """A source with no real token gives zero output in both paths (no NaN)."""
    q, k, v = torch.randn(1, 2, 3, 4), torch.randn(1, 2, 5, 4), torch.randn(1, 2, 5, 4)
    mask = cross_attention_mask(torch.zeros(1, 5, dtype=torch.bool))
    y, _ = naive_attention(q, k, v, mask, 0.0, training=False)
    assert torch.equal(y, torch.zeros_like(y))
    assert cross_attention_mask(None) == AttnMask()


def test_attention_dropout_is_active_only_in_training():
    model = build_model(tiny_cfg("gpt", attn_dropout=0.5, dropout=0.0))
    ids = torch.randint(0, 61, (1, 8))
    model.train()
    assert not torch.allclose(model(ids), model(ids))
    model.eval()
    torch.testing.assert_close(model(ids), model(ids))
