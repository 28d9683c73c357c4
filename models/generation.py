"""Decoding: a handful of small functions over the static KV cache, as in gpt-fast.

`prefill` runs the prompt through the model once, filling the cache; `decode_one_token` feeds one token
per step at its position; `logits_to_probs` and `sample` turn the last logits into the next token.
`generate` is the loop around them for GPT and for the encoder-decoder's decoder (the source is encoded
once, its cross-attention keys/values are cached by the model on the first decoder call).

Prompts of different lengths in one batch. Left-padding would shift every shorter prompt to later
positions, which changes the output of learned and RoPE positions (and needs per-row position ids the
models do not take). Instead every row keeps its tokens at their true positions (0, 1, 2, ...): the batch
is prefilled up to the *shortest* prompt, and at each later step a row that still has prompt tokens left
is fed its own next prompt token instead of the sampled one (the "teacher-forced ragged prompt" of the
original LLaMA example). No padding ever enters the cache and each row sees only its own tokens, so a
batched row equals that prompt decoded alone for every position encoding (learned, sinusoidal, RoPE,
ALiBi); the price is that prompt tokens past the shortest length go through the one-token step.

Sampling is reproducible: one `torch.Generator` seeded by `seed` draws every sample, so the same seed,
model and prompts give the same tokens; `temperature=0` is greedy (argmax) and draws nothing.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..errors import ConfigError

OnToken = Callable[[int, int], None]  # on_token(row, token_id), called as each new token is chosen


def model_device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


def _forward(model: nn.Module, ids: Tensor, cache, start_pos: int, memory: Tensor | None,
             src_mask: Tensor | None) -> Tensor:
    """Logits (B, T, V) for tokens at positions start_pos.. with the cache: GPT, or the seq2seq decoder."""
    if memory is not None:
        return model.decode(ids, memory, src_mask=src_mask, kv_cache=cache, start_pos=start_pos)
    return model(ids, kv_cache=cache, start_pos=start_pos)


@torch.inference_mode()
def prefill(model: nn.Module, input_ids: Tensor, cache, *, memory: Tensor | None = None,
            src_mask: Tensor | None = None) -> Tensor:
    """Run input_ids (B, T) at positions 0..T-1, writing their keys/values into the cache.

    Returns the logits of the last position (B, V), from which the first new token is chosen.
    """
    return _forward(model, input_ids, cache, 0, memory, src_mask)[:, -1]  # (B, V)


@torch.inference_mode()
def decode_one_token(model: nn.Module, token: Tensor, cache, pos: int, *, memory: Tensor | None = None,
                     src_mask: Tensor | None = None) -> Tensor:
    """Feed token (B, 1) at position `pos` (attending to the cached 0..pos-1); return its logits (B, V)."""
    return _forward(model, token, cache, pos, memory, src_mask)[:, -1]  # (B, V)


def logits_to_probs(logits: Tensor, temperature: float = 1.0, top_k: int | None = None,
                    top_p: float | None = None) -> Tensor:
    """Next-token distribution (B, V) from logits (B, V): temperature, then top-k, then top-p (nucleus).

    top_k keeps the k most likely tokens. top_p keeps the smallest set of most likely tokens whose total
    probability reaches p (the most likely token is always kept). temperature <= 0 is the greedy limit:
    all mass on the argmax.
    """
    logits = logits.float()
    if temperature <= 0:
        return F.one_hot(logits.argmax(dim=-1), logits.shape[-1]).float()  # (B, V)
    # Shift so the largest logit is 0 before dividing: a tiny temperature then sends the others to -inf
    # (greedy in the limit) instead of overflowing everything to inf and giving NaN probabilities.
    logits = (logits - logits.max(dim=-1, keepdim=True).values) / temperature  # (B, V)
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]  # (B, 1): the k-th largest logit
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)  # (B, V)
    if top_p is not None and top_p < 1.0:
        sorted_probs, order = torch.sort(probs, dim=-1, descending=True)  # (B, V)
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs  # (B, V): mass of strictly likelier tokens
        drop_sorted = mass_before >= top_p  # the set already reached p without this token
        drop = drop_sorted.scatter(-1, order, drop_sorted)  # (B, V) back in vocabulary order
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def sample(probs: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """Draw one token id per row from probs (B, V); returns (B,)."""
    return torch.multinomial(probs, num_samples=1, generator=generator).squeeze(-1)  # (B,)


def next_token(logits: Tensor, temperature: float, top_k: int | None, top_p: float | None,
               generator: torch.Generator | None) -> Tensor:
    """Choose the next token (B,) from logits (B, V): argmax when greedy, else a sample."""
    if temperature <= 0:
        return logits.argmax(dim=-1)  # (B,)
    return sample(logits_to_probs(logits, temperature, top_k, top_p), generator)


def check_sampling(temperature: float, top_k: int | None, top_p: float | None, max_new_tokens: int) -> None:
    """Reject impossible sampling settings with the option they came from."""
    if not math.isfinite(temperature) or temperature < 0:
        raise ConfigError(f"--temperature must be >= 0 (0 = greedy), got {temperature}")
    if top_k is not None and top_k < 1:
        raise ConfigError(f"--top-k must be >= 1, got {top_k}")
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise ConfigError(f"--top-p must be in (0, 1], got {top_p}")
    if max_new_tokens < 0:
        raise ConfigError(f"--max-new-tokens must be >= 0, got {max_new_tokens}")


def encode_source(model: nn.Module, source_ids: list[list[int]], pad_id: int) -> tuple[Tensor, Tensor]:
    """Encode the source sentences once: right-padded ids with a key-padding mask -> (memory, src_mask).

    Padding is harmless here (unlike in the decoder prompt) because the encoder and cross-attention
    mask it out, and the decoder's positions do not depend on the source length.
    """
    device = model_device(model)
    width = max(len(s) for s in source_ids)
    src = torch.full((len(source_ids), width), pad_id, dtype=torch.long, device=device)  # (B, S)
    src_mask = torch.zeros(len(source_ids), width, dtype=torch.bool, device=device)  # (B, S)
    for row, ids in enumerate(source_ids):
        src[row, : len(ids)] = torch.tensor(ids, dtype=torch.long, device=device)
        src_mask[row, : len(ids)] = True
    with torch.inference_mode():
        return model.encode(src, src_mask), src_mask  # (B, S, D), (B, S)


@torch.inference_mode()
def generate(model: nn.Module, prompt_ids: list[list[int]], max_new_tokens: int, *,
             temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
             eos_id: int | None = None, seed: int | None = None, on_token: OnToken | None = None,
             source_ids: list[list[int]] | None = None, pad_id: int = 0,
             min_new_tokens: int = 0) -> list[list[int]]:
    """Continue each prompt by up to max_new_tokens tokens; returns only the new tokens of each row.

    A row stops at `eos_id` (which is not included in its output) or when it reaches
    `model.config.max_seq_len` tokens in total. Until a row has `min_new_tokens` new tokens, `eos_id` is
    never chosen (a small model often ends a document at once). `on_token(row, token_id)` is called for every new token
    as soon as it is chosen (streaming). For the encoder-decoder pass `source_ids` (one source per row);
    `prompt_ids` are then the decoder prompts, usually `[[bos_id]]` per row, and `pad_id` pads the source.
    """
    cfg = model.config
    if cfg.arch == "bert":
        raise ConfigError("--prompt: BERT does not generate left to right; use --fill-mask \"... [MASK] ...\"")
    check_sampling(temperature, top_k, top_p, max_new_tokens)
    if not prompt_ids or any(len(p) == 0 for p in prompt_ids):
        raise ConfigError("--prompt: every prompt needs at least one token")
    lengths = [len(p) for p in prompt_ids]
    if max(lengths) > cfg.max_seq_len:
        raise ConfigError(
            f"--prompt: a prompt has {max(lengths)} tokens but the model's max_seq_len is {cfg.max_seq_len}"
        )
    if (source_ids is not None) != (cfg.arch == "transformer"):
        raise ConfigError(f"source_ids must be given exactly when the model is an encoder-decoder (arch={cfg.arch})")
    if source_ids is not None and len(source_ids) != len(prompt_ids):
        raise ConfigError(f"{len(source_ids)} sources for {len(prompt_ids)} decoder prompts; give one per row")
    if not 0 <= min_new_tokens <= max_new_tokens:
        raise ConfigError(f"--min-new-tokens: got {min_new_tokens}, expected 0 to --max-new-tokens ({max_new_tokens})")
    if max_new_tokens == 0:
        return [[] for _ in prompt_ids]

    was_training = model.training
    model.eval()
    device = model_device(model)
    B, total = len(prompt_ids), min(cfg.max_seq_len, max(lengths) + max_new_tokens)
    tokens = torch.zeros(B, total, dtype=torch.long, device=device)  # (B, S): prompts at true positions
    for row, ids in enumerate(prompt_ids):
        tokens[row, : len(ids)] = torch.tensor(ids, dtype=torch.long, device=device)
    lengths_t = torch.tensor(lengths, device=device)  # (B,)
    stop_at = [min(n + max_new_tokens, total) for n in lengths]  # first position a row may not fill
    memory, src_mask = encode_source(model, source_ids, pad_id) if source_ids is not None else (None, None)
    cache = model.new_kv_cache(B, total, device=device, dtype=next(model.parameters()).dtype)
    generator = None
    if seed is not None:
        generator = torch.Generator(device=device).manual_seed(seed)

    outputs: list[list[int]] = [[] for _ in range(B)]  # new tokens only; EOS is not included
    done = [n >= stop for n, stop in zip(lengths, stop_at)]
    start = min(lengths)
    logits = prefill(model, tokens[:, :start], cache, memory=memory, src_mask=src_mask)  # (B, V)
    for pos in range(start, total):
        if min_new_tokens and eos_id is not None:  # rows short of min_new_tokens may not end yet
            too_early = (pos - lengths_t) < min_new_tokens  # (B,)
            logits[:, eos_id] = logits[:, eos_id].masked_fill(too_early, float("-inf"))
        chosen = next_token(logits, temperature, top_k, top_p, generator)  # (B,)
        chosen = torch.where(pos < lengths_t, tokens[:, pos], chosen)  # rows still in their prompt
        tokens[:, pos] = chosen
        for row, tok in enumerate(chosen.tolist()):
            if done[row] or pos < lengths[row]:
                continue
            if eos_id is not None and tok == eos_id:
                done[row] = True
                continue
            outputs[row].append(tok)
            if on_token is not None:
                on_token(row, tok)
            done[row] = pos + 1 >= stop_at[row]
        if all(done):
            break
        logits = decode_one_token(model, chosen[:, None], cache, pos, memory=memory, src_mask=src_mask)
    model.train(was_training)
    return outputs


@torch.inference_mode()
def fill_mask(model: nn.Module, tokenizer, text_with_mask: str, top_k: int = 5) -> list[list[tuple[str, float]]]:
    """BERT's guesses for each mask in the text: per mask (left to right), the top_k (token, probability).

    The mask may be written as `[MASK]` whatever the tokenizer's own mask token is (`<mask>` for unigram).
    The text is encoded with the tokenizer's special tokens (`[CLS] ... [SEP]`), as in MLM training.
    """
    cfg = model.config
    if cfg.arch != "bert":
        raise ConfigError(f"--fill-mask needs a BERT (masked LM) checkpoint; this one is arch={cfg.arch}")
    if tokenizer.mask_id is None:
        raise ConfigError("--fill-mask: the checkpoint's tokenizer has no mask token")
    if top_k < 1:
        raise ConfigError(f"--top-k must be >= 1, got {top_k}")
    mask_token = tokenizer.id_to_token(tokenizer.mask_id)
    ids = tokenizer.encode(text_with_mask.replace("[MASK]", mask_token), add_special_tokens=True)
    positions = [i for i, t in enumerate(ids) if t == tokenizer.mask_id]
    if not positions:
        raise ConfigError(f"--fill-mask: the text has no {mask_token} to fill, e.g. \"The {mask_token} sat.\"")
    if len(ids) > cfg.max_seq_len:
        raise ConfigError(f"--fill-mask: the text has {len(ids)} tokens but the model's max_seq_len is {cfg.max_seq_len}")
    was_training = model.training
    model.eval()
    input_ids = torch.tensor([ids], device=model_device(model))  # (1, T)
    hidden = model.encode(input_ids)  # (1, T, D)
    probs = torch.softmax(model.mlm_logits(hidden[0, positions]).float(), dim=-1)  # (N_mask, V)
    top = torch.topk(probs, min(top_k, probs.shape[-1]), dim=-1)
    model.train(was_training)
    return [
        [(tokenizer.decode([i], skip_special_tokens=False), p) for i, p in zip(row_ids, row_p)]
        for row_ids, row_p in zip(top.indices.tolist(), top.values.tolist())
    ]
