"""The attention options modern recipes use: QK-norm, sliding windows with global layers, RoPE scaling.
Each keeps flash = naive, the KV cache = a full recompute, and is refused where no path honours it."""

import pytest
import torch

from tfkit.checkpoints.hf_state import tfkit_to_hf
from tfkit.errors import ConfigError
from tfkit.models import ModelConfig, build_model

from helpers import tiny_cfg

ARCHS = ("gpt", "bert", "transformer")
KV_HEADS = {"mha": None, "gqa": 2, "mqa": 1}


def inputs(arch: str, T: int = 9) -> dict:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 61, (2, T), generator=g)
    if arch == "transformer":
        return dict(src_ids=ids, tgt_ids=torch.randint(1, 61, (2, T - 2), generator=g))
    return dict(input_ids=ids)


def flash_and_naive(cfg: ModelConfig, T: int = 9) -> None:
    """The flash and naive paths of `cfg` agree, forward and backward."""
    torch.manual_seed(0)
    flash = build_model(ModelConfig(**{**cfg.to_dict(), "attention": "flash"}))
    naive = build_model(ModelConfig(**{**cfg.to_dict(), "attention": "naive"}))
    naive.load_state_dict(flash.state_dict())
    outs = []
    for model in (flash, naive):
        logits = model(**inputs(cfg.arch, T))
        (logits * torch.linspace(-1, 1, logits.numel()).view_as(logits)).sum().backward()
        outs.append((logits.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}))
    torch.testing.assert_close(outs[0][0], outs[1][0], atol=1e-5, rtol=1e-5)
    for name, grad in outs[0][1].items():
        torch.testing.assert_close(grad, outs[1][1][name], atol=1e-5, rtol=1e-4, msg=name)


@pytest.mark.parametrize("norm", ["rmsnorm", "layernorm"])
@pytest.mark.parametrize("arch", ARCHS)
def test_qk_norm_makes_attention_blind_to_the_scale_of_q_and_k(arch, norm):
    torch.manual_seed(0)
    options = dict(norm=norm, positions="rope", n_kv_heads=2, norm_eps=1e-12, init_std=0.2)  # eps: q, k are small
    model = build_model(tiny_cfg(arch, qk_norm=True, **options)).eval()
    plain = build_model(tiny_cfg(arch, **options)).eval()
    with torch.no_grad():
        before, plain_before = model(**inputs(arch)), plain(**inputs(arch))
        for m in (model, plain):
            for name, p in m.named_parameters():
                if name.endswith(("q_proj.weight", "k_proj.weight")):
                    p.mul_(7.0)
        torch.testing.assert_close(model(**inputs(arch)), before, atol=1e-4, rtol=1e-4)
        assert not torch.allclose(plain(**inputs(arch)), plain_before, atol=1e-3)  # without it, the scale counts


def test_qk_norm_is_one_weight_over_head_dim_per_projection():
    cfg = tiny_cfg("gpt", qk_norm=True, norm="rmsnorm")
    extra = build_model(cfg).num_params() - build_model(tiny_cfg("gpt", norm="rmsnorm")).num_params()
    assert extra == cfg.n_layers * 2 * cfg.head_dim


@pytest.mark.parametrize("heads", list(KV_HEADS))
@pytest.mark.parametrize("arch", ARCHS)
def test_qk_norm_flash_equals_naive(arch, heads):
    flash_and_naive(tiny_cfg(arch, qk_norm=True, positions="rope", n_kv_heads=KV_HEADS[heads]))


def test_qk_norm_needs_a_per_token_norm():
    problems = tiny_cfg("gpt", qk_norm=True, norm="batchnorm").problems()
    assert any(p.startswith("model.qk_norm: ") and "batchnorm" in p for p in problems)


@pytest.mark.parametrize("fields, expected", [
    ({"bias": True}, "model.bias=True has no HuggingFace equivalent for gpt with rope positions and qk_norm (Qwen3)"),
    ({"positions": "learned", "norm": "layernorm", "activation": "gelu", "bias": True},
     "model.qk_norm=True has no HuggingFace equivalent for gpt with learned positions (GPT-2)"),
])
def test_qk_norm_exports_as_qwen3_only(fields, expected):
    cfg = ModelConfig(**{**dict(arch="gpt", vocab_size=61, d_model=32, n_layers=1, n_heads=4, positions="rope",
                                norm="rmsnorm", activation="swiglu", bias=False, qk_norm=True), **fields})
    with pytest.raises(ConfigError, match="has no HuggingFace equivalent") as err:
        tfkit_to_hf(cfg, {})
    assert expected in str(err.value) and "\n" not in str(err.value)


def band(T: int, window: int, causal: bool) -> torch.Tensor:
    """The explicit (T, T) band written out here, independently of attention.py: True = may attend."""
    q, k = torch.arange(T)[:, None], torch.arange(T)[None, :]
    near = (q - k < window) & (k - q < window)
    return near & (k <= q) if causal else near


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
@pytest.mark.parametrize("heads", list(KV_HEADS))
def test_a_windowed_layer_equals_the_naive_path_with_an_explicit_band(causal, heads):
    from tfkit.models.attention import Attention, AttnMask, self_attention_mask

    torch.manual_seed(0)
    layer = Attention(tiny_cfg("gpt", n_kv_heads=KV_HEADS[heads], window=3)).eval()
    x = torch.randn(2, 10, 32)
    got = layer(x, self_attention_mask(10, causal=causal, window=3))  # (B, T, C), flash
    reference = Attention(tiny_cfg("gpt", n_kv_heads=KV_HEADS[heads], attention="naive")).eval()
    reference.load_state_dict(layer.state_dict())
    want = reference(x, AttnMask(band(10, 3, causal)[None, None]))
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(got, reference(x, AttnMask(band(10, 10, causal)[None, None])), atol=1e-4)


@pytest.mark.parametrize("global_every", [None, 2], ids=["all_windowed", "global_every_2"])
@pytest.mark.parametrize("arch", ARCHS)
def test_windowed_flash_equals_naive(arch, global_every):
    flash_and_naive(tiny_cfg(arch, positions="rope", n_kv_heads=2, window=3, global_every=global_every), T=12)


@pytest.mark.parametrize("arch", ARCHS)
def test_flops_count_the_keys_a_windowed_layer_reads(arch):
    full, windowed = (build_model(tiny_cfg(arch, **extra)) for extra in ({}, {"window": 4, "global_every": 2}))
    per_key = 12 * 32  # 12 * d_model per key per attention layer
    self_stacks = 2 if arch == "transformer" else 1  # encoder and decoder self-attention; cross reads every key
    assert full.flops_per_token(32) - windowed.flops_per_token(32) == self_stacks * per_key * (32 - 4)  # layer 0


def test_every_global_every_th_layer_attends_over_everything():
    cfg = tiny_cfg("gpt", n_layers=6, window=4, global_every=3)
    assert [cfg.windowed(i) for i in range(6)] == [True, True, False, True, True, False]
    torch.manual_seed(0)
    all_global = build_model(tiny_cfg("gpt", window=2, global_every=1))  # every layer is a global one
    plain = build_model(tiny_cfg("gpt"))
    plain.load_state_dict(all_global.state_dict())
    ids = inputs("gpt", 12)
    torch.testing.assert_close(all_global(**ids), plain(**ids))
    windowed = build_model(tiny_cfg("gpt", window=2))
    windowed.load_state_dict(plain.state_dict())
    assert not torch.allclose(windowed(**ids), plain(**ids), atol=1e-4)


@pytest.mark.parametrize("global_every", [None, 2], ids=["all_windowed", "global_every_2"])
@pytest.mark.parametrize("positions", ["learned", "rope", "alibi"])
@pytest.mark.parametrize("heads", list(KV_HEADS))
@pytest.mark.parametrize("mode", ["steps", "chunks", "streaming"])
def test_decoding_past_the_window_equals_a_full_recompute(mode, heads, positions, global_every):
    from contextlib import nullcontext

    from tfkit.models.generation import decode_step
    from tfkit.models.streaming_decode import StreamingDecode

    torch.manual_seed(0)
    model = build_model(tiny_cfg("gpt", positions=positions, n_kv_heads=KV_HEADS[heads], window=3,
                                 global_every=global_every, init_std=0.2, qk_norm=True)).eval()
    ids = torch.randint(0, 61, (2, 12), generator=torch.Generator().manual_seed(1))  # (B, T)
    cache = model.new_kv_cache(2, 14)
    with torch.inference_mode():
        full = model(ids)  # (B, T, V)
        rows = [model(ids[:, :2], kv_cache=cache)]  # the prefill, shorter than the window
        if mode == "chunks":
            rows += [model(ids[:, p:p + 2], kv_cache=cache, start_pos=torch.tensor(p)) for p in range(2, 12, 2)]
        else:
            with StreamingDecode() if mode == "streaming" else nullcontext():
                rows.append(torch.stack([decode_step(model, ids[:, p:p + 1], torch.tensor(p), cache)
                                         for p in range(2, 12)], dim=1))
    torch.testing.assert_close(torch.cat(rows, dim=1), full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("fields, expected", [
    ({"window": 33}, "model.window: got 33, expected 1 <= window <= model.max_seq_len=32"),
    ({"window": 0}, "model.window: got 0"),
    ({"global_every": 2}, "model.global_every: got 2 without model.window"),
    ({"window": 4, "global_every": 3}, "model.global_every: got 3, expected 1 <= global_every <= model.n_layers=2"),
])
def test_windows_no_layer_can_honour_are_refused(fields, expected):
    assert any(expected in problem for problem in tiny_cfg("gpt", **fields).problems())


@pytest.mark.parametrize("fields, expected", [
    ({"global_every": 2}, "model.global_every=2 has no HuggingFace equivalent for gpt with rope positions and a "
                          "window (Mistral)"),
    ({"positions": "learned", "norm": "layernorm", "activation": "gelu", "bias": True},
     "model.window=8 has no HuggingFace equivalent for gpt with learned positions (GPT-2)"),
    ({"qk_norm": True}, "model.window=8 has no HuggingFace equivalent for gpt with rope positions and qk_norm"),
])
def test_a_window_exports_as_mistral_only(fields, expected):
    cfg = ModelConfig(**{**dict(arch="gpt", vocab_size=61, d_model=32, n_layers=2, n_heads=4, positions="rope",
                                norm="rmsnorm", activation="swiglu", bias=False, window=8), **fields})
    with pytest.raises(ConfigError, match="has no HuggingFace equivalent") as err:
        tfkit_to_hf(cfg, {})
    assert expected in str(err.value)


def test_linear_rope_scaling_rotates_position_p_as_p_over_factor():
    from tfkit.models.layers import rope_angles

    plain = rope_angles(tiny_cfg("gpt", positions="rope", max_seq_len=32), 16)
    scaled = rope_angles(tiny_cfg("gpt", positions="rope", max_seq_len=32, rope_scaling="linear", rope_factor=2.0), 32)
    for a, b in zip(plain, scaled):
        torch.testing.assert_close(b[0::2], a)  # (16, D): position 2p now turns as p did


@pytest.mark.parametrize("factor", [2.0, 4.0, 16.0])
def test_yarn_frequencies_and_scale_are_transformers_own(factor):
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from tfkit.models.rope_scaling import rope_frequencies

    cfg = ModelConfig(arch="gpt", d_model=256, n_heads=2, max_seq_len=int(256 * factor), positions="rope",
                      rope_scaling="yarn", rope_factor=factor)
    hf = transformers.LlamaConfig(hidden_size=256, num_attention_heads=2, max_position_embeddings=cfg.max_seq_len,
                                  rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": factor,
                                                   "original_max_position_embeddings": 256})
    want, attention_factor = ROPE_INIT_FUNCTIONS["yarn"](hf, "cpu")
    got, mscale = rope_frequencies(cfg)
    torch.testing.assert_close(got, want.float())
    assert mscale == pytest.approx(attention_factor)
    plain, _ = rope_frequencies(ModelConfig(arch="gpt", d_model=256, n_heads=2, positions="rope"))
    assert got[0] == plain[0] and torch.allclose(got[-1], plain[-1] / factor)  # fast kept, slow interpolated


@pytest.mark.parametrize("fields, expected", [
    ({"rope_scaling": "yarn", "rope_factor": 4.0},
     "model.rope_scaling: yarn scales RoPE, but model.positions is learned"),
    ({"rope_scaling": "ntk", "positions": "rope"}, "model.rope_scaling: got 'ntk', expected linear, yarn or null"),
    ({"rope_factor": 2.0, "positions": "rope"}, "model.rope_factor: got 2 without model.rope_scaling"),
    ({"rope_scaling": "linear", "rope_factor": 0.5, "positions": "rope"}, "model.rope_factor: got 0.5, expected >= 1"),
])
def test_rope_scaling_without_rope_is_refused(fields, expected):
    assert any(expected in problem for problem in tiny_cfg("gpt", **fields).problems())


@pytest.mark.parametrize("scaling", ["linear", "yarn"])
def test_a_rope_scaled_model_decodes_over_the_cache_as_it_recomputes(scaling):
    from tfkit.models.generation import decode_step

    torch.manual_seed(0)
    model = build_model(tiny_cfg("gpt", positions="rope", rope_scaling=scaling, rope_factor=4.0, init_std=0.2)).eval()
    ids = torch.randint(0, 61, (1, 20), generator=torch.Generator().manual_seed(1))
    cache = model.new_kv_cache(1, 20)
    with torch.inference_mode():
        rows = [model(ids[:, :4], kv_cache=cache)]
        rows += [decode_step(model, ids[:, p:p + 1], torch.tensor(p), cache)[:, None] for p in range(4, 20)]
        torch.testing.assert_close(torch.cat(rows, dim=1), model(ids), atol=1e-5, rtol=1e-5)
