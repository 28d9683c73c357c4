"""On a CUDA device the flash path really runs a fused kernel: restricting SDPA to the fused backends
makes PyTorch raise instead of silently falling back to the math implementation."""

import pytest
import torch

from tfkit.models import ModelConfig, build_model

pytestmark = pytest.mark.gpu


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("n_kv_heads", [None, 2], ids=["mha", "gqa"])
@pytest.mark.parametrize("arch", ["gpt", "bert", "transformer"])
def test_flash_path_uses_a_fused_kernel_in_bf16(arch, n_kv_heads):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    cfg = ModelConfig(arch=arch, vocab_size=128, d_model=256, n_layers=2, n_heads=4, n_kv_heads=n_kv_heads,
                      max_seq_len=128, attention="flash")
    model = build_model(cfg).to("cuda", torch.bfloat16)
    ids = torch.randint(0, 128, (2, 64), device="cuda")
    fused = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION]
    with sdpa_kernel(fused):
        logits = model(ids, ids) if arch == "transformer" else model(ids)
        logits.float().sum().backward()
    assert torch.isfinite(logits).all()
    reference = build_model(ModelConfig(**{**cfg.to_dict(), "attention": "naive"})).to("cuda", torch.bfloat16)
    reference.load_state_dict(model.state_dict())
    expected = reference(ids, ids) if arch == "transformer" else reference(ids)
    torch.testing.assert_close(logits.float(), expected.float(), atol=0.1, rtol=0.05)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("arch", ["bert", "transformer"])
def test_padding_with_grouped_kv_heads_stays_on_a_fused_kernel(arch):
    """A padding mask rules FlashAttention out and grouped K/V rule the memory-efficient kernel out; with
    only those two allowed (no cuDNN, no math), padded GQA training batches must still run, with dropout."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    cfg = ModelConfig(arch=arch, vocab_size=128, d_model=256, n_layers=2, n_heads=4, n_kv_heads=2,
                      max_seq_len=128, attn_dropout=0.1)
    model = build_model(cfg).to("cuda").train()
    ids = torch.randint(0, 128, (2, 64), device="cuda")
    real = torch.arange(64, device="cuda")[None, :] < torch.tensor([[64], [40]], device="cuda")  # (B, T)
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(ids, ids, src_mask=real, tgt_mask=real) if arch == "transformer" else model(ids, real)
        out.float().sum().backward()
    assert torch.isfinite(out).all() and all(torch.isfinite(p.grad).all() for p in model.parameters()
                                             if p.grad is not None)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("n_kv_heads", [1, 2, 4], ids=["mqa", "gqa", "mha"])
def test_cached_decoding_runs_a_fused_kernel(n_kv_heads):
    """The prefill and the decode steps attend over the whole cache under a position mask: a fused kernel
    (memory-efficient or cuDNN; FlashAttention takes no mask) serves them, never the unfused math path,
    and grouped K/V heads (folded into query rows, not copied) give the naive path's logits."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from tfkit.models.generation import decode_step, prefill

    cfg = ModelConfig(arch="gpt", vocab_size=128, d_model=256, n_layers=2, n_heads=4, n_kv_heads=n_kv_heads,
                      max_seq_len=128)
    model = build_model(cfg).to("cuda", torch.bfloat16).eval()
    naive = build_model(ModelConfig(**{**cfg.to_dict(), "attention": "naive"})).to("cuda", torch.bfloat16).eval()
    naive.load_state_dict(model.state_dict())
    ids = torch.randint(0, 128, (2, 16), device="cuda")
    cache = model.new_kv_cache(2, 32, device="cuda", dtype=torch.bfloat16)
    naive_cache = naive.new_kv_cache(2, 32, device="cuda", dtype=torch.bfloat16)
    fused = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION]
    with torch.inference_mode():
        with sdpa_kernel(fused):
            logits = prefill(model, ids, cache)
        expected = prefill(naive, ids, naive_cache)
        for pos in range(16, 20):
            position = torch.tensor(pos, device="cuda")
            token = expected.argmax(-1, keepdim=True)  # (B, 1): the same token for both
            with sdpa_kernel(fused):
                logits = decode_step(model, token, position, cache)  # (B, 1) -> (B, V)
            expected = decode_step(naive, token, position, naive_cache)  # (B, V)
            torch.testing.assert_close(logits.float(), expected.float(), atol=0.1, rtol=0.05)
    assert torch.isfinite(logits).all()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_compiled_document_masked_training_step_equals_the_dense_mask():
    """Packed rows on CUDA go through flex_attention with the block mask built per forward; at T=1024
    (several 128-blocks, as gpt2-small's recipe) the compiled forward and backward give what the naive
    path gives under the dense (B, 1, T, T) mask. Traced inside the compiled model, the block mask once
    made the kernel read out of bounds (`create_block_mask`), then made the output 15% off (tables built
    in the graph): models/flex.py builds it outside the graph."""
    torch.manual_seed(0)
    cfg = ModelConfig(arch="gpt", vocab_size=512, d_model=256, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=1024)
    model = build_model(cfg).to("cuda")
    reference = build_model(ModelConfig(**{**cfg.to_dict(), "attention": "naive"})).to("cuda")
    reference.load_state_dict(model.state_dict())
    ids = torch.randint(0, 512, (4, 1024), device="cuda")
    doc_ids = (torch.rand(4, 1024, device="cuda") < 0.005).cumsum(1)  # (B, T): a few documents a row
    compiled = torch.compile(model)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        for _ in range(2):  # the second call replays the compiled graph
            out = compiled(ids, doc_ids=doc_ids, head=False)  # (B, T, C)
        expected = reference(ids, doc_ids=doc_ids, head=False)  # (B, T, C)
        leaky = reference(ids, head=False)  # (B, T, C): documents see each other, what the mask must prevent
    out.float().square().mean().backward()
    expected.float().square().mean().backward()

    def rel(a: torch.Tensor, b: torch.Tensor) -> float:
        return ((a.float() - b.float()).norm() / b.float().norm()).item()

    assert rel(out, expected) < 1e-2 < rel(leaky, expected)
    for (name, p), r in zip(model.named_parameters(), reference.parameters()):  # a key bias's gradient is 0
        assert (p.grad - r.grad).norm() <= 5e-2 * r.grad.norm() + 1e-6, name
