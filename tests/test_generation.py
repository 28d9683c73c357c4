"""Decoding: batching is invisible, sampling is seeded (the cache equals a full recompute: test_models_cache.py).

Every model is tiny and random (no training): the properties tested hold for any weights.
"""

from __future__ import annotations

import pytest
import torch

from tfkit.errors import ConfigError
from tfkit.models import ModelConfig, build_model
from tfkit.models.generation import generate, logits_to_probs, sample

VOCAB = 61


def tiny(arch: str = "gpt", **overrides) -> torch.nn.Module:
    torch.manual_seed(0)
    # init_std 0.2: random logits far from uniform, so greedy ties (which could flip between the
    # cached and the recomputed path on a 1e-7 difference) do not happen.
    cfg = dict(arch=arch, vocab_size=VOCAB, d_model=32, n_layers=2, n_heads=4, max_seq_len=40, init_std=0.2)
    cfg.update(overrides)
    return build_model(ModelConfig(**cfg)).eval()


@pytest.mark.parametrize("positions", ["learned", "rope", "alibi"])
def test_batch_of_different_lengths_equals_each_prompt_alone(positions: str) -> None:
    model = tiny(positions=positions, n_kv_heads=2)
    prompts = [[5, 6, 7, 8, 9, 10, 11], [12], [13, 14, 15]]
    batched = generate(model, prompts, 9, temperature=0)
    assert batched == [generate(model, [p], 9, temperature=0)[0] for p in prompts]
    assert all(len(out) == 9 for out in batched)


def test_seq2seq_batch_of_different_source_lengths_equals_each_alone() -> None:
    model = tiny("transformer", n_kv_heads=2)
    sources = [[20, 21, 22, 23, 24, 25], [30, 31]]
    batched = generate(model, [[1], [1]], 8, temperature=0, source_ids=sources)
    assert batched == [generate(model, [[1]], 8, temperature=0, source_ids=[s])[0] for s in sources]


def test_greedy_is_deterministic_and_ignores_seed() -> None:
    model = tiny()
    first = generate(model, [[1, 2, 3]], 15, temperature=0, seed=1)
    assert first == generate(model, [[1, 2, 3]], 15, temperature=0, seed=2)
    assert first == generate(model, [[1, 2, 3]], 15, temperature=0)


def test_same_seed_same_sample_different_seed_differs() -> None:
    model = tiny(init_std=0.02)  # near-uniform next-token distributions: samples vary a lot
    prompts = [[1, 2, 3], [4]]
    a = generate(model, prompts, 20, temperature=1.0, seed=123)
    assert a == generate(model, prompts, 20, temperature=1.0, seed=123)
    assert a != generate(model, prompts, 20, temperature=1.0, seed=124)


def test_top_k_one_equals_greedy() -> None:
    model = tiny(init_std=0.02)
    greedy = generate(model, [[1, 2, 3]], 15, temperature=0)
    assert generate(model, [[1, 2, 3]], 15, temperature=1.3, top_k=1, seed=5) == greedy


def test_logits_to_probs_top_k_and_temperature() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0]])
    probs = logits_to_probs(logits, temperature=1.0, top_k=2)
    torch.testing.assert_close(probs, torch.tensor([[torch.e / (torch.e + 1), 1 / (torch.e + 1), 0.0, 0.0]]))
    hot = logits_to_probs(logits, temperature=0.0)
    assert hot.tolist() == [[1.0, 0.0, 0.0, 0.0]]
    flat = logits_to_probs(logits, temperature=1e6)
    torch.testing.assert_close(flat, torch.full((1, 4), 0.25), atol=1e-5, rtol=0)
    assert logits_to_probs(logits, temperature=1e-40).tolist() == hot.tolist()  # the greedy limit, not NaN


def test_a_tiny_temperature_samples_the_argmax() -> None:
    model = tiny(init_std=0.02)
    greedy = generate(model, [[1, 2, 3]], 10, temperature=0)
    assert generate(model, [[1, 2, 3]], 10, temperature=1e-40, seed=1) == greedy


@pytest.mark.parametrize(("top_p", "kept"), [(0.3, 1), (0.75, 2), (0.85, 3), (0.97, 4), (1.0, 4)])
def test_top_p_keeps_smallest_set_reaching_p(top_p: float, kept: int) -> None:
    base = torch.tensor([0.15, 0.5, 0.05, 0.3])  # sorted: 0.5, 0.3, 0.15, 0.05
    probs = logits_to_probs(base.log()[None], temperature=1.0, top_p=top_p)[0]
    order = torch.argsort(base, descending=True)
    assert (probs[order[:kept]] > 0).all() and (probs[order[kept:]] == 0).all()
    torch.testing.assert_close(probs[order[:kept]], base[order[:kept]] / base[order[:kept]].sum())


def test_sample_is_reproducible_with_a_generator() -> None:
    probs = torch.full((4, 10), 0.1)
    draw = lambda seed: sample(probs, torch.Generator().manual_seed(seed)).tolist()  # noqa: E731
    assert draw(0) == draw(0)
    assert sample(torch.tensor([[0.0, 0.0, 1.0]])).tolist() == [2]


def test_eos_stops_only_its_row() -> None:
    model = tiny()
    prompts = [[1, 2, 3], [40, 41]]
    free = generate(model, prompts, 12, temperature=0)
    eos = free[0][3]
    cut = lambda out: out[: out.index(eos)] if eos in out else out  # noqa: E731
    stopped = generate(model, prompts, 12, temperature=0, eos_id=eos)
    assert stopped == [cut(free[0]), cut(free[1])]
    assert len(stopped[0]) <= 3


def test_on_token_streams_every_new_token_in_order() -> None:
    model = tiny()
    seen: list[tuple[int, int]] = []
    out = generate(model, [[1, 2], [3, 4, 5, 6]], 5, temperature=0, on_token=lambda r, t: seen.append((r, t)))
    assert [t for r, t in seen if r == 0] == out[0]
    assert [t for r, t in seen if r == 1] == out[1]


def test_generation_stops_at_max_seq_len() -> None:
    model = tiny(max_seq_len=16)
    out = generate(model, [list(range(1, 13)), [1]], 10, temperature=0)
    assert len(out[0]) == 4 and len(out[1]) == 10
    assert generate(model, [list(range(16))], 5, temperature=0) == [[]]


def test_bad_inputs_name_the_parameter() -> None:
    """The library names its own parameters; `tfkit generate` spells them as flags (test_generation_cli)."""
    model = tiny(max_seq_len=16)
    with pytest.raises(ConfigError, match="^prompt_ids: "):
        generate(model, [list(range(17))], 3)
    with pytest.raises(ConfigError, match="^prompt_ids: "):
        generate(model, [[]], 3)
    with pytest.raises(ConfigError, match="^temperature must be >= 0"):
        generate(model, [[1]], 3, temperature=-1)
    with pytest.raises(ConfigError, match=r"^top_p must be in \(0, 1\]"):
        generate(model, [[1]], 3, top_p=0)
    with pytest.raises(ConfigError, match="^top_k must be >= 1"):
        generate(model, [[1]], 3, top_k=0)
    with pytest.raises(ConfigError, match="use fill_mask"):
        generate(tiny("bert"), [[1]], 3)


def test_greedy_equals_huggingface_generate_on_the_same_weights() -> None:
    """An independent reference: tfkit's export rules map this shape to Llama; HF's own decoding loop and
    cache must pick the same tokens."""
    transformers = pytest.importorskip("transformers")
    from tfkit.checkpoints.hf_state import tfkit_to_hf

    model = tiny(positions="rope", norm="rmsnorm", activation="swiglu", bias=False, n_kv_heads=2)
    config, state = tfkit_to_hf(model.config, model.state_dict())
    config = {k: v for k, v in config.items() if k != "architectures"}
    hf = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**config)).eval()
    hf.load_state_dict(state, strict=False)  # the tied head is the embedding
    prompts = [[3, 14, 15, 9, 26, 5], [7, 8, 9, 10, 11, 12]]
    with torch.no_grad():
        ref = hf.generate(torch.tensor(prompts), attention_mask=torch.ones(2, 6, dtype=torch.long), do_sample=False,
                          max_new_tokens=12, min_new_tokens=12, pad_token_id=0)
    assert generate(model, prompts, 12, temperature=0) == ref[:, 6:].tolist()
