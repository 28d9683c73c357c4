"""The model keys the design-claim experiments compare: `attn_scale`, `positions: none`, `norm: batchnorm`.

Each is checked against an independent reference: attention scores against a hand-written softmax(s*QK^T)V,
positions none against permutation equivariance, BatchNorm against torch.nn.BatchNorm1d on (B*T, D); and
each through the paths a model runs: flash and naive, prefill and KV-cache decoding, every family.
"""

from __future__ import annotations

import math

import pytest
import torch

from tfkit.checkpoints.hf_state import tfkit_to_hf
from tfkit.errors import ConfigError
from tfkit.models import ModelConfig, build_model
from tfkit.models.attention import Attention, AttnMask
from tfkit.models.generation import decode_step, generate

from helpers import tiny_cfg

SCALES = ["sqrt_d", "none", 0.3]


def model_of(arch: str, **overrides) -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model(tiny_cfg(arch, init_std=0.2, **overrides)).eval()


def logits(model, ids: torch.Tensor) -> torch.Tensor:
    return model(ids, ids) if model.config.arch == "transformer" else model(ids)


# --- attn_scale ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("arch", ["gpt", "bert", "transformer"])
def test_flash_and_naive_agree_for_every_scale(arch, scale):
    ids = torch.randint(0, 61, (2, 12), generator=torch.Generator().manual_seed(1))
    flash, naive = model_of(arch, attn_scale=scale), model_of(arch, attn_scale=scale, attention="naive")
    with torch.no_grad():
        torch.testing.assert_close(logits(flash, ids), logits(naive, ids), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("impl", ["flash", "naive"])
def test_unscaled_attention_is_softmax_of_raw_scores(impl):
    torch.manual_seed(0)
    cfg = tiny_cfg("gpt", attn_scale="none", attention=impl)
    attn = Attention(cfg).eval()
    x = torch.randn(2, 7, cfg.d_model) * 3  # (B, T, C): large scores, where the missing 1/sqrt(d) shows
    with torch.no_grad():
        q, k, v = (attn._heads(x, proj, cfg.n_heads) for proj in (attn.q_proj, attn.k_proj, attn.v_proj))
        causal = torch.ones(7, 7, dtype=torch.bool).tril()
        scores = (q @ k.transpose(-2, -1)).masked_fill(~causal, float("-inf"))  # (B, H, T, T), no scale
        want = attn.o_proj((torch.softmax(scores, -1) @ v).transpose(1, 2).reshape(2, 7, cfg.d_model))
        got = attn(x, AttnMask(causal[None, None], is_causal=True))
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    default = Attention(tiny_cfg("gpt", attention=impl)).eval()
    default.load_state_dict(attn.state_dict())
    assert not torch.allclose(default(x, AttnMask(causal[None, None], is_causal=True)), got, atol=1e-3)


@pytest.mark.parametrize("impl", ["flash", "naive"])
@pytest.mark.parametrize("arch", ["gpt", "bert"])
def test_an_explicit_one_over_sqrt_d_equals_the_default(arch, impl):
    ids = torch.randint(0, 61, (2, 10), generator=torch.Generator().manual_seed(2))
    default = model_of(arch, attention=impl)
    explicit = model_of(arch, attention=impl, attn_scale=1 / math.sqrt(default.config.head_dim))
    assert default.config.score_scale is None  # the default passes no scale: the computation of old
    with torch.no_grad():
        torch.testing.assert_close(logits(explicit, ids), logits(default, ids), atol=1e-5, rtol=1e-5)


def decode_all(model, ids: torch.Tensor) -> torch.Tensor:
    """Logits of every position: prefill the first 4 tokens, then one token at a time through the cache."""
    cache = model.new_kv_cache(ids.shape[0], ids.shape[1])
    with torch.inference_mode():
        rows = [model(ids[:, :4], kv_cache=cache)]  # (B, 4, V)
        rows += [decode_step(model, ids[:, p:p + 1], torch.tensor(p), cache)[:, None] for p in range(4, ids.shape[1])]
    return torch.cat(rows, dim=1)  # (B, T, V)


@pytest.mark.parametrize("overrides", [
    {"attn_scale": "none"}, {"attn_scale": 0.3, "attention": "naive"}, {"positions": "none"},
    {"norm": "batchnorm"}, {"norm": "batchnorm", "positions": "rope", "attn_scale": "none"},
], ids=["unscaled", "scaled-naive", "no-positions", "batchnorm", "batchnorm-rope-unscaled"])
def test_kv_cache_decoding_equals_a_full_forward(overrides):
    model = model_of("gpt", **overrides)
    ids = torch.randint(0, 61, (2, 11), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        torch.testing.assert_close(decode_all(model, ids), model(ids), atol=1e-5, rtol=1e-5)
    prompt = [3, 14, 15, 9]
    full = [int(model(torch.tensor([prompt]))[0, -1].argmax())]
    assert generate(model, [prompt], 1, temperature=0) == [full]  # the static decode step, too


# --- positions: none ------------------------------------------------------------------------------------------

def test_bert_without_positions_is_permutation_equivariant():
    model = model_of("bert", positions="none", type_vocab_size=0)
    ids = torch.randint(0, 61, (2, 9), generator=torch.Generator().manual_seed(4))
    perm = torch.randperm(9, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        hidden, permuted = model.encode(ids), model.encode(ids[:, perm])
    torch.testing.assert_close(permuted, hidden[:, perm], atol=1e-5, rtol=1e-5)
    learned = model_of("bert", positions="learned", type_vocab_size=0)  # the property is the missing positions'
    with torch.no_grad():
        assert not torch.allclose(learned.encode(ids[:, perm]), learned.encode(ids)[:, perm], atol=1e-3)


def test_gpt_without_positions_holds_no_position_weights_and_generates():
    model = model_of("gpt", positions="none")
    assert not any("pos" in name for name, _ in model.named_parameters())
    assert model.embed.pos is None and model.embed.sinusoid is None
    out = generate(model, [[1, 2, 3], [4, 5]], 6, temperature=0)
    assert [len(row) for row in out] == [6, 6]
    # a causal decoder still tells order apart: the last position sees a different prefix when shuffled
    with torch.no_grad():
        assert not torch.allclose(model(torch.tensor([[1, 2, 3]]))[0, -1], model(torch.tensor([[2, 1, 3]]))[0, -1])


# --- norm: batchnorm ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("bias", [True, False])
def test_batchnorm_matches_batchnorm1d_on_rows_in_train_and_eval(bias):
    norm = build_model(tiny_cfg("gpt", norm="batchnorm", bias=bias)).ln_f
    reference = torch.nn.BatchNorm1d(32, eps=norm.eps)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
        reference.weight.copy_(norm.weight)
        if bias:
            norm.bias.uniform_(-0.5, 0.5)
        reference.bias.copy_(norm.bias if bias else torch.zeros(32))
    assert (norm.bias is None) == (not bias)
    generator = torch.Generator().manual_seed(6)
    for _ in range(3):  # training: batch statistics over B*T rows, running statistics updated alike
        x = torch.randn(4, 5, 32, generator=generator) * 2 + 1  # (B, T, D)
        torch.testing.assert_close(norm.train()(x), reference.train()(x.reshape(20, 32)).reshape(4, 5, 32))
    torch.testing.assert_close(norm.running_mean, reference.running_mean)
    torch.testing.assert_close(norm.running_var, reference.running_var)
    x = torch.randn(2, 3, 32, generator=generator)
    torch.testing.assert_close(norm.eval()(x), reference.eval()(x.reshape(6, 32)).reshape(2, 3, 32))


def test_padding_stays_out_of_batchnorm_statistics():
    """With a padding mask, the statistics (and so the real rows' outputs and the running ones) are those of
    BatchNorm1d over the real rows alone, whatever the padding holds."""
    norm = build_model(tiny_cfg("gpt", norm="batchnorm")).ln_f.train()
    reference = torch.nn.BatchNorm1d(32, eps=norm.eps).train()
    x = torch.randn(3, 6, 32, generator=torch.Generator().manual_seed(8))  # (B, T, D)
    rows = torch.ones(3, 6, dtype=torch.bool)
    rows[0, 4:] = rows[2, 1:] = False
    x[~rows] = 1e3  # padding far off: counted, it would dominate the statistics
    got = norm(x, rows)
    torch.testing.assert_close(got[rows], reference(x[rows]), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(norm.running_mean, reference.running_mean)
    torch.testing.assert_close(norm.running_var, reference.running_var)
    assert int(norm.num_batches_tracked) == 1


def test_models_pass_the_padding_mask_to_batchnorm():
    """A seq2seq batch's padding changes nothing of the real positions' outputs: its tokens are masked out of
    attention and, with BatchNorm, out of the statistics too."""
    model = model_of("transformer", norm="batchnorm").train()
    src, tgt = torch.randint(0, 61, (2, 7)), torch.randint(0, 61, (2, 5))
    src_mask, tgt_mask = torch.ones(2, 7, dtype=torch.bool), torch.ones(2, 5, dtype=torch.bool)
    src_mask[1, 4:], tgt_mask[1, 3:] = False, False
    other_src, other_tgt = src.clone(), tgt.clone()
    other_src[~src_mask], other_tgt[~tgt_mask] = 60, 60  # different padding tokens
    out = model(src, tgt, src_mask=src_mask, tgt_mask=tgt_mask)
    other = model(other_src, other_tgt, src_mask=src_mask, tgt_mask=tgt_mask)
    torch.testing.assert_close(out[tgt_mask], other[tgt_mask], atol=1e-5, rtol=1e-5)
    unmasked = model(other_src, other_tgt)  # padding counted: the real positions' outputs move
    assert not torch.allclose(unmasked[tgt_mask], out[tgt_mask], atol=1e-4)
    bert = model_of("bert", norm="batchnorm").train()
    mask = torch.ones(2, 7, dtype=torch.bool)
    mask[0, 5:] = False
    ids = torch.randint(0, 61, (2, 7))
    other_ids = ids.clone()
    other_ids[~mask] = 60
    torch.testing.assert_close(bert.encode(ids, mask)[mask], bert.encode(other_ids, mask)[mask], atol=1e-5, rtol=1e-5)


def test_batchnorm_models_train_with_batch_statistics_and_save_running_ones():
    for arch in ("gpt", "bert", "transformer"):
        model = model_of(arch, norm="batchnorm").train()
        ids = torch.randint(0, 61, (2, 6))
        logits(model, ids).sum().backward()
        assert model.state_dict()[next(k for k in model.state_dict() if k.endswith("running_var"))].ne(1).any()
    config = ModelConfig.from_dict(tiny_cfg("gpt", norm="batchnorm").to_dict())
    assert config.norm == "batchnorm"


# --- config: validation, round trip, export -----------------------------------------------------------------

@pytest.mark.parametrize("field, value, message", [
    ("attn_scale", "sqrtd", "model.attn_scale: got 'sqrtd', expected sqrt_d, none or a positive finite number"),
    ("attn_scale", -1.0, "model.attn_scale: got -1.0, expected sqrt_d, none or a positive finite number"),
    ("attn_scale", float("nan"), "model.attn_scale: got nan"),
    ("positions", "absent", "model.positions: got 'absent', expected one of learned, sinusoidal, rope, alibi, none"),
    ("norm", "groupnorm", "model.norm: got 'groupnorm', expected one of layernorm, rmsnorm, batchnorm"),
])
def test_invalid_values_are_named_with_what_is_allowed(field, value, message):
    with pytest.raises(ConfigError, match="model.") as err:
        tiny_cfg("gpt", **{field: value}).validate()
    assert message in str(err.value)


def test_config_json_round_trips_the_new_keys_and_old_configs_get_the_defaults():
    cfg = tiny_cfg("gpt", attn_scale=0.25, positions="none", norm="batchnorm")
    assert ModelConfig.from_dict(cfg.to_dict()) == cfg
    assert ModelConfig.from_dict({**cfg.to_dict(), "attn_scale": "none"}).score_scale == 1.0
    assert ModelConfig.from_dict({**cfg.to_dict(), "attn_scale": 2}).attn_scale == 2.0  # an int is a number
    old = {k: v for k, v in tiny_cfg("gpt").to_dict().items() if k != "attn_scale"}
    loaded = ModelConfig.from_dict(old)
    assert loaded.attn_scale == "sqrt_d" and loaded.score_scale is None
    assert ModelConfig(attn_scale="1e-1").attn_scale == 0.1  # YAML reads 1e-1 (no dot) as text


@pytest.mark.parametrize("fields, named", [
    ({"arch": "gpt", "positions": "learned", "attn_scale": "none"}, "model.attn_scale=none has no HuggingFace"),
    ({"arch": "gpt", "positions": "rope", "norm": "rmsnorm", "activation": "swiglu", "attn_scale": 0.5},
     "model.attn_scale=0.5 has no HuggingFace"),
    ({"arch": "bert", "norm_placement": "post", "attn_scale": "none"}, "model.attn_scale=none"),
    ({"arch": "gpt", "positions": "none"}, "model.positions=none has no HuggingFace equivalent for gpt"),
    ({"arch": "bert", "norm_placement": "post", "positions": "none"}, "model.positions=none"),
    ({"arch": "gpt", "positions": "learned", "norm": "batchnorm"}, "model.norm=batchnorm has no HuggingFace"),
    ({"arch": "bert", "norm_placement": "post", "norm": "batchnorm"}, "model.norm=batchnorm"),
])
def test_export_refuses_what_huggingface_cannot_express_by_key(fields, named):
    with pytest.raises(ConfigError) as err:
        tfkit_to_hf(tiny_cfg(**fields), {})
    assert named in str(err.value)
