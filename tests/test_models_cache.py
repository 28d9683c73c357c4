"""KV-cache decoding (prefill, then one token at a time) reproduces a full forward, for GPT and the
encoder-decoder's decoder, with every position scheme and head layout; the cache shrinks with kv heads."""

import pytest
import torch

from tfkit.errors import ConfigError
from tfkit.models import build_model, kv_cache_bytes_per_token, sized_config

from model_helpers import tiny_cfg

POSITIONS = ("learned", "sinusoidal", "rope", "alibi")


def decode_in_steps(step, ids, prefill: int, chunk: int = 1):
    """Logits for ids (B, T): `prefill` tokens at once, then `chunk` tokens per call."""
    outputs = [step(ids[:, :prefill], 0)]
    for start in range(prefill, ids.shape[1], chunk):
        outputs.append(step(ids[:, start:start + chunk], start))
    return torch.cat(outputs, dim=1)


@pytest.mark.parametrize("attention", ["flash", "naive"])
@pytest.mark.parametrize("n_kv_heads", [None, 2, 1], ids=["mha", "gqa", "mqa"])
@pytest.mark.parametrize("positions", POSITIONS)
def test_gpt_cached_decoding_matches_full_forward(positions, n_kv_heads, attention):
    model = build_model(tiny_cfg("gpt", positions=positions, n_kv_heads=n_kv_heads, attention=attention)).eval()
    ids = torch.randint(0, 61, (2, 10))
    full = model(ids)
    cache = model.new_kv_cache(batch_size=2, max_len=12)
    stepped = decode_in_steps(lambda x, pos: model(x, kv_cache=cache, start_pos=pos), ids, prefill=4)
    torch.testing.assert_close(stepped, full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("n_kv_heads", [None, 2, 1], ids=["mha", "gqa", "mqa"])
@pytest.mark.parametrize("positions", POSITIONS)
def test_transformer_cached_decoding_matches_full_forward(positions, n_kv_heads):
    model = build_model(tiny_cfg("transformer", positions=positions, n_kv_heads=n_kv_heads)).eval()
    src, tgt = torch.randint(0, 61, (2, 9)), torch.randint(0, 61, (2, 8))
    src_mask = torch.ones(2, 9, dtype=torch.bool)
    src_mask[1, 6:] = False
    full = model(src, tgt, src_mask=src_mask)
    memory = model.encode(src, src_mask)
    cache = model.new_kv_cache(batch_size=2, max_len=8)

    def step(x, pos):
        return model.decode(x, memory, src_mask=src_mask, kv_cache=cache, start_pos=pos)

    stepped = decode_in_steps(step, tgt, prefill=3)
    torch.testing.assert_close(stepped, full, atol=1e-5, rtol=1e-5)


def test_cross_attention_keys_values_are_computed_once():
    model = build_model(tiny_cfg("transformer")).eval()
    src, tgt = torch.randint(0, 61, (1, 5)), torch.randint(0, 61, (1, 3))
    memory = model.encode(src)
    cache = model.new_kv_cache(1, 4)
    model.decode(tgt[:, :1], memory, kv_cache=cache)
    first = [slot.k for slot in cache.cross]
    assert all(k is not None and k.shape == (1, 4, 5, 8) for k in first)
    model.decode(tgt[:, 1:2], memory, kv_cache=cache, start_pos=1)
    assert all(slot.k is k for slot, k in zip(cache.cross, first))  # reused, not recomputed


def test_chunked_prefill_with_padding_mask_matches_full_forward():
    model = build_model(tiny_cfg("gpt", positions="rope", n_kv_heads=2)).eval()
    ids = torch.randint(0, 61, (2, 9))
    mask = torch.ones(2, 9, dtype=torch.bool)
    mask[1, :3] = False  # left padding on the second row
    full = model(ids, attention_mask=mask)
    cache = model.new_kv_cache(2, 9)
    stepped = decode_in_steps(
        lambda x, pos: model(x, attention_mask=mask[:, :pos + x.shape[1]], kv_cache=cache, start_pos=pos),
        ids, prefill=4, chunk=2,
    )
    torch.testing.assert_close(stepped, full, atol=1e-5, rtol=1e-5)


def test_cache_is_static_and_sized_by_kv_heads():
    mha = build_model(tiny_cfg("gpt")).new_kv_cache(2, 16)
    mqa = build_model(tiny_cfg("gpt", n_kv_heads=1)).new_kv_cache(2, 16)
    assert mha.layers[0].k.shape == (2, 4, 16, 8) and mqa.layers[0].k.shape == (2, 1, 16, 8)
    assert mha.nbytes() == 4 * mqa.nbytes()
    assert mha.cross is None


@pytest.mark.parametrize("arch", ["gpt", "transformer"])
def test_kv_cache_bytes_per_token_shrinks_by_head_ratio(arch):
    mha = sized_config(arch, "small")
    gqa = sized_config(arch, "small", n_kv_heads=mha.n_heads // 4)
    mqa = sized_config(arch, "small", n_kv_heads=1)
    assert kv_cache_bytes_per_token(mha) == 4 * kv_cache_bytes_per_token(gqa)
    assert kv_cache_bytes_per_token(mha) == mha.n_heads * kv_cache_bytes_per_token(mqa)


def test_kv_cache_bytes_per_token_gpt2_small():
    cfg = sized_config("gpt", "small")
    assert kv_cache_bytes_per_token(cfg, torch.bfloat16) == 2 * 12 * 12 * 64 * 2  # 36 KiB per token
    assert kv_cache_bytes_per_token(cfg, torch.float32) == 2 * 12 * 12 * 64 * 4
    cache = build_model(tiny_cfg("gpt")).new_kv_cache(1, 10, dtype=torch.bfloat16)
    assert cache.nbytes() == 10 * kv_cache_bytes_per_token(tiny_cfg("gpt"), torch.bfloat16)


def test_decoding_past_the_cache_or_context_is_a_config_error():
    model = build_model(tiny_cfg("gpt")).eval()
    cache = model.new_kv_cache(1, 4)
    with pytest.raises(ConfigError, match="KV cache holds 4"):
        model(torch.zeros(1, 5, dtype=torch.long), kv_cache=cache)
    with pytest.raises(ConfigError, match="max_seq_len"):
        model(torch.zeros(1, 33, dtype=torch.long))
    with pytest.raises(ConfigError, match="max_len"):
        model.new_kv_cache(1, 64)
    with pytest.raises(ValueError, match="kv_cache"):
        model(torch.zeros(1, 2, dtype=torch.long), start_pos=3)
