"""Document-masked attention (`data.document_mask`): a packed row computes exactly what running each of its
documents alone computes, forward and backward, for every position encoding, MHA/GQA/MQA, flash and naive."""

import pytest
import torch

from tfkit.models import build_model
from tfkit.models.attention import self_attention_mask
from tfkit.tokenization.packing import restarted_positions

from helpers import tiny_cfg

POSITIONS = ("learned", "sinusoidal", "rope", "alibi", "none")
KV_HEADS = {"mha": None, "gqa": 2, "mqa": 1}
LENGTHS = ([5, 7, 4], [9, 1, 6])  # two rows of T=16, each packing three documents


def packed_row(lengths: list[int]) -> torch.Tensor:
    """(T,) doc_ids of a row packing documents of `lengths`."""
    return torch.cat([torch.full((n,), d) for d, n in enumerate(lengths)])


def run(model, arch: str, ids: torch.Tensor, **packing) -> torch.Tensor:
    """Final hidden states (B, T, C): the part of the model attention shapes."""
    if arch == "bert":
        return model.encode(ids, **packing)
    return model(ids, head=False, **packing)


def loss_and_grads(model, out: torch.Tensor, weights: torch.Tensor) -> dict[str, torch.Tensor]:
    model.zero_grad()
    (out * weights).sum().backward()
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("attention", ["flash", "naive"])
@pytest.mark.parametrize("heads", list(KV_HEADS))
@pytest.mark.parametrize("reset", [False, True], ids=["row_positions", "reset_positions"])
@pytest.mark.parametrize("positions", POSITIONS)
@pytest.mark.parametrize("arch", ["gpt", "bert"])
def test_a_packed_row_equals_each_document_alone(arch, positions, reset, heads, attention):
    torch.manual_seed(0)
    model = build_model(tiny_cfg(arch, positions=positions, n_kv_heads=KV_HEADS[heads], attention=attention))
    doc_ids = torch.stack([packed_row(lengths) for lengths in LENGTHS])  # (B, T)
    row_positions = torch.arange(doc_ids.shape[1]).expand_as(doc_ids)  # (B, T)
    position_ids = restarted_positions(doc_ids) if reset else row_positions
    ids = torch.randint(1, 61, doc_ids.shape, generator=torch.Generator().manual_seed(1))  # (B, T)
    weights = torch.randn(*doc_ids.shape, 32, generator=torch.Generator().manual_seed(2))  # (B, T, C)

    packing = {"doc_ids": doc_ids, "position_ids": position_ids if reset else None}
    packed = run(model, arch, ids, **packing)  # (B, T, C)
    packed_grads = loss_and_grads(model, packed, weights)

    alone = torch.zeros_like(packed)
    alone_grads = {name: torch.zeros_like(g) for name, g in packed_grads.items()}
    for b in range(doc_ids.shape[0]):
        for d in doc_ids[b].unique():
            cols = (doc_ids[b] == d).nonzero().flatten()  # the document's columns in the row
            out = run(model, arch, ids[b, cols][None], position_ids=position_ids[b, cols][None])  # (1, n, C)
            alone[b, cols] = out[0].detach()
            for name, g in loss_and_grads(model, out, weights[b, cols][None]).items():
                alone_grads[name] += g
    torch.testing.assert_close(packed.detach(), alone, atol=2e-5, rtol=1e-4)
    for name in packed_grads:
        torch.testing.assert_close(packed_grads[name], alone_grads[name], atol=2e-5, rtol=1e-4, msg=name)


def test_without_the_mask_documents_see_each_other():
    """The test above can fail: packed rows without doc_ids attend across documents."""
    torch.manual_seed(0)
    model = build_model(tiny_cfg("gpt", positions="rope"))
    doc_ids = packed_row([5, 7, 4])[None]  # (1, T)
    ids = torch.randint(1, 61, doc_ids.shape)
    second = (doc_ids[0] == 1).nonzero().flatten()
    alone = model(ids[:, second], position_ids=torch.arange(7)[None] + 5, head=False)
    unmasked = model(ids, head=False)[:, second]
    masked = model(ids, doc_ids=doc_ids, head=False)[:, second]
    assert not torch.allclose(unmasked, alone, atol=1e-3)
    torch.testing.assert_close(masked, alone, atol=2e-5, rtol=1e-4)


def test_the_mask_is_one_bool_tensor_that_keeps_documents_apart():
    doc_ids = packed_row([2, 3])[None]  # (1, 5)
    causal = self_attention_mask(5, causal=True, doc_ids=doc_ids).tensor[0, 0]
    both = self_attention_mask(5, causal=False, doc_ids=doc_ids).tensor[0, 0]
    same = doc_ids[0][:, None] == doc_ids[0][None, :]
    assert causal.dtype == torch.bool and torch.equal(both, same)
    assert torch.equal(causal, same & torch.ones(5, 5, dtype=torch.bool).tril())


def test_a_forward_over_the_kv_cache_refuses_document_layouts():
    model = build_model(tiny_cfg("gpt"))
    with pytest.raises(ValueError, match="doc_ids"):
        model(torch.ones(1, 4, dtype=torch.long), kv_cache=model.new_kv_cache(1, 8), doc_ids=torch.zeros(1, 4))
