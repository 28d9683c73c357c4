"""The model options the lab's claims need: additive scores, shared-QK, shared-KV, the padding fill, no residuals.

Each is checked against a reference written out here, independently of models/attention.py (the formula by
hand on a few numbers), then flash = naive where both paths apply, the KV cache = a full recompute, and a
one-line refusal wherever a path, an export or a conversion cannot honour it."""

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

from tfkit.checkpoints.gguf_export import gguf_layout
from tfkit.checkpoints.hf_state import export_family
from tfkit.errors import ConfigError
from tfkit.models import ModelConfig, build_model
from tfkit.models.attention import Attention, AttnMask, self_attention_mask
from tfkit.models.convert import check_regrouping

from helpers import tiny_cfg


def ids(T: int = 10, B: int = 2) -> torch.Tensor:
    return torch.randint(1, 61, (B, T), generator=torch.Generator().manual_seed(0))


def twins(cfg: ModelConfig) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The model of `cfg` on the flash path and the same weights on the naive path, in eval mode."""
    torch.manual_seed(0)
    flash = build_model(dataclasses.replace(cfg, attention="flash")).eval()
    naive = build_model(dataclasses.replace(cfg, attention="naive")).eval()
    naive.load_state_dict(flash.state_dict())
    return flash, naive


def cached_equals_full(cfg: ModelConfig, T: int = 10) -> None:
    """Greedy-style decoding through the KV cache (a prefill of 4, then one token at a time) gives the logits
    of one full forward."""
    torch.manual_seed(0)
    model = build_model(cfg).eval()
    x = ids(T, B=1)
    with torch.no_grad():
        full = model(x)  # (1, T, V)
        cache = model.new_kv_cache(1)
        steps = [model(x[:, :4], kv_cache=cache)]
        steps += [model(x[:, t:t + 1], kv_cache=cache, start_pos=torch.tensor(t)) for t in range(4, T)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)


def one_line_problem(cfg: ModelConfig, key: str) -> str:
    problems = [p for p in cfg.problems() if p.startswith(f"model.{key}:")]
    assert len(problems) == 1 and "\n" not in problems[0], cfg.problems()
    return problems[0]


# --- additive scores ---------------------------------------------------------------------------------------

def test_additive_scores_are_w_dot_tanh_of_q_plus_k_computed_by_hand():
    torch.manual_seed(0)
    cfg = tiny_cfg("gpt", attention="naive", attn_score="additive", n_heads=2)
    layer = Attention(cfg).eval()
    x = torch.randn(1, 3, 32)
    mask = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 1, 1]], dtype=torch.bool)
    with torch.no_grad():
        got = layer(x, AttnMask(mask[None, None]))  # (1, 3, 32)
        want = _additive_by_hand(layer, x[0])
    torch.testing.assert_close(got[0], want, atol=1e-5, rtol=1e-5)


def _additive_by_hand(layer: Attention, x: torch.Tensor) -> torch.Tensor:
    """Causal additive attention of x (3, 32), 2 heads of 16, one score at a time."""
    q = x @ layer.q_proj.weight.T + layer.q_proj.bias  # (3, 32): 2 heads of 16 side by side
    k = x @ layer.k_proj.weight.T + layer.k_proj.bias
    v = x @ layer.v_proj.weight.T + layer.v_proj.bias
    heads = []
    for h in range(2):
        cols = slice(16 * h, 16 * (h + 1))
        w = layer.score_weight[h]  # (16,)
        rows = []
        for i in range(3):
            scores = [float((w * torch.tanh(q[i, cols] + k[j, cols])).sum()) if j <= i else -math.inf for j in range(3)]
            p = torch.softmax(torch.tensor(scores), dim=0)
            rows.append(p @ v[:, cols])  # (16,)
        heads.append(torch.stack(rows))  # (3, 16)
    return torch.cat(heads, dim=1) @ layer.o_proj.weight.T + layer.o_proj.bias  # (3, 32)


@pytest.mark.parametrize("arch", ["gpt", "bert", "transformer"])
def test_additive_scores_train_their_weight_in_every_family(arch):
    torch.manual_seed(0)
    model = build_model(tiny_cfg(arch, attention="naive", attn_score="additive"))
    x = ids()
    out = model(x, x[:, :7]) if arch == "transformer" else model(x)
    out.float().pow(2).mean().backward()
    weights = [p for n, p in model.named_parameters() if n.endswith("score_weight")]
    assert weights and all(w.grad is not None and w.grad.abs().sum() > 0 for w in weights)


def test_additive_scores_decode_through_the_cache_as_a_full_forward():
    cached_equals_full(tiny_cfg("gpt", attention="naive", attn_score="additive", positions="rope", n_kv_heads=2))


def test_additive_scores_are_refused_where_no_path_computes_them():
    line = one_line_problem(tiny_cfg("gpt", attn_score="additive"), "attn_score")  # attention: flash, the default
    assert "attention: naive" in line and "fused" in line
    line = one_line_problem(tiny_cfg("gpt", attention="naive", attn_score="additive", attn_scale="none"), "attn_scale")
    assert "additive" in line
    assert one_line_problem(tiny_cfg("gpt", attn_score="bilinear"), "attn_score").endswith("dot, additive")


# --- shared-QK ---------------------------------------------------------------------------------------------

def test_shared_qk_keys_are_unit_queries_and_a_token_skips_itself_unless_alone():
    """By hand, one head: k_j = q_j / |q_j|; a causal query sees the earlier tokens, not itself, except the
    first token, which has nothing else."""
    torch.manual_seed(0)
    cfg = tiny_cfg("gpt", shared_qk=True, n_heads=1, attention="naive")
    layer = Attention(cfg).eval()
    assert layer.k_proj is None
    x = torch.randn(1, 4, 32)
    got = layer(x, self_attention_mask(4, causal=True, exclude_self=True))  # (1, 4, 32)
    q = x[0] @ layer.q_proj.weight.T + layer.q_proj.bias  # (4, 32)
    k = q / q.norm(dim=-1, keepdim=True)
    v = x[0] @ layer.v_proj.weight.T + layer.v_proj.bias
    visible = torch.tensor([[1, 0, 0, 0], [1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0]], dtype=torch.bool)
    scores = (q @ k.T / math.sqrt(32)).masked_fill(~visible, -math.inf)
    want = torch.softmax(scores, dim=-1) @ v @ layer.o_proj.weight.T + layer.o_proj.bias
    torch.testing.assert_close(got[0], want, atol=1e-5, rtol=1e-5)


def test_shared_qk_bidirectional_mask_never_shows_a_token_itself():
    mask = self_attention_mask(5, causal=False, exclude_self=True).tensor  # (1, 1, 5, 5)
    assert torch.equal(mask[0, 0], ~torch.eye(5, dtype=torch.bool))
    lone = self_attention_mask(5, causal=False, window=1, exclude_self=True).tensor  # nothing else in a 1-wide band
    assert torch.equal(lone[0, 0], torch.eye(5, dtype=torch.bool))


@pytest.mark.parametrize("positions", ["learned", "rope", "alibi"])
@pytest.mark.parametrize("arch", ["gpt", "bert"])
def test_shared_qk_flash_equals_naive(arch, positions):
    flash, naive = twins(tiny_cfg(arch, shared_qk=True, positions=positions))
    x, real = ids(), torch.ones(2, 10, dtype=torch.bool)
    real[1, 7:] = False
    with torch.no_grad():
        got = flash(x) if arch == "gpt" else flash.encode(x, attention_mask=real)
        want = naive(x) if arch == "gpt" else naive.encode(x, attention_mask=real)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("positions", ["learned", "rope", "alibi"])
def test_shared_qk_decodes_through_the_cache_as_a_full_forward(positions):
    cached_equals_full(tiny_cfg("gpt", shared_qk=True, positions=positions))


def test_shared_qk_drops_one_projection_and_is_refused_where_keys_are_not_queries():
    plain, shared = (build_model(tiny_cfg("gpt", shared_qk=s)) for s in (False, True))
    assert plain.num_params() - shared.num_params() == 2 * (32 * 32 + 32)  # k_proj of each of 2 layers
    assert "n_kv_heads must be null or 4" in one_line_problem(tiny_cfg("gpt", shared_qk=True, n_kv_heads=2), "shared_qk")
    assert "cross-attention" in one_line_problem(tiny_cfg("transformer", shared_qk=True), "shared_qk")
    with pytest.raises(ConfigError, match="model.shared_qk: .*cannot be regrouped"):
        check_regrouping(tiny_cfg("gpt", shared_qk=True), 2)


# --- shared-KV (K = V) ------------------------------------------------------------------------------------

def test_shared_kv_values_are_the_unrotated_keys_by_hand():
    """By hand, one head, RoPE: v_j = W_k x_j (no v_proj), k_j = that rotated; a plain causal softmax."""
    from tfkit.models.layers import apply_rope, rope_angles

    torch.manual_seed(0)
    cfg = tiny_cfg("gpt", shared_kv=True, n_heads=1, attention="naive", positions="rope")
    layer = Attention(cfg).eval()
    assert layer.v_proj is None
    x = torch.randn(1, 4, 32)
    rope = rope_angles(cfg, 4)  # (4, 32) each
    got = layer(x, self_attention_mask(4, causal=True), rope=rope)  # (1, 4, 32)
    q = (x[0] @ layer.q_proj.weight.T + layer.q_proj.bias)[None, None]  # (1, 1, 4, 32)
    v = (x[0] @ layer.k_proj.weight.T + layer.k_proj.bias)[None, None]
    q, k = apply_rope(q, *rope)[0, 0], apply_rope(v, *rope)[0, 0]
    scores = (q @ k.T / math.sqrt(32)).masked_fill(~torch.ones(4, 4, dtype=torch.bool).tril(), -math.inf)
    want = torch.softmax(scores, dim=-1) @ v[0, 0] @ layer.o_proj.weight.T + layer.o_proj.bias
    torch.testing.assert_close(got[0], want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("arch", ["gpt", "bert", "transformer"])
def test_shared_kv_flash_equals_naive_and_decodes_through_the_cache(arch):
    flash, naive = twins(tiny_cfg(arch, shared_kv=True, positions="rope" if arch == "gpt" else "learned"))
    x = ids()
    with torch.no_grad():
        if arch == "transformer":
            got, want = flash(x, x[:, :6]), naive(x, x[:, :6])
        else:
            got, want = (m(x) if arch == "gpt" else m.encode(x) for m in (flash, naive))
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    if arch == "gpt":
        cached_equals_full(tiny_cfg("gpt", shared_kv=True, n_kv_heads=2, positions="rope"))


def test_shared_kv_drops_the_value_projection_and_is_refused_where_it_cannot_be_honoured():
    plain, shared = (build_model(tiny_cfg("gpt", shared_kv=s)) for s in (False, True))
    assert plain.num_params() - shared.num_params() == 2 * (32 * 32 + 32)  # v_proj of each of 2 layers
    assert "not both" in one_line_problem(tiny_cfg("gpt", shared_kv=True, shared_qk=True), "shared_kv")
    with pytest.raises(ConfigError, match="model.shared_kv: .*no v_proj"):
        check_regrouping(tiny_cfg("gpt", shared_kv=True), 2)


# --- the padding fill --------------------------------------------------------------------------------------

def padded_bert(fill) -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    model = build_model(tiny_cfg("bert", pad_fill=fill)).eval()
    real = torch.ones(2, 10, dtype=torch.bool)
    real[:, 6:] = False
    return model, ids(), real


def test_a_large_negative_fill_hides_padding_as_minus_inf_does():
    exact, x, real = padded_bert("-inf")
    large, _, _ = padded_bert(-10000)
    with torch.no_grad():
        torch.testing.assert_close(large.encode(x, real)[:, :6], exact.encode(x, real)[:, :6], atol=1e-6, rtol=1e-6)
        other = x.clone()
        other[:, 6:] = 7  # the padding's content: invisible to the real tokens
        torch.testing.assert_close(exact.encode(other, real)[:, :6], exact.encode(x, real)[:, :6], atol=1e-6, rtol=1e-6)


def test_a_zero_fill_is_no_padding_mask_at_all():
    model, x, real = padded_bert(0)
    with torch.no_grad():
        torch.testing.assert_close(model.encode(x, real), model.encode(x), atol=1e-6, rtol=1e-6)
        exact = dataclasses.replace(model.config, pad_fill="-inf")
        hidden = build_model(exact).eval()
        hidden.load_state_dict(model.state_dict())
        assert (hidden.encode(x, real)[:, :6] - model.encode(x, real)[:, :6]).abs().max() > 1e-3


@pytest.mark.parametrize("fill", [-10000.0, -1.0, 0.0])
@pytest.mark.parametrize("arch", ["gpt", "bert"])
def test_a_finite_fill_flash_equals_naive_and_the_causal_mask_stays_exact(arch, fill):
    flash, naive = twins(tiny_cfg(arch, pad_fill=fill, positions="alibi"))
    x, real = ids(), torch.ones(2, 10, dtype=torch.bool)
    real[1, 6:] = False
    with torch.no_grad():
        run = (lambda m, t: m(t, attention_mask=real)) if arch == "gpt" else (lambda m, t: m.encode(t, real))
        torch.testing.assert_close(run(flash, x), run(naive, x), atol=1e-5, rtol=1e-5)
        if arch == "gpt":  # padding gets the fill; a later token stays hidden from an earlier one
            later = x.clone()
            later[0, 5:] = 3
            torch.testing.assert_close(run(flash, later)[0, :5], run(flash, x)[0, :5], atol=1e-6, rtol=1e-6)


def test_a_zero_fill_in_the_encoder_decoder_unmasks_the_source_padding():
    torch.manual_seed(0)
    model = build_model(tiny_cfg("transformer", pad_fill=0)).eval()
    src, tgt, real = ids(), ids(7), torch.ones(2, 10, dtype=torch.bool)
    real[:, 6:] = False
    with torch.no_grad():
        torch.testing.assert_close(model(src, tgt, src_mask=real), model(src, tgt), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("given, kept", [("-inf", "-inf"), (float("-inf"), "-inf"), ("-1e4", -10000.0), (0, 0.0)])
def test_pad_fill_has_one_spelling_per_value(given, kept):
    cfg = tiny_cfg("bert", pad_fill=given)
    assert cfg.pad_fill == kept and not cfg.problems()
    assert ModelConfig.from_dict(cfg.to_dict()).pad_fill == kept  # config.json round trip (no -Infinity in JSON)


@pytest.mark.parametrize("bad", [1.0, "minus-inf", float("nan")])
def test_pad_fill_above_zero_or_not_a_number_is_one_line(bad):
    assert "expected -inf or a finite number <= 0" in one_line_problem(tiny_cfg("bert", pad_fill=bad), "pad_fill")


# --- no residual connections -------------------------------------------------------------------------------

@pytest.mark.parametrize("placement", ["pre", "post"])
def test_without_residuals_each_sublayer_output_replaces_its_input(placement):
    from tfkit.models.base import Block

    torch.manual_seed(0)
    block = Block(tiny_cfg("gpt", residual=False, norm_placement=placement)).eval()
    x, mask = torch.randn(2, 5, 32), self_attention_mask(5, causal=True)
    if placement == "pre":
        h = block.attn(block.norm_attn(x), mask)
        want = block.ffn(block.norm_ffn(h))
    else:
        h = block.norm_attn(block.attn(x, mask))
        want = block.norm_ffn(block.ffn(h))
    torch.testing.assert_close(block(x, mask), want)


@pytest.mark.parametrize("arch", ["gpt", "bert", "transformer"])
def test_without_residuals_flash_equals_naive(arch):
    flash, naive = twins(tiny_cfg(arch, residual=False))
    x = ids()
    with torch.no_grad():
        args = (x, x[:, :7]) if arch == "transformer" else (x,)
        torch.testing.assert_close(flash(*args), naive(*args), atol=1e-5, rtol=1e-5)


# --- exports and evaluation under another setting ----------------------------------------------------------

EXPORTABLE = dict(arch="gpt", vocab_size=61, d_model=32, n_layers=1, n_heads=4, positions="learned")


@pytest.mark.parametrize("field, value", [("attn_score", "additive"), ("shared_qk", True), ("shared_kv", True),
                                          ("pad_fill", -10000.0),
                                          ("pad_fill", 0.0), ("residual", False)])
def test_hf_and_gguf_export_refuse_each_option_in_one_line(field, value):
    extra = {"attention": "naive"} if field == "attn_score" else {}
    cfg = ModelConfig(**{**EXPORTABLE, **extra, field: value})
    for refuse in (export_family, gguf_layout):
        with pytest.raises(ConfigError) as err:
            refuse(cfg)
        assert f"model.{field}=" in str(err.value) and "\n" not in str(err.value)
    export_family(ModelConfig(**EXPORTABLE))  # the defaults export


def test_eval_may_change_the_padding_fill_or_residuals_but_not_shared_qk():
    from tfkit.evaluation.model_overrides import with_model_overrides

    cfg = tiny_cfg("bert")
    model = build_model(cfg)
    _, changed = with_model_overrides(model, cfg, ["model.pad_fill=0", "model.residual=false"])
    assert changed.pad_fill == 0.0 and changed.residual is False
    with pytest.raises(ConfigError, match="model.shared_qk=True changes the model's weights"):
        with_model_overrides(model, cfg, ["model.shared_qk=true"])


def test_the_additive_hidden_layer_matches_einsum_free_broadcasting():
    """`additive_scores` against the same sum written with broadcasting and a plain sum, on random tensors."""
    from tfkit.models.attention import additive_scores

    g = torch.Generator().manual_seed(1)
    q, k, w = torch.randn(2, 3, 4, 5, generator=g), torch.randn(2, 3, 6, 5, generator=g), torch.randn(3, 5, generator=g)
    want = (w[None, :, None, None, :] * torch.tanh(q.unsqueeze(3) + k.unsqueeze(2))).sum(-1)  # (2, 3, 4, 6)
    torch.testing.assert_close(additive_scores(q, k, w), want)
    assert F.softmax(additive_scores(q, k, w), -1).shape == (2, 3, 4, 6)


def test_t5_init_folds_the_score_scale_into_the_query_projection():
    """init t5 with attn_scale none gives the scores xavier with sqrt_d gives, at step 0: W_q is sqrt(head_dim)
    smaller, every other weight is xavier's."""
    xavier = tiny_cfg("gpt", init="xavier", attn_scale="sqrt_d")
    t5 = tiny_cfg("gpt", init="t5", attn_scale="none")
    torch.manual_seed(0)
    a = build_model(xavier)
    torch.manual_seed(0)
    b = build_model(t5)
    for (name, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters()):
        factor = xavier.head_dim ** -0.5 if name.endswith("q_proj.weight") else 1.0
        assert torch.allclose(pb, pa * factor), name
    ids = torch.randint(0, xavier.vocab_size, (2, 16))
    assert torch.allclose(a(ids), b(ids), atol=1e-5)  # the same function before any update
