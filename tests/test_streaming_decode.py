"""The streaming rewrites of the compiled CPU decode step compute what `F.linear` and SDPA compute, and hand
every case they do not cover back to them unchanged."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from tfkit.models.streaming_decode import StreamingDecode, one_query_attention, row_linear


def randn(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("shape", [(1, 1, 24), (1, 24), (24,)])
@pytest.mark.parametrize("bias", [False, True])
def test_row_linear_equals_linear(shape: tuple[int, ...], bias: bool) -> None:
    x, w, b = randn(*shape), randn(40, 24, seed=1), randn(40, seed=2) if bias else None
    got = row_linear(x, w, b)
    assert got.shape == F.linear(x, w, b).shape
    torch.testing.assert_close(got, F.linear(x, w, b), atol=1e-5, rtol=1e-5)


def test_row_linear_leaves_several_rows_to_linear() -> None:
    x, w = randn(3, 1, 24), randn(40, 24, seed=1)
    assert torch.equal(row_linear(x, w), F.linear(x, w))


def sdpa(q, k, v, mask=None, scale=None):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=k.shape[1] != q.shape[1])


@pytest.mark.parametrize("kv_heads", [8, 2, 1])
@pytest.mark.parametrize("mask", ["none", "bool", "bool per head", "float"])
@pytest.mark.parametrize("scale", [None, 0.3])
def test_one_query_attention_equals_sdpa(kv_heads: int, mask: str, scale: float | None) -> None:
    B, H, S, D = 2, 8, 11, 16
    q, k, v = randn(B, H, 1, D), randn(B, kv_heads, S, D, seed=1), randn(B, kv_heads, S, D, seed=2)
    masks = {
        "none": None,
        "bool": torch.arange(S)[None, None, None, :] < torch.tensor([4, 9])[:, None, None, None],  # (B, 1, 1, S)
        "bool per head": randn(1, H, 1, S, seed=3) > -0.5,  # (1, H, 1, S)
        "float": -torch.arange(S).float().flip(0) * torch.linspace(0.1, 1.0, H)[:, None, None],  # (H, 1, S)
    }
    m = masks[mask]
    torch.testing.assert_close(one_query_attention(q, k, v, m, scale=scale, enable_gqa=kv_heads != H),
                               sdpa(q, k, v, m, scale), atol=1e-5, rtol=1e-5)


def test_one_query_attention_gives_zeros_where_no_key_is_visible() -> None:
    q, k, v = randn(1, 4, 1, 8), randn(1, 4, 5, 8, seed=1), randn(1, 4, 5, 8, seed=2)
    hidden = torch.zeros(1, 1, 1, 5, dtype=torch.bool)
    assert torch.equal(one_query_attention(q, k, v, hidden), torch.zeros(1, 4, 1, 8))


@pytest.mark.parametrize("case", ["several queries", "dropout", "is_causal"])
def test_one_query_attention_leaves_other_calls_to_sdpa(case: str) -> None:
    T = 3 if case == "several queries" else 1
    q, k, v = randn(1, 4, T, 8), randn(1, 4, 5, 8, seed=1), randn(1, 4, 5, 8, seed=2)
    kwargs = {"dropout_p": 0.5} if case == "dropout" else {"is_causal": True} if case == "is_causal" else {}
    torch.manual_seed(0)
    want = F.scaled_dot_product_attention(q, k, v, **kwargs)
    torch.manual_seed(0)
    assert torch.equal(one_query_attention(q, k, v, **kwargs), want)


class _AtenOps(TorchDispatchMode):
    """The names of the aten ops that run."""

    def __init__(self) -> None:
        super().__init__()
        self.names: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.add(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def test_the_mode_takes_one_row_products_and_one_query_attention_off_blas_and_sdpa() -> None:
    w, k = randn(40, 24, seed=1), randn(1, 2, 5, 8, seed=2)
    with StreamingDecode(), _AtenOps() as one:
        F.linear(randn(1, 1, 24), w)
        F.scaled_dot_product_attention(randn(1, 2, 1, 8), k, k)
    with StreamingDecode(), _AtenOps() as several:
        F.linear(randn(3, 1, 24), w)
        F.scaled_dot_product_attention(randn(1, 2, 3, 8), k, k)
    assert not {name for name in one.names if "mm" in name or "scaled_dot_product" in name}
    assert {"mm", "_scaled_dot_product_flash_attention_for_cpu"} <= several.names


def test_bf16_keeps_the_dtype_and_agrees_to_bf16_precision() -> None:
    """A model cast to bf16 (`generate --dtype bf16`) gets bf16 out, with softmax and the weighted sum of
    the values in fp32."""
    x, w = randn(1, 1, 64).bfloat16(), (randn(48, 64, seed=1) / 8).bfloat16()
    assert row_linear(x, w).dtype == torch.bfloat16
    torch.testing.assert_close(row_linear(x, w).float(), F.linear(x.float(), w.float()), atol=0.03, rtol=0.02)
    q, k, v = randn(1, 8, 1, 16, seed=2).bfloat16(), randn(1, 2, 20, 16, seed=3).bfloat16(), randn(1, 2, 20, 16, seed=4).bfloat16()
    got = one_query_attention(q, k, v, enable_gqa=True)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), sdpa(q.float(), k.float(), v.float()), atol=0.02, rtol=0.02)
