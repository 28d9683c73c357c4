"""The flex_attention block mask of document and window masks (models/flex.py), checked on the CPU.

The block tables are built from each block's document-id range instead of by `create_block_mask`, so
PyTorch's own `create_block_mask`, which evaluates the rule on every (q, k) pair, is the oracle: the same
key blocks to skip, to run under the rule, and to run whole, for every shape, including lengths that 128
does not divide. A whole block wrongly called whole would run without the rule, so both tables must match.
"""

import itertools

import pytest
import torch

flex = pytest.importorskip("torch.nn.attention.flex_attention")
from tfkit.models import flex as tfkit_flex  # noqa: E402
from tfkit.models.flex import flex_block_mask  # noqa: E402


def dense(num: torch.Tensor, indices: torch.Tensor, n: int) -> torch.Tensor:
    """A BlockMask table (B, 1, n) counts + (B, 1, n, n) indices as a bool (B, n, n) of the listed blocks."""
    listed = torch.arange(n)[None, None, None, :] < num[..., None]  # (B, 1, n, n): the first num[...] indices
    table = torch.zeros(num.shape[0], 1, n, n, dtype=torch.bool)
    table.scatter_(-1, indices.long(), listed)  # scatter of False onto unlisted slots leaves them False
    return table[:, 0]


def rule(doc_ids, length: int, causal: bool, window):
    """The mask rule as create_block_mask evaluates it (padded indices clamped into the row)."""

    def allowed(b, h, q, k):
        keep = (q - k).abs() < window if window is not None else q >= 0
        if doc_ids is not None:
            keep = keep & (doc_ids[b, q.clamp(max=length - 1)] == doc_ids[b, k.clamp(max=length - 1)])
        return keep & (k <= q) if causal else keep

    return allowed


CASES = list(itertools.product([1, 100, 128, 300, 640], [True, False], [None, 1, 200], [None, 0.01, 0.3]))


@pytest.mark.parametrize("length,causal,window,doc_rate", CASES)
def test_block_tables_equal_create_block_masks(length, causal, window, doc_rate):
    torch.manual_seed(length)
    doc_ids = None if doc_rate is None else (torch.rand(3, length) < doc_rate).cumsum(1)  # (B, T)
    mine = flex_block_mask(length, doc_ids, causal=causal, window=window, device=torch.device("cpu"))
    oracle = flex.create_block_mask(rule(doc_ids, length, causal, window), None if doc_ids is None else 3, None,
                                    length, length, device="cpu")
    n = -(-length // 128)
    assert torch.equal(dense(mine.kv_num_blocks, mine.kv_indices, n),
                       dense(oracle.kv_num_blocks, oracle.kv_indices, n))
    assert torch.equal(dense(mine.full_kv_num_blocks, mine.full_kv_indices, n),
                       dense(oracle.full_kv_num_blocks, oracle.full_kv_indices, n))
    assert mine.seq_lengths == (length, length)


def test_unordered_document_ids_never_lose_a_block():
    """Ids that are not increasing along the row (a caller's own numbering): every block holding a pair of
    equal ids is still visited, so the rule decides, and no block of mixed documents is run whole."""
    doc_ids = torch.tensor([[0] * 100 + [1] * 100 + [0] * 100 + [2] * 84])  # (1, 384)
    mine = flex_block_mask(384, doc_ids, causal=False, window=None, device=torch.device("cpu"))
    visited = dense(mine.kv_num_blocks, mine.kv_indices, 3) | dense(mine.full_kv_num_blocks, mine.full_kv_indices, 3)
    oracle = flex.create_block_mask(rule(doc_ids, 384, False, None), 1, None, 384, 384, device="cpu")
    needed = dense(oracle.kv_num_blocks, oracle.kv_indices, 3) | dense(oracle.full_kv_num_blocks,
                                                                       oracle.full_kv_indices, 3)
    assert (visited | ~needed).all()
    assert not dense(mine.full_kv_num_blocks, mine.full_kv_indices, 3).any()  # every block mixes documents


def test_a_compiled_forward_gets_the_tables_built_eagerly(monkeypatch):
    """Inside a compiled forward the block mask is built outside the graph (traced, it gave wrong attention
    on an H200) and reaches the code after it with the same tables as an eager call. Each call of the
    compiled function gets its own ids' tables, not the first call's."""
    def tables(ids):
        mask = flex_block_mask(ids.shape[1], ids, causal=True, window=None, device=ids.device)
        return mask.kv_num_blocks * 1, mask.kv_indices * 1, mask.full_kv_num_blocks * 1, mask.full_kv_indices * 1

    traced = []
    classify = tfkit_flex.block_classes
    monkeypatch.setattr(tfkit_flex, "block_classes",
                        lambda *a, **k: traced.append(torch.compiler.is_compiling()) or classify(*a, **k))
    compiled = torch.compile(tables, backend="eager")
    generator = torch.Generator().manual_seed(0)
    for rate in (0.02, 0.002):
        doc_ids = (torch.rand(2, 300, generator=generator) < rate).cumsum(1)  # (B, T)
        for got, expected in zip(compiled(doc_ids), tables(doc_ids)):
            assert torch.equal(got, expected)
    assert traced == [False] * 4  # two compiled calls and two eager ones, none of them traced


@pytest.mark.slow
def test_compiled_flex_attention_under_the_block_mask_equals_dense_sdpa():
    """The block mask as the compiled kernel reads it (blocks skipped, whole, or under the rule): the same
    attention as SDPA with the dense (B, 1, T, T) mask, at a length 128 does not divide."""
    torch.manual_seed(0)
    B, H, T, D = 2, 2, 300, 16
    doc_ids = (torch.rand(B, T) < 0.01).cumsum(1)  # (B, T)
    q, k, v = (torch.randn(B, H, T, D) for _ in range(3))  # (B, H, T, D)
    mask = flex_block_mask(T, doc_ids, causal=True, window=None, device=torch.device("cpu"))
    got = torch.compile(flex.flex_attention)(q, k, v, block_mask=mask)  # (B, H, T, D)
    pos = torch.arange(T)
    dense_mask = (doc_ids[:, None, :, None] == doc_ids[:, None, None, :]) & (pos[None, :] <= pos[:, None])
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=dense_mask)  # (B, H, T, D)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
