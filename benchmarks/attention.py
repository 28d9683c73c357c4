"""Attention: what tfkit's `Attention` module costs over the bare kernel, and what the fused path saves.

Ways to compute the same self-attention layer (causal, or bidirectional as BERT's), forward + backward,
with the same weights:
- tfkit: `models.attention.Attention` (attention: flash) called as a model calls it, with the `AttnMask`
  that `self_attention_mask` builds once per forward (built outside the timed call, as the model shares
  it across layers);
- bare: the same four projections written inline around one `F.scaled_dot_product_attention` call, the
  least code that does the job. On CUDA it is timed once per fused backend (FlashAttention-2, the
  memory-efficient kernel, cuDNN), each forced with `sdpa_kernel`, and tfkit is measured against the
  fastest of them at that shape (goal: <= 5% over it); on the CPU, against SDPA's own choice;
- naive: the same module with attention: naive (explicit softmax(QK^T/sqrt(d) + mask)V), the baseline the
  fused kernels are measured against, in time and (on GPU) peak memory.

GPU: B=8, 16 heads, d_head 64 and 128, bf16, T = 1024 ... 8192, causal and not. CPU: fp32, B=1, 8 heads,
d_head 64, T = 128 ... 2048, causal, time only: PyTorch has no per-call peak of host memory. Then, at each
causal length, a sliding-window layer (`model.window` 256) against full causal attention.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from tfkit.models import ModelConfig
from tfkit.models.attention import Attention, self_attention_mask
from tfkit.models.band import worth_banding

from .common import Context, Goal, Row, is_oom, median, paired_ratio, peak_memory_mb, sync, time_interleaved

OVERHEAD_GOAL = Goal("overhead <= 5%", 1 / 1.05)


@dataclass(frozen=True)
class Shape:
    batch: int
    heads: int
    head_dim: int
    seq_len: int
    dtype: torch.dtype
    causal: bool = True


def shapes(ctx: Context) -> list[Shape]:
    if ctx.suite == "gpu":
        lengths = (1024,) if ctx.quick else (1024, 2048, 4096, 8192)
        return [Shape(8, 16, d, t, torch.bfloat16, causal) for causal in (True, False) for d in (64, 128)
                for t in lengths]
    if ctx.quick:
        return [Shape(1, 4, 32, t, torch.float32) for t in (64, 128)]
    return [Shape(1, 8, 64, t, torch.float32) for t in (128, 256, 512, 1024, 2048)]


def bare_sdpa(module: Attention, x: Tensor, causal: bool) -> Tensor:
    """The same layer with nothing but the projections and one SDPA call (MHA)."""
    B, T, C = x.shape
    H, D = module.n_heads, module.head_dim
    q = F.linear(x, module.q_proj.weight, module.q_proj.bias).view(B, T, H, D).transpose(1, 2)  # (B, H, T, D)
    k = F.linear(x, module.k_proj.weight, module.k_proj.bias).view(B, T, H, D).transpose(1, 2)  # (B, H, T, D)
    v = F.linear(x, module.v_proj.weight, module.v_proj.bias).view(B, T, H, D).transpose(1, 2)  # (B, H, T, D)
    y = F.scaled_dot_product_attention(q, k, v, is_causal=causal)  # (B, H, T, D)
    return F.linear(y.transpose(1, 2).reshape(B, T, C), module.o_proj.weight, module.o_proj.bias)  # (B, T, C)


def backends(device: torch.device) -> dict[str, object]:
    """The fused SDPA kernels a bare call can be pinned to: name -> SDPBackend (none on the CPU, where the
    baseline is SDPA's own choice)."""
    if device.type != "cuda":
        return {}
    from torch.nn.attention import SDPBackend

    return {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
            "cudnn": SDPBackend.CUDNN_ATTENTION}


def pinned(backend: object, forward: Callable[[Tensor], Tensor]) -> Callable[[Tensor], Tensor]:
    """`forward` with SDPA allowed only `backend` (a RuntimeError when it cannot take the call)."""
    from torch.nn.attention import sdpa_kernel

    def call(x: Tensor) -> Tensor:
        with sdpa_kernel([backend]):
            return forward(x)

    return call


def fwd_bwd(forward: Callable[[Tensor], Tensor], module: torch.nn.Module, x: Tensor,
            grad: Tensor) -> Callable[[], None]:
    """One call = forward + backward into the weights and the input, gradients reset (not accumulated)."""

    def call() -> None:
        module.zero_grad(set_to_none=True)
        x.grad = None
        forward(x).backward(grad)

    return call


def measure(ctx: Context, shape: Shape) -> list[Row]:
    d_model = shape.heads * shape.head_dim
    cfg = ModelConfig(arch="gpt", d_model=d_model, n_heads=shape.heads, max_seq_len=shape.seq_len)
    dev = ctx.device
    torch.manual_seed(0)
    flash = Attention(cfg).to(dev, shape.dtype)
    naive = Attention(ModelConfig(**{**cfg.to_dict(), "attention": "naive"})).to(dev, shape.dtype)
    naive.load_state_dict(flash.state_dict())
    x = torch.randn(shape.batch, shape.seq_len, d_model, device=dev, dtype=shape.dtype, requires_grad=True)
    grad = torch.randn_like(x)
    mask = self_attention_mask(shape.seq_len, causal=shape.causal, device=dev, dtype=shape.dtype)  # once, as the model
    bare = lambda t: bare_sdpa(flash, t, shape.causal)  # noqa: E731
    fns = {"tfkit": fwd_bwd(lambda t: flash(t, mask), flash, x, grad), "sdpa": fwd_bwd(bare, flash, x, grad)}
    fns.update({f"sdpa-{name}": fwd_bwd(pinned(backend, bare), flash, x, grad)
                for name, backend in backends(dev).items()})
    fns["naive"] = fwd_bwd(lambda t: naive(t, mask), naive, x, grad)
    label = (f"B={shape.batch} H={shape.heads} d={shape.head_dim} T={shape.seq_len} {str(shape.dtype)[6:]} "
             f"{'causal' if shape.causal else 'bidirectional'} fwd+bwd")
    ctx.log(f"attention: {label}")
    refused = []
    for name in [n for n in fns if n.startswith("sdpa-")]:  # a kernel that cannot take this shape or GPU
        try:
            fns[name]()
        except RuntimeError:
            del fns[name]
            refused.append(name.removeprefix("sdpa-"))
    try:
        fns["naive"]()  # the one that may not fit: find out before timing anything
    except Exception as exc:  # noqa: BLE001
        if not is_oom(exc):
            raise
        del fns["naive"]
    if "naive" not in fns and dev.type == "cuda":
        torch.cuda.empty_cache()  # after the except block: its traceback held the failed call's tensors
    sync(dev)
    start = time.perf_counter()
    fns["tfkit"]()
    sync(dev)
    one_call = time.perf_counter() - start
    target = 0.01 if ctx.quick else 0.05 if dev.type == "cuda" else 0.3  # seconds per sample, above timer noise
    calls = max(1, min(50, int(target / max(one_call, 1e-6))))
    rounds = 2 if ctx.quick else 6
    samples = time_interleaved(fns, dev, warmup=1 if ctx.quick else 2, rounds=rounds, calls=calls, timer=ctx.timer)
    ms = {name: 1e3 * median(s) for name, s in samples.items()}
    mem = {name: peak_memory_mb(fn, dev) for name, fn in fns.items()}
    mem_note = "time only on CPU" if dev.type != "cuda" else f"peak {mem['tfkit']:,.0f} vs {mem['sdpa']:,.0f} MB"
    pinned_names = [n for n in fns if n.startswith("sdpa-")]
    fastest = min(pinned_names, key=lambda n: ms[n]) if pinned_names else "sdpa"  # the CPU: SDPA's own choice
    overhead = 1 / paired_ratio(samples["tfkit"], samples[fastest]) - 1
    kernels = ", ".join(f"{n.removeprefix('sdpa-')} {ms[n]:.3g}" for n in pinned_names)
    note = (f"overhead {100 * overhead:+.1f}%" + (f" over {fastest.removeprefix('sdpa-')}; ms: {kernels}, SDPA's "
            f"choice {ms['sdpa']:.3g}" if pinned_names else "") + (f"; refused: {', '.join(refused)}" if refused else "")
            + f"; {mem_note}")
    rows = [Row("attention", f"tfkit Attention vs fastest bare SDPA kernel, {label}", "ms", ms["tfkit"],
                ms[fastest], higher_is_better=False, goal=OVERHEAD_GOAL, note=note,
                paired=paired_ratio(samples["tfkit"], samples[fastest]),
                extra={"samples_s": samples, "peak_mb": mem, "calls_per_sample": calls, "fastest": fastest})]
    case = f"tfkit flash vs naive path, {label}"
    if "naive" not in fns:
        rows.append(Row("attention", case, "ms", ms["tfkit"], None, higher_is_better=False,
                        note="naive: out of memory", extra={"peak_mb": mem}))
    else:
        note = ("time only on CPU" if dev.type != "cuda" else
                f"peak {mem['tfkit']:,.0f} vs {mem['naive']:,.0f} MB ({mem['naive'] / mem['tfkit']:.1f}x less)")
        rows.append(Row("attention", case, "ms", ms["tfkit"], ms["naive"], higher_is_better=False, note=note,
                        paired=paired_ratio(samples["tfkit"], samples["naive"]), extra={"peak_mb": mem}))
    return rows


WINDOW = 256  # model.window of the windowed rows: a query sees the 256 keys up to it


def window_row(ctx: Context, shape: Shape) -> Row:
    """A causal sliding-window layer (model.window) against full causal attention, fwd+bwd, same weights:
    what a window saves as T grows. On CUDA the band is a flex_attention block mask (blocks outside it are
    skipped); elsewhere, from T = 4 windows, chunks of a window of queries (models/band.py)."""
    d_model = shape.heads * shape.head_dim
    cfg = ModelConfig(arch="gpt", d_model=d_model, n_heads=shape.heads, max_seq_len=shape.seq_len)
    dev = ctx.device
    torch.manual_seed(0)
    layer = Attention(cfg).to(dev, shape.dtype)
    x = torch.randn(shape.batch, shape.seq_len, d_model, device=dev, dtype=shape.dtype, requires_grad=True)
    grad = torch.randn_like(x)
    full = self_attention_mask(shape.seq_len, causal=True, device=dev, dtype=shape.dtype)
    band = self_attention_mask(shape.seq_len, causal=True, device=dev, dtype=shape.dtype, window=WINDOW)
    fns = {"window": fwd_bwd(lambda t: layer(t, band), layer, x, grad),
           "full": fwd_bwd(lambda t: layer(t, full), layer, x, grad)}
    label = f"B={shape.batch} H={shape.heads} d={shape.head_dim} T={shape.seq_len} {str(shape.dtype)[6:]} fwd+bwd"
    ctx.log(f"attention: window {WINDOW}, {label}")
    samples = time_interleaved(fns, dev, warmup=1 if ctx.quick else 2, rounds=2 if ctx.quick else 6, calls=1,
                               timer=ctx.timer)
    ms = {name: 1e3 * median(s) for name, s in samples.items()}
    note = ("time only on CPU" + (", chunked band" if band.band and worth_banding(shape.seq_len, WINDOW) else "")
            if dev.type != "cuda" else
            "peak {:,.0f} vs {:,.0f} MB (flex block mask)".format(*(peak_memory_mb(fns[n], dev) for n in fns)))
    return Row("attention", f"window {WINDOW} vs full causal attention, {label}", "ms", ms["window"], ms["full"],
               higher_is_better=False, note=note, paired=paired_ratio(samples["window"], samples["full"]))


def run(ctx: Context) -> list[Row]:
    rows: list[Row] = []
    for shape in shapes(ctx):
        rows += measure(ctx, shape)
        if ctx.device.type == "cuda":
            torch.cuda.empty_cache()
    for shape in shapes(ctx):  # the windowed layer as T grows: causal shapes of the first head size
        if shape.causal and shape.head_dim == shapes(ctx)[0].head_dim and shape.seq_len > WINDOW // 4:
            rows.append(window_row(ctx, shape))
    return rows
