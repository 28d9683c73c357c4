"""Fused vocabulary projection + cross-entropy, processed a chunk of rows at a time.

For a small language model the output head dominates a training step: `F.linear` to (N, V) logits, then
`F.cross_entropy` materialises (N, V) log-probs, its backward zero-fills an (N, V) gradient, runs the
log_softmax backward over it, and the accuracy needs another pass (argmax) over the logits. On tfkit's
tiny GPT that was ~73% of the step (git show cd30549:benchmarks/RESULTS.md).

`linear_cross_entropy` computes the same three numbers (summed loss, correct count, gradients) while only
one chunk of logits exists at a time: per chunk it computes the logits, takes the row max and argmax in one
pass, exponentiates in place, and turns that buffer into the chunk's gradient (softmax - target
distribution) in place; the gradients wrt the hidden rows and the weight are accumulated right away. The
backward then only scales what the forward accumulated by the incoming gradient (the loop scales the loss
sum by 1 / global token count, the GradScaler by its scale).

Semantics are `F.cross_entropy(h @ W.T + b, y, reduction="sum", ignore_index=-100, label_smoothing=eps)`,
and the accuracy counts rows whose argmax equals the label (first maximum on ties, as `argmax`).

The clm and seq2seq objectives use it where `objective.fused_loss` says so: on, off, or auto, which picks
per device type from what was measured (`use_fused_loss`).
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd.function import FunctionCtx, once_differentiable

IGNORE = -100
# Logits per chunk. CPU: 16 MB of fp32 (512 rows at V = 8,192), the fastest of 128 to 4,096 rows measured
# on the tiny GPT (smaller chunks stay in cache between the passes; 2,048+ rows were ~7% slower). GPU: 64 MB
# (333 rows at GPT-2's V = 50,257), so each chunk is a few large kernels rather than many small launches.
CHUNK_ELEMENTS = {"cpu": 2**22, "default": 2**24}


# objective.fused_loss: auto, per device type. CPU: measured, a whole CLM training step (forward, backward,
# AdamW) fused vs plain, one thread, time.process_time, interleaved, median of 16 rounds on a 2-core EPYC:
# 1.16x faster fused at the gpt-tiny recipe's shape (d 128, V 4,096, B 16, T 128; 512 vs 585 ms) and 1.09x at
# d 256, V 8,192 (1.77 vs 1.95 s). CUDA: a reasoned default, not a measurement (no GPU measured it): the
# plain head is one large matmul and one cross-entropy kernel, which torch.compile handles well, while the
# fused head unrolls its Python chunk loop into the graph (~50 chunks at GPT-2's shape, B 16, T 1,024).
FUSED_LOSS_AUTO = {"cpu": True, "cuda": False}


def use_fused_loss(setting: str, device: torch.device) -> bool:
    """`objective.fused_loss` resolved for a device: on / off as given, auto per FUSED_LOSS_AUTO (off on a
    device type not listed there, whose kernels were never measured against the plain head)."""
    if setting == "auto":
        return FUSED_LOSS_AUTO.get(device.type, False)
    return setting == "on"


def default_chunk_rows(vocab_size: int, device: torch.device) -> int:
    """Rows per chunk so one chunk of fp32 logits is ~CHUNK_ELEMENTS (at least 64 rows for the matmuls)."""
    elements = CHUNK_ELEMENTS.get(device.type, CHUNK_ELEMENTS["default"])
    return max(64, elements // max(vocab_size, 1))


def _compute_dtype(h: Tensor, weight: Tensor) -> torch.dtype:
    """The matmul dtype F.linear would use: autocast's (bf16/fp16) when it is on, else the inputs' common one."""
    if torch.is_autocast_enabled(h.device.type):
        return torch.get_autocast_dtype(h.device.type)
    return torch.promote_types(h.dtype, weight.dtype)


class _LinearCrossEntropy(torch.autograd.Function):
    """(h (N, D), weight (V, D), bias (V,) | None, targets (N,)) -> (loss_sum (), correct ()).

    The gradients are computed in forward (that is where the softmax of each chunk exists) and only when
    some input needs one, so evaluation pays for the loss alone. Holding them until backward costs an fp32
    (N, D) and (V, D), far less than the (N, V) logits and log-probs the unfused loss keeps."""

    @staticmethod
    def forward(ctx: FunctionCtx, h: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor,
                label_smoothing: float, chunk_rows: int) -> tuple[Tensor, Tensor]:
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        need_grad = need_h or need_w or need_b
        dtype = _compute_dtype(h, weight)
        N, V = h.shape[0], weight.shape[0]
        # Autocast is turned off inside and the casts are explicit, so each matmul runs in `dtype` and every
        # reduction (max, exp, sum, log) in fp32, as autocast treats F.linear + F.cross_entropy.
        with torch.autocast(h.device.type, enabled=False):
            hc, wc = h.to(dtype), weight.to(dtype)  # (N, D), (V, D)
            bc = None if bias is None else bias.to(dtype)  # (V,)
            valid = targets != IGNORE  # (N,)
            safe_targets = targets.masked_fill(~valid, 0)  # (N,) any in-range index; the row is masked out
            loss_sum = torch.zeros((), device=h.device, dtype=torch.float32)
            correct = torch.zeros((), device=h.device, dtype=torch.int64)
            grad_h = torch.empty_like(h, dtype=torch.float32) if need_h else None  # (N, D)
            grad_w = torch.zeros_like(weight, dtype=torch.float32) if need_w else None  # (V, D)
            grad_b = torch.zeros(V, device=h.device, dtype=torch.float32) if need_b else None  # (V,)
            for start in range(0, N, chunk_rows):
                rows = slice(start, min(start + chunk_rows, N))
                y = safe_targets[rows, None]  # (n, 1)
                keep = valid[rows].float()  # (n,) 1 for predicted rows, 0 for ignored ones
                logits = (hc[rows] @ wc.T if bc is None else torch.addmm(bc, hc[rows], wc.T)).float()  # (n, V)
                row_max, predicted = logits.max(dim=1)  # (n,), (n,) one pass gives both
                correct += ((predicted == y[:, 0]) & valid[rows]).sum()
                target_logit = logits.gather(1, y)[:, 0]  # (n,)
                mean_logit = logits.mean(dim=1) if label_smoothing else None  # (n,) for the smoothing term
                probs = logits.sub_(row_max[:, None]).exp_()  # (n, V) unnormalised, reuses the logits buffer
                sum_exp = probs.sum(dim=1)  # (n,)
                lse = row_max + sum_exp.log()  # (n,)
                # torch's label smoothing: (1 - eps) * NLL + eps * mean over classes of -log p.
                row_loss = (1.0 - label_smoothing) * (lse - target_logit)  # (n,)
                if label_smoothing:
                    row_loss = row_loss + label_smoothing * (lse - mean_logit)
                loss_sum += row_loss.masked_fill(~valid[rows], 0.0).sum()  # ignored rows add exactly 0
                if not need_grad:
                    continue
                # d(row_loss)/d(logits) = softmax - (1 - eps) * onehot - eps / V; ignored rows get 0.
                grad = probs.mul_((keep / sum_exp)[:, None])  # (n, V) softmax of kept rows, in place
                grad.scatter_add_(1, y, (-(1.0 - label_smoothing) * keep)[:, None])
                if label_smoothing:
                    grad.sub_((label_smoothing / V) * keep[:, None])
                g = grad.to(dtype)  # (n, V) back to the matmul dtype (no copy in fp32)
                if need_h:
                    grad_h[rows] = g @ wc  # (n, D)
                if need_w:
                    if dtype == torch.float32:
                        grad_w.addmm_(g.T, hc[rows])  # (V, D) accumulated without a temporary
                    else:
                        grad_w += g.T @ hc[rows]  # (V, D) half-precision matmul, fp32 accumulation
                if need_b:
                    grad_b += grad.sum(dim=0)
        ctx.mark_non_differentiable(correct)
        ctx.save_for_backward(grad_h, grad_w, grad_b)
        ctx.input_dtypes = (h.dtype, weight.dtype, None if bias is None else bias.dtype)
        return loss_sum, correct

    @staticmethod
    @once_differentiable
    def backward(ctx: FunctionCtx, grad_loss: Tensor,
                 _grad_correct: Tensor | None) -> tuple[Tensor | None, Tensor | None, Tensor | None, None, None, None]:
        grad_h, grad_w, grad_b = ctx.saved_tensors
        h_dtype, w_dtype, b_dtype = ctx.input_dtypes
        scale = grad_loss.float()  # () e.g. 1 / global target count, times a GradScaler's scale
        return (None if grad_h is None else (grad_h * scale).to(h_dtype),
                None if grad_w is None else (grad_w * scale).to(w_dtype),
                None if grad_b is None else (grad_b * scale).to(b_dtype),
                None, None, None)


def linear_cross_entropy(h: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor,
                         label_smoothing: float = 0.0, chunk_rows: int | None = None) -> tuple[Tensor, Tensor]:
    """Summed cross-entropy of `h (N, D) @ weight (V, D).T + bias` against `targets (N,)` (-100 = ignored),
    and the number of rows whose argmax is the target, without materialising the (N, V) logits.

    Returns (loss_sum () fp32, correct () int64); loss_sum is differentiable wrt h, weight and bias."""
    if h.dim() != 2 or targets.shape != h.shape[:1]:
        raise ValueError(f"expected h (N, D) and targets (N,), got {tuple(h.shape)} and {tuple(targets.shape)}")
    rows = chunk_rows or default_chunk_rows(weight.shape[0], h.device)
    return _LinearCrossEntropy.apply(h, weight, bias, targets, float(label_smoothing), rows)
