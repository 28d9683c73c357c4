"""`regroup_kv_heads`: MHA <-> GQA <-> MQA as a pure state-dict function, checked against the models' outputs."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tfkit.errors import CheckpointError, ConfigError
from tfkit.models import ModelConfig, build_model
from tfkit.models.convert import attention_params, pool_heads, regroup_kv_heads

ARCHS = ("gpt", "bert", "transformer")


def config(arch: str, n_heads: int = 8, kv: int | None = None, **kw) -> ModelConfig:
    values = dict(arch=arch, vocab_size=61, d_model=32, n_layers=2, n_heads=n_heads, n_kv_heads=kv,
                  max_seq_len=32, dropout=0.0)
    return ModelConfig(**{**values, **kw})


def model_of(cfg: ModelConfig, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = build_model(cfg).eval()
    with torch.no_grad():  # non-zero biases, so a bias regrouped wrongly changes the output
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.normal_(0.0, 0.1)
    return model


def logits(model: torch.nn.Module) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, model.config.vocab_size, (2, 9), generator=g)  # (B, T)
    mask = torch.ones(2, 9, dtype=torch.bool)
    mask[1, 6:] = False  # padding exercises the masked kernels too
    with torch.no_grad():
        if model.config.arch == "transformer":
            tgt = torch.randint(0, model.config.vocab_size, (2, 7), generator=g)
            return model(ids, tgt, src_mask=mask)  # (B, T_tgt, V): encoder, decoder self and cross-attention
        if model.config.arch == "bert":
            return model(ids, attention_mask=mask)
        return model(ids)


def converted(model: torch.nn.Module, kv: int, method: str = "mean", **kw) -> torch.nn.Module:
    sd, cfg = regroup_kv_heads(model.state_dict(), model.config, kv, method, **kw)
    new = build_model(cfg).eval()
    new.load_state_dict(sd, strict=True)
    return new


@pytest.mark.parametrize("arch", ARCHS)
def test_mha_to_as_many_groups_as_heads_is_the_identity(arch):
    model = model_of(config(arch))
    sd, cfg = regroup_kv_heads(model.state_dict(), model.config, 8, "mean")
    assert cfg == model.config
    assert sd.keys() == model.state_dict().keys()
    assert all(torch.equal(sd[k], v) for k, v in model.state_dict().items())


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("old,new", [(1, 8), (2, 4)])
def test_growing_the_head_count_replicates_and_computes_the_same_function(arch, bias, old, new):
    model = model_of(config(arch, kv=old, bias=bias, positions="rope" if old == 2 else "learned"))
    grown = converted(model, new)
    assert grown.config.kv_heads == new
    torch.testing.assert_close(logits(grown), logits(model), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("arch", ARCHS)
def test_naive_attention_after_replication_computes_the_same_function(arch):
    model = model_of(config(arch, kv=1, attention="naive"))  # the explicit repeat_interleave path
    torch.testing.assert_close(logits(converted(model, 8)), logits(model), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("arch", ARCHS)
def test_pooling_groups_of_equal_heads_keeps_the_function(arch):
    """Heads within each group made identical (by replication) and pooled back: only the grouping of
    consecutive heads that attention.py uses (query h -> KV h // group) can give the same logits."""
    gqa = model_of(config(arch, kv=2))
    mha = converted(gqa, 8)
    for method in ("mean", "first"):
        torch.testing.assert_close(logits(converted(mha, 2, method)), logits(gqa), rtol=1e-5, atol=1e-5)


def test_mean_is_the_average_of_each_group_of_consecutive_heads():
    model = model_of(config("transformer"))
    sd = model.state_dict()
    new, cfg = regroup_kv_heads(sd, model.config, 2, "mean")
    D = model.config.head_dim
    for key in ("decoder.1.cross_attn.k_proj.weight", "encoder.0.attn.v_proj.bias", "decoder.0.attn.k_proj.weight"):
        heads = sd[key].reshape(8, D, -1)  # (H, D, C) or (H, D, 1)
        expected = torch.cat([(heads[0] + heads[1] + heads[2] + heads[3]) / 4,
                              (heads[4] + heads[5] + heads[6] + heads[7]) / 4]).reshape(2 * D, *sd[key].shape[1:])
        torch.testing.assert_close(new[key], expected)
    assert cfg.n_kv_heads == 2 and new["decoder.1.cross_attn.k_proj.weight"].shape == (2 * D, 32)


def test_first_keeps_the_first_head_of_each_group():
    model = model_of(config("gpt"))
    sd = model.state_dict()
    new, _ = regroup_kv_heads(sd, model.config, 4, "first")
    D = model.config.head_dim
    for key in ("blocks.0.attn.k_proj.weight", "blocks.1.attn.v_proj.bias"):
        heads = sd[key].reshape(8, D, -1)
        expected = torch.cat([heads[0], heads[2], heads[4], heads[6]]).reshape(4 * D, *sd[key].shape[1:])
        assert torch.equal(new[key], expected)


def test_mqa_is_the_mean_of_all_heads_and_shrinks_the_attention():
    model = model_of(config("gpt"))
    mqa = converted(model, 1)
    w = model.state_dict()["blocks.0.attn.k_proj.weight"]  # (8*D, C)
    torch.testing.assert_close(mqa.state_dict()["blocks.0.attn.k_proj.weight"], w.reshape(8, -1, 32).mean(0))
    D, C, L = 4, 32, 2
    assert attention_params(model) - attention_params(mqa) == L * 2 * (8 - 1) * D * (C + 1)  # K and V, weight+bias


def test_random_reinitialises_with_the_model_init_and_is_seeded():
    model = model_of(config("gpt", init_std=0.05))
    state = torch.get_rng_state()
    a, _ = regroup_kv_heads(model.state_dict(), model.config, 2, "random", generator=torch.Generator().manual_seed(3))
    b, _ = regroup_kv_heads(model.state_dict(), model.config, 2, "random", generator=torch.Generator().manual_seed(3))
    c, _ = regroup_kv_heads(model.state_dict(), model.config, 2, "random", generator=torch.Generator().manual_seed(4))
    assert torch.equal(torch.get_rng_state(), state)  # the global RNG is left alone
    key = "blocks.0.attn.k_proj.weight"
    assert torch.equal(a[key], b[key]) and not torch.equal(a[key], c[key])
    assert not torch.equal(a[key], a["blocks.0.attn.v_proj.weight"])  # every tensor drawn afresh
    assert abs(float(a[key].std()) - 0.05) < 0.01  # the model's N(0, init_std)
    assert torch.equal(a["blocks.0.attn.k_proj.bias"], torch.zeros(8))  # biases start at zero
    pooled, _ = regroup_kv_heads(model.state_dict(), model.config, 2, "mean")
    assert not torch.allclose(a[key], pooled[key])


@pytest.mark.parametrize("arch", ARCHS)
def test_round_trips_keep_shapes_and_replicate_then_pool_is_exact(arch):
    model = model_of(config(arch))
    sd = model.state_dict()
    mqa, mqa_cfg = regroup_kv_heads(sd, model.config, 1, "mean")
    back, back_cfg = regroup_kv_heads(mqa, mqa_cfg, 8, "mean")
    assert back_cfg == model.config
    assert {k: v.shape for k, v in back.items()} == {k: v.shape for k, v in sd.items()}
    again, again_cfg = regroup_kv_heads(back, back_cfg, 1, "first")
    assert again_cfg == mqa_cfg and all(torch.equal(again[k], mqa[k]) for k in mqa)


def test_inputs_are_never_mutated():
    model = model_of(config("transformer", kv=2))
    sd = model.state_dict()
    before = {k: v.clone() for k, v in sd.items()}
    cfg_before = dataclasses.replace(model.config)
    for kv, method in ((1, "mean"), (4, "first"), (8, "mean"), (1, "random")):
        out, _ = regroup_kv_heads(sd, model.config, kv, method)
        for key in out:  # the new K/V tensors are never views of the input's storage
            if key.endswith(("k_proj.weight", "v_proj.bias")) and kv != 2:
                assert out[key].untyped_storage().data_ptr() != sd[key].untyped_storage().data_ptr()
    assert model.config == cfg_before
    assert sd.keys() == before.keys() and all(torch.equal(sd[k], before[k]) for k in before)


@pytest.mark.parametrize("n_heads,old,new,needle", [
    (8, None, 3, "new_kv_heads 3: the model's 8 query heads cannot be split into 3"),
    (12, 4, 6, "new_kv_heads 6: cannot regroup 4 key/value heads into 6"),
    (12, 6, 4, "new_kv_heads 4: cannot regroup 6 key/value heads into 4"),
    (8, None, 0, "new_kv_heads: got 0"),
])
def test_impossible_groupings_are_config_errors_naming_the_parameter(n_heads, old, new, needle):
    """The library names its parameter; `tfkit convert-mqa-to-gqa` says --kv-heads (test_convert_cli)."""
    cfg = config("gpt", n_heads=n_heads, kv=old, d_model=48)
    with pytest.raises(ConfigError, match="^" + needle):
        regroup_kv_heads(build_model(cfg).state_dict(), cfg, new)


def test_unknown_method_and_mismatched_weights_are_errors():
    cfg = config("gpt")
    sd = build_model(cfg).state_dict()
    with pytest.raises(ConfigError, match="^method: got 'max'"):
        regroup_kv_heads(sd, cfg, 2, "max")
    with pytest.raises(CheckpointError, match=r"shape of blocks\.0\.attn\.k_proj"):
        regroup_kv_heads(sd, dataclasses.replace(cfg, n_kv_heads=2), 1)  # weights are MHA, config says GQA-2
    with pytest.raises(CheckpointError, match="missing keys"):
        regroup_kv_heads({k: v for k, v in sd.items() if k != "blocks.1.attn.v_proj.bias"}, cfg, 2)
    with pytest.raises(CheckpointError, match="in 2 attention blocks, expected 6"):
        regroup_kv_heads(sd, dataclasses.replace(cfg, arch="transformer"), 2)


def test_pool_heads_works_on_bf16_and_keeps_the_dtype():
    w = torch.arange(8 * 2 * 3, dtype=torch.bfloat16).reshape(16, 3)  # 8 heads of D=2 over C=3
    out = pool_heads(w, 8, 2, "mean")
    assert out.dtype == torch.bfloat16 and out.shape == (4, 3)
    assert torch.equal(out[0], w.reshape(8, 2, 3)[:4, 0].float().mean(0).bfloat16())
