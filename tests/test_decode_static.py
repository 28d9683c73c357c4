"""The static decode step: fixed shapes, the position as a tensor, no host read, one compiled graph.

`decode_step` writes the new key/value at a position held in a 0-dim tensor and attends over the whole
preallocated cache under a mask built from the cache's tables, so it must read nothing back from the
device and compile to exactly one graph that decodes the tokens eager decoding does. That it gives the
full-recompute logits is tests/test_models_cache.py's.
"""

from __future__ import annotations

import warnings
from contextlib import contextmanager

import pytest
import torch
import torch._dynamo as dynamo
from torch._dynamo.utils import counters
from torch.utils._python_dispatch import TorchDispatchMode

from tfkit.models import ModelConfig, build_model
from tfkit.models.generation import decode_step, encode_source, generate, prefill

POSITIONS = ("learned", "sinusoidal", "rope", "alibi")
HOST_READS = ("item", "tolist", "numpy", "__bool__", "__int__", "__float__", "__index__")


def tiny(arch: str = "gpt", **overrides) -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = dict(arch=arch, vocab_size=61, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=24,
               init_std=0.2)
    return build_model(ModelConfig(**{**cfg, **overrides})).eval()


class _LocalScalars(TorchDispatchMode):
    """Counts `_local_scalar_dense`, the op behind every read of a device value as a Python number."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += func is torch.ops.aten._local_scalar_dense.default
        return func(*args, **(kwargs or {}))


@contextmanager
def counting_host_reads(monkeypatch):
    """Counts Python-level reads of tensor values (item, tolist, bool(), int(), ...) and dispatched ones."""
    seen = {"python": 0}
    with monkeypatch.context() as patch:
        for name in HOST_READS:
            def counted(self, *args, _original=getattr(torch.Tensor, name), **kwargs):
                seen["python"] += 1
                return _original(self, *args, **kwargs)

            patch.setattr(torch.Tensor, name, counted)
        with _LocalScalars() as dispatched:
            yield seen
    seen["dispatched"] = dispatched.count


def test_the_read_counter_sees_reads(monkeypatch) -> None:
    with counting_host_reads(monkeypatch) as reads:
        torch.tensor(2.0).item(), bool(torch.tensor(True)), torch.ones(2).tolist(), range(torch.tensor(3))
    assert reads["python"] == 4 and reads["dispatched"] >= 2


@pytest.mark.parametrize("arch_positions", [("gpt", p) for p in POSITIONS] + [("transformer", "rope")],
                         ids=lambda ap: "-".join(ap))
def test_static_step_reads_nothing_on_the_host(arch_positions, monkeypatch) -> None:
    arch, positions = arch_positions
    model = tiny(arch, positions=positions)
    memory = src_mask = None
    if arch == "transformer":
        memory, src_mask = encode_source(model, [[5, 6, 7], [8, 9]], pad_id=0)
    cache = model.new_kv_cache(2, 10)
    pos, token = torch.tensor(3), torch.tensor([[4], [7]])
    with torch.inference_mode():
        prefill(model, torch.tensor([[1, 2, 3], [4, 5, 6]]), cache, memory=memory, src_mask=src_mask)
        with counting_host_reads(monkeypatch) as reads:
            logits = decode_step(model, token, pos, cache, memory, src_mask)
    assert logits.shape == (2, 61)
    assert reads == {"python": 0, "dispatched": 0}


def test_generate_reads_the_device_once_per_step_only_when_the_caller_needs_it(monkeypatch) -> None:
    """Without eos_id or on_token the new tokens are read once, at the end; with eos_id once per step."""
    model = tiny(positions="rope")
    with counting_host_reads(monkeypatch) as quiet:
        plain = generate(model, [[1, 2, 3], [4]], 10, temperature=0)
    unused_eos = 60 if all(60 not in row for row in plain) else None
    assert unused_eos is not None  # an id greedy decoding never picks, so no row ends early
    with counting_host_reads(monkeypatch) as stepwise:
        assert generate(model, [[1, 2, 3], [4]], 10, temperature=0, eos_id=unused_eos) == plain
    assert quiet["python"] == 1
    assert stepwise["python"] == 1 + (13 - 1)  # steps: positions 1..12 (the shortest prompt is 1 token)


def test_compile_failure_falls_back_to_eager_with_one_warning(monkeypatch) -> None:
    model = tiny(positions="rope")
    eager = generate(model, [[1, 2, 3]], 8, temperature=0)

    def broken_compile(fn, **kwargs):
        def graph(*args):
            raise RuntimeError("no C++ compiler found\nlong traceback")
        return graph

    monkeypatch.setattr(torch, "compile", broken_compile)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert generate(model, [[1, 2, 3]], 8, temperature=0, compile=True) == eager
    messages = [str(w.message) for w in caught if "torch.compile failed" in str(w.message)]
    assert messages == ["compile: torch.compile failed (RuntimeError: no C++ compiler found); decoding uncompiled"]


@pytest.fixture
def fresh_dynamo():
    dynamo.reset()
    counters.clear()
    yield
    dynamo.reset()


@pytest.mark.slow
@pytest.mark.parametrize("positions, prompts", [("rope", [[3, 14, 15, 9], [26, 5]]), ("learned", [[3, 14, 15, 9]])])
def test_compiled_decode_is_one_graph_and_decodes_like_eager(positions: str, prompts: list[list[int]],
                                                             fresh_dynamo) -> None:
    """Inductor on the CPU: 16 tokens through one graph. error_on_recompile makes a second graph an error
    (which `generate` would turn into its fallback warning) rather than a recompile that a generous
    cache_size_limit would absorb, or an eager fallback past it. One prompt alone takes the one-row
    products of the streaming step, two take its one-query attention only."""
    model = tiny(positions=positions, max_seq_len=32)
    eager = generate(model, prompts, 16, temperature=0)
    with dynamo.config.patch(error_on_recompile=True), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = generate(model, prompts, 16, temperature=0, compile=True)
    assert not [w for w in caught if "torch.compile failed" in str(w.message)]
    assert counters["stats"]["unique_graphs"] == 1
    assert got == eager


@pytest.mark.parametrize("arch", ["gpt", "transformer"])
def test_decode_step_builds_no_graph_after_an_inference_mode_prefill(arch: str) -> None:
    """Called with gradients on (a user's own loop, the fake-CUDA check), the step after `prefill` reads a
    cache filled in inference mode; it must neither keep an autograd graph nor try to save those tensors."""
    model = tiny(arch, n_kv_heads=1)
    ids = torch.randint(0, 61, (2, 5))
    cache = model.new_kv_cache(2, 12)
    memory, src = (encode_source(model, [[3, 4, 5], [6, 7]], pad_id=0) if arch == "transformer" else (None, None))
    logits = prefill(model, ids, cache, memory=memory, src_mask=src)
    for pos in range(5, 8):
        logits = decode_step(model, logits.argmax(-1, keepdim=True), torch.tensor(pos), cache, memory, src)
        assert logits.grad_fn is None and not logits.requires_grad
