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
