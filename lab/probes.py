"""Measurements a loss table alone does not give, each on a finished checkpoint.

- `ablate_attention`: the checkpoint with every attention block's output projection zeroed, so attention
  adds nothing to the residual stream. Its loss minus the model's is the model's *attention reliance*: when
  removing attention costs almost nothing, the model barely uses it and a comparison of head layouts
  (MHA/GQA/MQA) on that text says nothing about attention.
- `flash_max_diff`: the largest |logit| difference between the fused (SDPA) and the naive attention path
  on the same weights and tokens: the two must compute the same function.
- `mask_leak`: the largest change of the outputs at the first half of a sequence when the second half is
  replaced, in train mode; the causal mask (GPT) or the padding mask (BERT, second half marked as padding)
  makes it 0, unless something else mixes positions in training (BatchNorm's batch statistics).
- `activation_memory`: the bytes one training step keeps for backward at each sequence length, flash
  against naive, counted from the tensors autograd saves (unique storages, parameters excluded). The
  naive path keeps the (B, H, T, T) scores and probabilities, the fused one does not; counting saved
  tensors measures that on any device, deterministically, without a GPU's allocator statistics.
- `decode_speed`: greedy decoding tokens/s at each batch size and the KV-cache bytes per token: what
  fewer key/value heads buy at inference, beside what they cost in loss.
- `train_speed`: tokens/s of one training step (forward, backward) flash against naive at each sequence length,
  on a GPU only (FlashAttention's speed is a claim about a GPU's memory hierarchy; a CPU's numbers say nothing
  about it, so there the probe records why it did not run and the verdict reads "not tested").
- `attention_logits`: the largest |attention logit| (q·k times the score scale, before the softmax) a
  query of any layer and head gives a key its mask lets it see. Their growth at a high learning rate is
  the instability QK-norm is for (Dehghani et al., 2023, section 3.1; Wortsman et al., 2023, section
  3.1): logits in the hundreds make the softmax one-hot, and its gradient vanishes.
"""

from __future__ import annotations

import dataclasses
import math
import shutil
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ..checkpoints.record import CheckpointRecord
from ..checkpoints.weights import load_model, save_model
from ..files import staged_folder
from ..layout import CONFIG, TOKENIZER_FILES
from ..models import build_model
from ..models.attention import Attention


def ablate_attention(checkpoint: Path, out: Path) -> Path:
    """Write `checkpoint` with zeroed attention output projections to `out` (published whole); keeps the
    source's tokenizer and training facts (train_seq_len, objective) so it is scored exactly as the source."""
    if (out / CONFIG).is_file():
        return out
    model, _ = load_model(checkpoint)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, Attention):
                for param in module.o_proj.parameters():
                    param.zero_()
    with staged_folder(out) as tmp:
        save_model(model, tmp, CheckpointRecord.read(checkpoint))
        for name in TOKENIZER_FILES:
            if (checkpoint / name).is_file():
                shutil.copy2(checkpoint / name, tmp / name)
    return out


def _logits(model: nn.Module, batch: dict) -> torch.Tensor:
    return model(batch["input_ids"], token_type_ids=batch["token_type_ids"]) if "token_type_ids" in batch \
        else model(batch["input_ids"])


@torch.no_grad()
def flash_max_diff(checkpoint: Path, batch: dict) -> float:
    """max |logits(flash) - logits(naive)| over one batch, the same weights in both models."""
    model, cfg = load_model(checkpoint)
    other = build_model(dataclasses.replace(cfg, attention="naive" if cfg.attention == "flash" else "flash"))
    other.load_state_dict(model.state_dict())
    other.eval()
    return float((_logits(model, batch).float() - _logits(other, batch).float()).abs().max())


def _saved_bytes(model: nn.Module, ids: torch.Tensor) -> int:
    """Bytes of the unique tensors autograd saves for backward during one forward + loss of `ids`."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in params and storage.device.type != "meta":
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        logits = _logits(model, {"input_ids": ids})  # (1, T, V)
        loss = F.cross_entropy(logits.flatten(0, 1), ids.flatten())
    loss.backward()
    return sum(seen.values())


def activation_memory(checkpoint: Path, seq_lens: list[int]) -> dict:
    """{"seq_lens": [...], "flash": [MiB...], "naive": [MiB...]}: one training step of the checkpoint's
    architecture (fresh weights; memory does not depend on their values) at batch 1 and each length."""
    cfg = CheckpointRecord.read(checkpoint).model
    out: dict = {"seq_lens": list(seq_lens)}
    for impl in ("flash", "naive"):
        row = []
        for t in seq_lens:
            config = dataclasses.replace(cfg, attention=impl, max_seq_len=max(t, cfg.max_seq_len))
            torch.manual_seed(0)
            model = build_model(config)
            ids = torch.randint(0, config.vocab_size, (1, t))
            row.append(_saved_bytes(model, ids) / 2**20)
        out[impl] = row
    out["ratio"] = out["naive"][-1] / max(out["flash"][-1], 1e-9)
    return out


NO_GPU = "no GPU on this machine: FlashAttention's speed is measured on one"


def train_speed(checkpoint: Path, seq_lens: list[int], steps: int = 10, tokens: int = 16384) -> dict:
    """{"seq_lens", "flash", "naive" (tokens/s of a training step), "speedup" (flash over naive at the longest)}
    of the checkpoint's architecture (fresh weights, bf16 autocast, about `tokens` tokens a step), timed after
    two warm-up steps with the device synchronised; {"why": NO_GPU} without CUDA."""
    if not torch.cuda.is_available():
        return {"why": NO_GPU}
    cfg, device = CheckpointRecord.read(checkpoint).model, torch.device("cuda")
    out: dict = {"seq_lens": list(seq_lens), "device": torch.cuda.get_device_name(0)}
    for impl in ("flash", "naive"):
        row = []
        for t in seq_lens:
            config = dataclasses.replace(cfg, attention=impl, max_seq_len=max(t, cfg.max_seq_len))
            torch.manual_seed(0)
            model = build_model(config).to(device)
            ids = torch.randint(0, config.vocab_size, (max(1, tokens // t), t), device=device)
            for n in range(steps + 2):
                if n == 2:
                    torch.cuda.synchronize()
                    started = time.perf_counter()
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    logits = _logits(model, {"input_ids": ids})  # (B, T, V)
                    loss = F.cross_entropy(logits.flatten(0, 1).float(), ids.flatten())
                loss.backward()
                model.zero_grad(set_to_none=True)
            torch.cuda.synchronize()
            row.append(ids.numel() * steps / (time.perf_counter() - started))
        out[impl] = row
    out["speedup"] = out["flash"][-1] / out["naive"][-1]
    return out


@torch.no_grad()
def mask_leak(checkpoint: Path, batch: dict) -> float:
    """How much the logits at positions < T/2 change when the tokens from T/2 on are replaced: causal
    masking (GPT) or padding masking (BERT, those tokens marked as padding) must make it 0. Measured in
    train mode, as the model computes while it learns: a BatchNorm's training statistics are taken over
    every position of the batch, so later tokens reach earlier outputs there although eval mode (running
    statistics) hides it. Both forwards draw the same dropout masks. A BERT is compared on its encoder's
    output: in training its MLM head only ever sees the masked rows gathered from it, never padding."""
    model, cfg = load_model(checkpoint)
    model.train()
    ids = batch["input_ids"]  # (B, T)
    half = ids.shape[1] // 2
    other = ids.clone()
    other[:, half:] = torch.randint(0, cfg.vocab_size, other[:, half:].shape, generator=torch.Generator().manual_seed(0))
    keep = None
    if cfg.arch != "gpt":
        keep = torch.ones_like(ids, dtype=torch.bool)  # (B, T)
        keep[:, half:] = False

    def logits(x: torch.Tensor) -> torch.Tensor:
        with torch.random.fork_rng():
            torch.manual_seed(0)  # the same dropout masks for both inputs
            return model(x) if keep is None else model.encode(x, attention_mask=keep)  # (B, T, V) or (B, T, C)

    a, b = logits(ids), logits(other)
    return float((a[:, :half].float() - b[:, :half].float()).abs().max())


@torch.no_grad()
def decode_speed(checkpoint: Path, batch_sizes: list[int], context: int, new_tokens: int) -> dict:
    """{"kv_bytes_per_token": bf16 KV-cache bytes per token, "tokens_per_sec": {batch: rate}}: greedy
    decoding of `new_tokens` after a `context`-token prompt (random ids; speed does not depend on them), the
    best of two runs after a warm-up, prefill included, on this process's threads. What fewer key/value
    heads buy at inference: a smaller cache to read at every step."""
    from ..models import kv_cache_bytes_per_token
    from ..models.generation import generate

    model, cfg = load_model(checkpoint)
    model.eval()
    context = max(1, min(context, cfg.max_seq_len - new_tokens))
    rates = {}
    for batch in batch_sizes:
        prompts = torch.randint(0, cfg.vocab_size, (batch, context), generator=torch.Generator().manual_seed(0))
        prompts = prompts.tolist()
        generate(model, prompts, 2, temperature=0.0, min_new_tokens=2)  # warm-up: allocator, kernels
        best = math.inf
        for _ in range(2):
            started = time.perf_counter()
            generate(model, prompts, new_tokens, temperature=0.0, min_new_tokens=new_tokens)
            best = min(best, time.perf_counter() - started)
        rates[str(batch)] = batch * new_tokens / best
    return {"kv_bytes_per_token": kv_cache_bytes_per_token(cfg), "context": context, "new_tokens": new_tokens,
            "tokens_per_sec": rates}


@torch.no_grad()
def attention_logits(checkpoint: Path, batch: dict) -> float:
    """max |q·k · scale| over every self-attention layer, head and visible query-key pair of one batch (module
    doc), recomputed from each layer's input with the layer's own projections, QK-norm and RoPE."""
    from .mechanisms import model_inputs

    model, _ = load_model(checkpoint)
    model.eval()
    found: list[float] = []

    def hook(module: Attention, args: tuple, kwargs: dict, _out) -> None:
        if kwargs.get("context") is not None:  # cross-attention: no query-key growth to speak of here
            return
        x, mask = args[0], args[1]  # (B, T, C), AttnMask
        q = module.queries(x, kwargs.get("rope"))  # (B, H, T, D)
        k, _ = module.keys_values(x, kwargs.get("rope"))  # (B, H_kv, T, D)
        k = k.repeat_interleave(module.n_heads // module.n_kv_heads, dim=1)  # (B, H, T, D)
        scores = (q @ k.transpose(-2, -1)).float()  # (B, H, T, T)
        scores = scores / math.sqrt(q.shape[-1]) if module.scale is None else scores * module.scale
        seen = mask.tensor if mask.tensor is None or mask.tensor.dtype == torch.bool else mask.tensor.isfinite()
        scores = scores.abs() if seen is None else scores.abs().masked_fill(~seen, 0.0)  # (B, H, T, T)
        found.append(float(scores.amax()))

    handles = [m.register_forward_hook(hook, with_kwargs=True) for m in model.modules() if isinstance(m, Attention)]
    try:
        model_inputs(model, batch)  # under the checkpoint's own layout (its document mask)
    finally:
        for handle in handles:
            handle.remove()
    return max(found)
