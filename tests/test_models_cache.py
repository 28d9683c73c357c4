"""Decoding over the KV cache reproduces a full recompute: one suite for every way the cache is read.

The prefill writes the prompt's keys/values at position 0, then tokens follow at positions held in a 0-dim
tensor (the one write mode, gpt-fast's): one per `decode_step`, several per forward (a chunk), or one per
step as the compiled CPU path traces it (`StreamingDecode`: one-row products and one-query attention as
reductions). Each must give the full forward's logits for GPT and the encoder-decoder's decoder, every
position scheme, MHA/GQA/MQA and both attention paths, over a cache longer than needed (slots never
written must stay hidden); greedy `generate` must pick the recomputed tokens. Also: the cache is static,
sized by the kv heads, and refuses what it cannot hold.
"""

from __future__ import annotations

from contextlib import nullcontext

import pytest
import torch

from tfkit.errors import ConfigError
from tfkit.models import ModelConfig, build_model, kv_cache_bytes_per_token, sized_config
from tfkit.models.generation import decode_step, generate, prefill
from tfkit.models.streaming_decode import StreamingDecode

from helpers import tiny_cfg

POSITIONS = ("learned", "sinusoidal", "rope", "alibi")
HEADS = {"mha": 4, "gqa": 2, "mqa": 1}
MODES = ("steps", "chunks", "streaming")


def tiny(arch: str = "gpt", **overrides) -> torch.nn.Module:
    """init_std 0.2: random logits far from uniform, so greedy never meets a near-tie that a 1e-7
    difference between the cached and the recomputed path could flip."""
    torch.manual_seed(0)
    cfg = dict(arch=arch, vocab_size=61, d_model=32, n_layers=2, n_heads=4, max_seq_len=24, init_std=0.2)
    return build_model(ModelConfig(**{**cfg, **overrides})).eval()


def cached_logits(model, ids: torch.Tensor, prefilled: int, mode: str, memory=None, src_mask=None) -> torch.Tensor:
    """Logits (B, T, V) of ids (B, T): `prefilled` tokens by prefill, the rest one `decode_step` each
    (`steps`, `streaming`) or two per forward (`chunks`), over a cache two slots longer than needed."""
    cache = model.new_kv_cache(ids.shape[0], ids.shape[1] + 2)
    kwargs = dict(memory=memory, src_mask=src_mask) if memory is not None else {}
    forward = model.decode if memory is not None else model
    rows = []
    with torch.inference_mode():
        rows.append(forward(ids[:, :prefilled], **kwargs, kv_cache=cache))  # (B, P, V)
        if mode == "chunks":
            for p in range(prefilled, ids.shape[1], 2):
                rows.append(forward(ids[:, p:p + 2], **kwargs, kv_cache=cache, start_pos=torch.tensor(p)))
        else:
            with StreamingDecode() if mode == "streaming" else nullcontext():
                steps = [decode_step(model, ids[:, p:p + 1], torch.tensor(p), cache, memory, src_mask)  # (B, V)
                         for p in range(prefilled, ids.shape[1])]
            rows.append(torch.stack(steps, dim=1))
    return torch.cat(rows, dim=1)  # (B, T, V)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("attention", ["flash", "naive"])
@pytest.mark.parametrize("heads", HEADS)
@pytest.mark.parametrize("positions", POSITIONS)
def test_gpt_cache_equals_full_recompute(positions: str, heads: str, attention: str, mode: str) -> None:
    model = tiny(positions=positions, n_kv_heads=HEADS[heads], attention=attention, bias=True)
    ids = torch.randint(0, 61, (2, 11), generator=torch.Generator().manual_seed(1))  # (B, T)
    with torch.no_grad():
        full = model(ids)  # (B, T, V)
    torch.testing.assert_close(cached_logits(model, ids, 3, mode), full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("batch", [1, 2])
def test_streaming_step_at_batch_one_rewrites_the_products_too(batch: int) -> None:
    """At batch 1 the streaming step also rewrites every one-row product (at 2 only the attention)."""
    model = tiny(positions="rope", n_kv_heads=2, bias=True)
    ids = torch.randint(0, 61, (batch, 12), generator=torch.Generator().manual_seed(1))  # (B, T)
    with torch.no_grad():
        full = model(ids)  # (B, T, V)
    torch.testing.assert_close(cached_logits(model, ids, 3, "streaming"), full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("heads", HEADS)
@pytest.mark.parametrize("positions", POSITIONS)
def test_transformer_decoder_cache_equals_full_recompute(positions: str, heads: str, mode: str) -> None:
    model = tiny("transformer", positions=positions, n_kv_heads=HEADS[heads])
    src, tgt = torch.randint(0, 61, (2, 9)), torch.randint(0, 61, (2, 10))
    src_mask = torch.ones(2, 9, dtype=torch.bool)
    src_mask[1, 5:] = False  # a shorter second source: cross-attention must keep ignoring its padding
    with torch.no_grad():
        full = model(src, tgt, src_mask=src_mask)  # (B, T, V)
        memory = model.encode(src, src_mask)  # (B, S, C)
    got = cached_logits(model, tgt, 1, mode, memory=memory, src_mask=src_mask)
    torch.testing.assert_close(got, full, atol=1e-5, rtol=1e-5)


def recompute_greedy(model, prompt: list[int], steps: int, src: list[int] | None = None) -> list[int]:
    """Reference without a cache: the whole sequence again for every new token."""
    seq = list(prompt)
    with torch.no_grad():
        for _ in range(steps):
            if src is None:
                last = model(torch.tensor([seq]))[0, -1]  # (V,)
            else:
                last = model(torch.tensor([src]), torch.tensor([seq]))[0, -1]  # (V,)
            seq.append(int(last.argmax()))
    return seq[len(prompt):]


@pytest.mark.parametrize("heads", HEADS)
@pytest.mark.parametrize("positions", POSITIONS)
def test_greedy_generate_picks_the_recomputed_tokens(positions: str, heads: str) -> None:
    gpt = tiny(positions=positions, n_kv_heads=HEADS[heads])
    prompt = [3, 14, 15, 9, 26, 5]
    assert generate(gpt, [prompt], 12, temperature=0) == [recompute_greedy(gpt, prompt, 12)]
    seq2seq = tiny("transformer", positions=positions, n_kv_heads=HEADS[heads])
    src = [7, 8, 9, 10, 11, 12]
    assert generate(seq2seq, [[1]], 10, temperature=0, source_ids=[src]) == [recompute_greedy(seq2seq, [1], 10, src)]


def test_cross_attention_keys_values_are_computed_once() -> None:
    model = build_model(tiny_cfg("transformer")).eval()
    src, tgt = torch.randint(0, 61, (1, 5)), torch.randint(0, 61, (1, 3))
    cache = model.new_kv_cache(1, 4)
    with torch.inference_mode():
        memory = model.encode(src)
        prefill(model, tgt[:, :1], cache, memory=memory)
        first = [slot.k for slot in cache.cross]
        assert all(k is not None and k.shape == (1, 4, 5, 8) for k in first)
        decode_step(model, tgt[:, 1:2], torch.tensor(1), cache, memory)
    assert all(slot.k is k for slot, k in zip(cache.cross, first))  # reused, not recomputed


def test_cache_is_static_and_sized_by_kv_heads() -> None:
    mha = build_model(tiny_cfg("gpt")).new_kv_cache(2, 16)
    mqa = build_model(tiny_cfg("gpt", n_kv_heads=1)).new_kv_cache(2, 16)
    assert mha.layers[0].k.shape == (2, 4, 16, 8) and mqa.layers[0].k.shape == (2, 1, 16, 8)
    assert mha.nbytes() == 4 * mqa.nbytes()
    assert mha.cross is None


@pytest.mark.parametrize("arch", ["gpt", "transformer"])
def test_kv_cache_bytes_per_token_shrinks_by_head_ratio(arch: str) -> None:
    mha = sized_config(arch, "small")
    gqa = sized_config(arch, "small", n_kv_heads=mha.n_heads // 4)
    mqa = sized_config(arch, "small", n_kv_heads=1)
    assert kv_cache_bytes_per_token(mha) == 4 * kv_cache_bytes_per_token(gqa)
    assert kv_cache_bytes_per_token(mha) == mha.n_heads * kv_cache_bytes_per_token(mqa)


def test_kv_cache_bytes_per_token_gpt2_small() -> None:
    cfg = sized_config("gpt", "small")
    assert kv_cache_bytes_per_token(cfg, torch.bfloat16) == 2 * 12 * 12 * 64 * 2  # 36 KiB per token
    assert kv_cache_bytes_per_token(cfg, torch.float32) == 2 * 12 * 12 * 64 * 4
    cache = build_model(tiny_cfg("gpt")).new_kv_cache(1, 10, dtype=torch.bfloat16)
    assert cache.nbytes() == 10 * kv_cache_bytes_per_token(tiny_cfg("gpt"), torch.bfloat16)


def test_what_the_cache_cannot_hold_is_refused() -> None:
    model = build_model(tiny_cfg("gpt")).eval()
    cache = model.new_kv_cache(1, 4)
    with pytest.raises(ConfigError, match="KV cache holds 4"):
        model(torch.zeros(1, 5, dtype=torch.long), kv_cache=cache)
    with pytest.raises(ConfigError, match="max_seq_len"):
        model(torch.zeros(1, 33, dtype=torch.long))
    with pytest.raises(ConfigError, match="max_len"):
        model.new_kv_cache(1, 64)
    with pytest.raises(ValueError, match="kv_cache"):
        model(torch.zeros(1, 2, dtype=torch.long), start_pos=torch.tensor(3))
    with pytest.raises(ValueError, match="attention_mask"):
        model(torch.zeros(1, 2, dtype=torch.long), attention_mask=torch.ones(1, 2, dtype=torch.bool), kv_cache=cache)
