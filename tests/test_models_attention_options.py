"""The attention options modern recipes use: QK-norm, sliding windows with global layers, RoPE scaling.
Each keeps flash = naive, the KV cache = a full recompute, and is refused where no path honours it."""

import pytest
import torch

from tfkit.errors import ConfigError
from tfkit.models import ModelConfig, build_model
from tfkit.models.hf_export import tfkit_to_hf

from model_helpers import tiny_cfg

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


def test_qk_norm_export_is_refused_in_one_line():
    cfg = ModelConfig(arch="gpt", vocab_size=61, d_model=32, n_layers=1, n_heads=4, positions="rope", norm="rmsnorm",
                      activation="swiglu", qk_norm=True)
    with pytest.raises(ConfigError, match="model.qk_norm=True has no HuggingFace equivalent") as err:
        tfkit_to_hf(cfg, {})
    assert "\n" not in str(err.value)
