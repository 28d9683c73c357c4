"""Decode throughput of MHA vs GQA vs MQA: what fewer key/value heads buy at inference.

One model shape with random weights, built three times with n_kv_heads = n_heads (MHA), n_heads/4 (GQA)
and 1 (MQA). For batch 1 and 16 at a short and a long context, the prompt is prefilled and then
`--steps` tokens are decoded greedily one at a time through tfkit's static KV cache (the same
`prefill`/`decode_step` that `tfkit generate` uses; `--compile`: the step compiled, as
`tfkit generate --compile` runs it, compile time excluded), timing only the decode steps. Decoding is
memory-bound: each step reads every weight and the whole cache once, so the cache size (bytes per token,
printed) is what GQA/MQA shrink and where they should win, most at long context and large batch.
Ratios are against MHA measured in the same run, on the same machine, so they survive noisy hosts.

Also times HuggingFace `generate` on the same weights (exported as Llama by tfkit's own export rules)
when `transformers` is installed; skipped otherwise, or with --no-hf.

    python -m benchmarks.decode [--device cpu|cuda] [--quick] [--compile] [--batches 1] [--contexts 128]
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

import torch

from tfkit.models import ModelConfig, build_model, kv_cache_bytes_per_token
from tfkit.models.generation import compiled, decode_step, prefill


@dataclass(frozen=True)
class Shape:
    d_model: int
    n_layers: int
    n_heads: int
    vocab_size: int
    contexts: tuple[int, int]  # short, long prompt lengths
    steps: int  # decode steps timed per measurement


FULL = Shape(d_model=768, n_layers=12, n_heads=16, vocab_size=32768, contexts=(128, 2048), steps=64)
QUICK = Shape(d_model=256, n_layers=4, n_heads=8, vocab_size=8192, contexts=(64, 512), steps=16)
# A 1B-class shape (Llama 3.2 1B's width, depth and heads), where a B=16 step at a 2048-token context
# reads about as many cache bytes as weight bytes: the case where fewer KV heads should pay.
ONE_B = Shape(d_model=2048, n_layers=16, n_heads=32, vocab_size=32768, contexts=(2048, 2048), steps=32)
BATCHES = (1, 16)
WARMUP = 3  # untimed decode steps before the timed ones (compiling, recording a CUDA graph)


def variants(shape: Shape) -> dict[str, int]:
    return {"MHA": shape.n_heads, "GQA": max(1, shape.n_heads // 4), "MQA": 1}


def config(shape: Shape, n_kv_heads: int, steps: int) -> ModelConfig:
    return ModelConfig(arch="gpt", vocab_size=shape.vocab_size, d_model=shape.d_model, n_layers=shape.n_layers,
                       n_heads=shape.n_heads, n_kv_heads=n_kv_heads, positions="rope", norm="rmsnorm",
                       activation="swiglu", bias=False, max_seq_len=max(shape.contexts) + WARMUP + steps)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.inference_mode()
def decode_tokens_per_sec(model: torch.nn.Module, batch: int, context: int, steps: int,
                          device: torch.device, compile: bool = False) -> float:
    """Generated tokens per second (all rows) over `steps` greedy one-token steps after a prefill and
    WARMUP untimed steps (where `compile` compiles and, on CUDA, records its CUDA graph)."""
    prompt = torch.randint(0, model.config.vocab_size, (batch, context), device=device)  # (B, T)
    cache = model.new_kv_cache(batch, context + WARMUP + steps)
    step = decode_step
    if compile:
        cache.mark_static()
        step = compiled(decode_step, device)
    position = torch.zeros((), dtype=torch.long, device=device)  # rewritten in place, as `generate` does
    token = prefill(model, prompt, cache).argmax(-1, keepdim=True)  # (B, 1)
    for pos in range(context, context + WARMUP + steps):
        if pos == context + WARMUP:
            sync(device)
            start = time.perf_counter()
        position.fill_(pos)
        token = step(model, token, position, cache).argmax(-1, keepdim=True)  # (B, 1)
    sync(device)
    return batch * steps / (time.perf_counter() - start)


def predicted_speedup(mha: torch.nn.Module, other: torch.nn.Module, batch: int, context: int,
                      dtype: torch.dtype) -> float:
    """How much faster a decode step of `other` should be than `mha`'s if it is bound by the bytes it must
    read: every weight once, and the whole KV cache (batch x context tokens); the cache is what fewer
    key/value heads shrink, the weights are what they cannot."""
    element = torch.empty((), dtype=dtype).element_size()

    def step_bytes(model: torch.nn.Module) -> int:
        return model.num_params() * element + batch * context * kv_cache_bytes_per_token(model.config, dtype)

    return step_bytes(mha) / step_bytes(other)


def to_hf(model: torch.nn.Module) -> torch.nn.Module | None:
    """The HuggingFace model computing the same function (tfkit's export rules), or None when
    transformers or the export is unavailable. The shape above (RoPE, RMSNorm, SwiGLU) exports as Llama."""
    try:
        import transformers

        from tfkit.checkpoints.hf_state import tfkit_to_hf
    except ImportError:
        return None
    config, state = tfkit_to_hf(model.config, model.state_dict())
    config = {k: v for k, v in config.items() if k != "architectures"}
    hf = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**config))
    missing, unexpected = hf.load_state_dict(state, strict=False)
    if unexpected or set(missing) - {"lm_head.weight"}:  # only the tied head may be absent
        raise RuntimeError(f"HF export does not fit: missing {missing}, unexpected {unexpected}")
    weight = next(model.parameters())
    return hf.to(device=weight.device, dtype=weight.dtype).eval()


@torch.inference_mode()
def hf_tokens_per_sec(hf_model: torch.nn.Module, batch: int, context: int, steps: int,
                      device: torch.device) -> float:
    """HuggingFace `generate` (greedy, its DynamicCache), decode only: the prompt but its last token is
    prefilled untimed into the cache handed to `generate`, which then runs `steps` one-token forwards,
    the same count tfkit's figure times."""
    from transformers import DynamicCache

    prompt = torch.randint(0, hf_model.config.vocab_size, (batch, context), device=device)  # (B, T)
    cache = DynamicCache(config=hf_model.config)
    hf_model(prompt[:, :-1], past_key_values=cache, use_cache=True)
    sync(device)
    start = time.perf_counter()
    hf_model.generate(prompt, attention_mask=torch.ones_like(prompt), past_key_values=cache, do_sample=False,
                      min_new_tokens=steps, max_new_tokens=steps, pad_token_id=0)
    sync(device)
    return batch * steps / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--quick", action="store_true", help="small model and contexts (CPU-friendly)")
    parser.add_argument("--steps", type=int, default=None, help="decode steps per measurement")
    parser.add_argument("--no-hf", dest="hf", action="store_false", help="skip the HuggingFace comparison")
    parser.add_argument("--repeats", type=int, default=3, help="measurements per cell; the best is kept")
    parser.add_argument("--threads", type=int, default=None,
                        help="CPU threads (1 is steadier on a shared host: no OpenMP spin-waiting)")
    parser.add_argument("--compile", action="store_true",
                        help="time tfkit's decode step compiled (torch.compile; CUDA graphs on CUDA)")
    parser.add_argument("--batches", type=_ints, default=BATCHES, help="comma-separated batch sizes (default 1,16)")
    parser.add_argument("--contexts", type=_ints, default=None,
                        help="comma-separated prompt lengths (default: the shape's short and long one)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    shape = QUICK if args.quick else FULL
    steps = args.steps or shape.steps
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    torch.manual_seed(0)

    contexts = args.contexts or shape.contexts
    cells = [(b, c) for c in contexts for b in args.batches]
    shape = Shape(**{**shape.__dict__, "contexts": (min(contexts), max(contexts))})  # max_seq_len fits them
    models = {name: build_model(config(shape, kv, steps)).to(device=device, dtype=dtype).eval()
              for name, kv in variants(shape).items()}
    # Best of `--repeats`, with the variants interleaved inside each repeat: a busy host slows every
    # variant alike instead of whichever happened to run during the disturbance.
    rows: dict[str, dict[tuple[int, int], float]] = {name: {cell: 0.0 for cell in cells} for name in models}
    for _ in range(args.repeats):
        for cell in cells:
            for name, model in models.items():
                rate = decode_tokens_per_sec(model, *cell, steps, device, compile=args.compile)
                rows[name][cell] = max(rows[name][cell], rate)

    cfg = models["MHA"].config
    print(f"# decode, {args.device} {str(dtype).removeprefix('torch.')}: d_model={cfg.d_model} "
          f"n_layers={cfg.n_layers} n_heads={cfg.n_heads} vocab={cfg.vocab_size} "
          f"params={models['MHA'].num_params() / 1e6:.1f}M, {steps} greedy steps after a prefill, best of {args.repeats}, "
          f"{torch.get_num_threads()} threads, decode step {'compiled' if args.compile else 'eager'}")
    head = ["variant", "kv_heads", "KV B/tok"] + [f"B={b} T={c} tok/s (xMHA)" for b, c in cells]
    table = []
    for name, model in models.items():
        kv_bytes = kv_cache_bytes_per_token(model.config, dtype)
        row = [name, str(model.config.kv_heads), f"{kv_bytes} ({kv_bytes / kv_cache_bytes_per_token(cfg, dtype):.2f}x)"]
        row += [f"{rows[name][cell]:.0f} ({rows[name][cell] / rows['MHA'][cell]:.2f}x)" for cell in cells]
        table.append(row)
    hf_models = {name: to_hf(model) for name, model in models.items()} if args.hf else {}
    if any(m is None for m in hf_models.values()):
        print("# HF comparison skipped: transformers or tfkit.checkpoints.hf_export not importable")
        hf_models = {}
    print_table(head, table)
    if hf_models:
        hf = {name: {cell: 0.0 for cell in cells} for name in hf_models}
        for _ in range(args.repeats):
            for cell in cells:
                for name, hf_model in hf_models.items():
                    hf[name][cell] = max(hf[name][cell], hf_tokens_per_sec(hf_model, *cell, steps, device))
        print("\n# HuggingFace generate on the same weights (Llama export): tok/s (tfkit speed-up)")
        print_table(["variant"] + [f"B={b} T={c}" for b, c in cells],
                    [[f"HF {name}"] + [f"{hf[name][cell]:.0f} ({rows[name][cell] / hf[name][cell]:.2f}x)"
                                       for cell in cells] for name in hf_models])


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(","))


def print_table(head: list[str], table: list[list[str]]) -> None:
    widths = [max(len(r[i]) for r in [head, *table]) for i in range(len(head))]
    for r in [head, ["-" * w for w in widths], *table]:
        print("  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip())

if __name__ == "__main__":
    main()
