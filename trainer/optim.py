"""AdamW with decoupled weight decay, parameter groups, and the numeric-precision context.

Weight decay pulls weights towards zero; that is a regulariser for matrices that mix features, but on a
LayerNorm gain it fights the normalisation, on a bias it just shifts activations, and on an embedding
row it punishes rare tokens for being rare (they get few gradient updates to push back). So, as GPT-2,
BERT and every modern recipe do, decay applies only to the weight matrices of linear layers. A tied
output head shares its tensor with the token embedding, so it inherits the embedding's "no decay".
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Iterable

import torch
from torch import nn

from .muon import build_muon_adamw, muon_parameters
from .recipe import OptimSection


def param_groups(model: nn.Module, weight_decay: float, exclude: Iterable[nn.Parameter] = ()) -> list[dict]:
    """Two AdamW groups: `decay` (linear-layer matrices) and `no_decay` (norms, biases, embeddings).

    Membership is decided by the module that owns a tensor, not by its name, so it does not depend on how
    the model files happen to name things. Shared tensors (tied embeddings) are counted once; `exclude`d
    ones (the matrices Muon updates) not at all.
    """
    embedding_ids = {id(p) for m in model.modules() if isinstance(m, nn.Embedding) for p in m.parameters()}
    decay, no_decay, seen = [], [], {id(p) for p in exclude}
    for _, param in model.named_parameters():
        if not param.requires_grad or id(param) in seen:
            continue
        seen.add(id(param))
        if param.ndim < 2 or id(param) in embedding_ids:
            no_decay.append(param)  # biases and norm gains are 1-D; embeddings by owner
        else:
            decay.append(param)
    return [
        {"params": decay, "weight_decay": weight_decay, "name": "decay"},
        {"params": no_decay, "weight_decay": 0.0, "name": "no_decay"},
    ]


def build_optimizer(model: nn.Module, optim: OptimSection, device: torch.device) -> torch.optim.AdamW:
    """AdamW over `param_groups`, the fused kernel (one launch for every tensor on GPUs, one pass per tensor on
    CPUs). The training loop needs it: its step takes the learning rate as a device tensor and skips a
    non-finite update on the device (`found_inf`), so the host never reads either (trainer/step.py).
    `optim.name: muon` gives `muon.MuonAdamW`, a fused AdamW that steps the blocks' matrices by Muon."""
    if optim.name == "muon":
        matrices = muon_parameters(model)
        return build_muon_adamw(model, matrices, param_groups(model, optim.weight_decay, exclude=matrices), optim)
    return torch.optim.AdamW(
        param_groups(model, optim.weight_decay),
        lr=optim.lr,  # replaced every step by the schedule (step._optimizer_step, set_lr)
        betas=(optim.beta1, optim.beta2),
        eps=optim.eps,
        fused=True,
    )


def decay_line(optimizer: torch.optim.Optimizer) -> str:
    """The start block's line on what weight decay reaches: each group's decay, tensor count and parameters.
    HF's Trainer decays every tensor but biases and norm weights; tfkit spares embeddings too (param_groups)."""
    parts = []
    for group in optimizer.param_groups:
        params = sum(p.numel() for p in group["params"])
        what = {"decay": "weight matrices", "no_decay": "norms, biases and embeddings",
                "muon": "blocks' matrices (Muon)"}.get(group.get("name"), group.get("name", "group"))
        parts.append(f"{group['weight_decay']:g} on {len(group['params'])} {what} ({params:,} parameters)")
    return "weight decay: " + "; ".join(parts)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """The schedule is a pure function of the step, so the rate is written, never stepped."""
    for group in optimizer.param_groups:
        group["lr"] = lr


def clip_grad_norm(params: Iterable[torch.Tensor], max_norm: float | None) -> torch.Tensor:
    """Clip the global gradient norm to `max_norm` (None = no clipping); returns the norm before clipping
    as a float64 tensor on the gradients' device (reading it is left to the caller, once per update).

    The norm is computed even without clipping: it is logged, and a non-finite one marks a bad step."""
    norm = torch.nn.utils.clip_grad_norm_(list(params), max_norm if max_norm is not None else math.inf)
    if hasattr(norm, "full_tensor"):  # FSDP2: a DTensor replicated on every rank
        norm = norm.full_tensor()
    return norm.double()


@functools.cache  # a fact of the hardware: asked once per device, not at every autocast
def native_bf16(device: torch.device) -> bool:
    """Whether `device` multiplies bf16 matrices in hardware: CUDA GPUs from Ampere on, and CPUs with
    AVX512-BF16 or AMX dot-product instructions. Other CPUs emulate bf16 by converting to fp32, which makes
    autocast slower than plain fp32 there."""
    if device.type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported(including_emulation=False)
    if device.type == "cpu":
        cpu = torch.cpu
        return any(getattr(cpu, probe, lambda: False)() for probe in ("_is_avx512_bf16_supported",
                                                                       "_is_amx_tile_supported"))
    return False


def resolve_precision(setting: str, device: torch.device) -> str:
    """`train.precision` for a device: fp32 / bf16 / fp16 as given; auto = bf16 autocast where the hardware
    computes bf16 natively (`native_bf16`), else fp32.

    Measured on a CPU with AVX512-BF16 (one thread, benchmarks/RESULTS.md): bf16 matrix products run 4.3x
    faster than fp32, a training step 2.6x faster at d_model 256 and 1.5x at the small-corpus recipe's
    d_model 128, and 800 steps of small-corpus reach the same validation loss (3.8286 vs 3.8290)."""
    if setting != "auto":
        return setting
    return "bf16" if native_bf16(device) else "fp32"


def autocast_context(precision: str, device: torch.device) -> contextlib.AbstractContextManager:
    """fp32: nothing. bf16 / fp16: autocast, so matmuls run in half precision while the weights, the
    optimizer state and the reductions (softmax, norms, the loss) stay in fp32."""
    precision = resolve_precision(precision, device)
    if precision == "fp32":
        return contextlib.nullcontext()
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    return torch.autocast(device_type=device.type, dtype=dtype)


def grad_scaler(precision: str, device: torch.device) -> torch.amp.GradScaler:
    """fp16 gradients underflow without loss scaling; bf16 has fp32's exponent range and needs none.
    A disabled scaler is a no-op whose calls keep the training loop free of precision branches."""
    return torch.amp.GradScaler(device.type, enabled=precision == "fp16")  # `auto` never resolves to fp16
