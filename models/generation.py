"""Decoding: a handful of small functions over the static KV cache, as in gpt-fast.

`prefill` runs the prompt through the model once, filling the cache (variable length, eager);
`decode_step` feeds one token per row at a position given as a 0-dim tensor, reading the whole
preallocated cache under a mask, so every step has the same shapes, the same graph and no host read: it
is what `generate(compile=True)` compiles (`compiled`: CUDA graphs on CUDA). `logits_to_probs` and
`sample` turn the last logits into the next token. `generate` is the loop around them for GPT and for the
encoder-decoder's decoder (the source is encoded once, its cross-attention keys/values are cached by the
model during the prefill). Text goes in and out through `framing.py`: `frame_prompt` / `frame_chat` turn
it into prompt ids, `continuation` new ids back into the text that follows the prompt.

The loop reads the device once per step at most, and only for the caller: the chosen tokens for
`on_token` (streaming) and whether every row has ended when `eos_id` can end them. Without either, the
new tokens stay on the device until the end.

Prompts of different lengths in one batch. Left-padding would shift every shorter prompt to later
positions, which changes the output of learned and RoPE positions (and needs per-row position ids the
models do not take). Instead every row keeps its tokens at their true positions (0, 1, 2, ...): the batch
is prefilled up to the *shortest* prompt, and at each later step a row that still has prompt tokens left
is fed its own next prompt token instead of the sampled one (the "teacher-forced ragged prompt" of the
original LLaMA example). No padding ever enters the cache and each row sees only its own tokens, so a
batched row equals that prompt decoded alone for every position encoding (learned, sinusoidal, RoPE,
ALiBi); the price is that prompt tokens past the shortest length go through the one-token step.
Every row is at the same position at every step, so one 0-dim position tensor serves the whole batch.

Sampling is reproducible: one `torch.Generator` seeded by `seed` draws every sample, so the same seed,
model and prompts give the same tokens; `temperature=0` is greedy (argmax) and draws nothing.
"""

from __future__ import annotations

import math
import warnings
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..errors import ConfigError
from .streaming_decode import streaming

class CompileWarning(UserWarning):
    """`compile=True` could not compile the decode step here; decoding went on uncompiled (a tfkit warning:
    the CLI prints it as one line)."""


OnToken = Callable[[int, int], None]  # on_token(row, token_id), called as each new token is chosen
Step = Callable[..., Tensor]  # decode_step's signature, compiled or not


def model_device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


def _forward(model: nn.Module, ids: Tensor, cache, start_pos: Tensor | None, memory: Tensor | None,
             src_mask: Tensor | None) -> Tensor:
    """Logits (B, T, V) for tokens at positions start_pos.. (None = 0) with the cache: GPT, or the seq2seq
    decoder."""
    if memory is not None:
        return model.decode(ids, memory, src_mask=src_mask, kv_cache=cache, start_pos=start_pos)
    return model(ids, kv_cache=cache, start_pos=start_pos)


@torch.inference_mode()
def prefill(model: nn.Module, input_ids: Tensor, cache, *, memory: Tensor | None = None,
            src_mask: Tensor | None = None) -> Tensor:
    """Run input_ids (B, T) at positions 0..T-1, writing their keys/values into the cache.

    Returns the logits of the last position (B, V), from which the first new token is chosen. Its shapes
    depend on T, so it runs eagerly, once per generation.
    """
    return _forward(model, input_ids, cache, None, memory, src_mask)[:, -1]  # (B, V)


@torch.no_grad()
def decode_step(model: nn.Module, token: Tensor, pos: Tensor, cache, memory: Tensor | None = None,
                src_mask: Tensor | None = None) -> Tensor:
    """The static decode step: token (B, 1) at position pos (0-dim long tensor) -> its logits (B, V).

    Writes the token's keys/values into the cache at pos and attends over the whole cache (B, H_kv, S_max,
    D) under a mask, so the shapes are the same at every position and nothing is read on the host: this is
    the function `generate(compile=True)` compiles into one graph. The caller keeps pos < cache.max_len.
    Without gradients, as `prefill`: the cache it reads was filled in inference mode (the encoder memory's
    cross-attention keys/values are inference tensors), which autograd could not save for a backward.
    """
    return _forward(model, token, cache, pos, memory, src_mask)[:, -1]  # (B, V)


def compiled(step: Step, device: torch.device) -> Step:
    """`step` under torch.compile as one graph: mode reduce-overhead on CUDA (a CUDA graph, one launch per
    token); on the CPU the default mode, traced under `StreamingDecode` (one-row products and one-query
    attention as reductions inductor streams at memory speed, streaming_decode.py). torch.compile is lazy,
    so a failure shows on the first call: then, or when torch.compile is unavailable, one warning and the
    eager `step` from then on."""
    def uncompiled(exc: Exception) -> Step:
        reason = (str(exc).strip().splitlines() or [""])[0][:200]
        warnings.warn(f"compile: torch.compile failed ({type(exc).__name__}: {reason}); decoding uncompiled",
                      CompileWarning, stacklevel=3)
        return step

    try:
        if device.type == "cuda":
            graph = torch.compile(step, mode="reduce-overhead", fullgraph=True)
        elif device.type == "cpu":  # the rewrite was measured on CPUs only (benchmarks/RESULTS.md)
            graph = torch.compile(streaming(step), fullgraph=True)
        else:
            graph = torch.compile(step, fullgraph=True)
    except Exception as exc:  # noqa: BLE001 - any failure to compile means: decode eagerly
        return uncompiled(exc)
    current = graph

    def run(*args) -> Tensor:
        nonlocal current
        if current is graph:
            try:
                if device.type == "cuda":
                    torch.compiler.cudagraph_mark_step_begin()  # the last step's outputs may be overwritten
                return graph(*args)
            except Exception as exc:  # noqa: BLE001
                current = uncompiled(exc)
        return current(*args)

    return run


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
    """Reject impossible sampling settings, naming the parameter at fault."""
    if not math.isfinite(temperature) or temperature < 0:
        raise ConfigError(f"temperature must be >= 0 (0 = greedy), got {temperature}", params=("temperature",))
    if top_k is not None and top_k < 1:
        raise ConfigError(f"top_k must be >= 1, got {top_k}", params=("top_k",))
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise ConfigError(f"top_p must be in (0, 1], got {top_p}", params=("top_p",))
    if max_new_tokens < 0:
        raise ConfigError(f"max_new_tokens must be >= 0, got {max_new_tokens}", params=("max_new_tokens",))


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


def check_generate(cfg, prompt_ids: list[list[int]], max_new_tokens: int, min_new_tokens: int,
                   source_ids: list[list[int]] | None) -> None:
    """Reject prompts and lengths `generate` cannot serve, naming the parameter at fault."""
    if cfg.arch == "bert":
        raise ConfigError("prompt_ids: BERT does not generate left to right; use fill_mask \"... [MASK] ...\"",
                          params=("prompt_ids", "fill_mask"))
    if not prompt_ids or any(len(p) == 0 for p in prompt_ids):
        raise ConfigError("prompt_ids: every prompt needs at least one token", params=("prompt_ids",))
    longest = max(len(p) for p in prompt_ids)
    if longest > cfg.max_seq_len:
        raise ConfigError(f"prompt_ids: a prompt has {longest} tokens but the model's max_seq_len is {cfg.max_seq_len}",
                          params=("prompt_ids",))
    if (source_ids is not None) != (cfg.arch == "transformer"):
        raise ConfigError(f"source_ids must be given exactly when the model is an encoder-decoder (arch={cfg.arch})")
    if source_ids is not None and len(source_ids) != len(prompt_ids):
        raise ConfigError(f"{len(source_ids)} sources for {len(prompt_ids)} decoder prompts; give one per row")
    if source_ids is not None and max(map(len, source_ids)) > cfg.max_seq_len:
        raise ConfigError(f"source_ids: a source has {max(map(len, source_ids))} tokens but the model's max_seq_len "
                          f"is {cfg.max_seq_len}", params=("source_ids",))
    if not 0 <= min_new_tokens <= max_new_tokens:
        raise ConfigError(f"min_new_tokens: got {min_new_tokens}, expected 0 to max_new_tokens ({max_new_tokens})",
                          params=("min_new_tokens", "max_new_tokens"))


def _prompt_grid(prompt_ids: list[list[int]], total: int, device: torch.device) -> Tensor:
    """The prompts at their true positions in a (B, total) grid the loop fills with new tokens."""
    tokens = torch.zeros(len(prompt_ids), total, dtype=torch.long, device=device)  # (B, S)
    for row, ids in enumerate(prompt_ids):
        tokens[row, : len(ids)] = torch.tensor(ids, dtype=torch.long, device=device)
    return tokens


def _hold_eos(logits: Tensor, eos_id: int, new_so_far: Tensor, min_new_tokens: int) -> Tensor:
    """logits (B, V) with eos_id ruled out for rows that have fewer than min_new_tokens new tokens."""
    logits = logits.clone()  # a compiled step's output is its graph's buffer: not written in place
    logits[:, eos_id] = logits[:, eos_id].masked_fill(new_so_far < min_new_tokens, float("-inf"))
    return logits


@torch.inference_mode()
def generate(model: nn.Module, prompt_ids: list[list[int]], max_new_tokens: int, *,
             temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
             eos_id: int | None = None, seed: int | None = None, on_token: OnToken | None = None,
             source_ids: list[list[int]] | None = None, pad_id: int = 0,
             min_new_tokens: int = 0, compile: bool = False) -> list[list[int]]:
    """Continue each prompt by up to max_new_tokens tokens; returns only the new tokens of each row.

    A row stops at `eos_id` (which is not included in its output) or when it reaches
    `model.config.max_seq_len` tokens in total. Until a row has `min_new_tokens` new tokens, `eos_id` is
    never chosen (a small model often ends a document at once). `on_token(row, token_id)` is called for
    every new token as soon as it is chosen (streaming). For the encoder-decoder pass `source_ids` (one
    source per row); `prompt_ids` are then the decoder prompts, usually `[[bos_id]]` per row, and `pad_id`
    pads the source. `compile=True` runs the decode step through torch.compile (`compiled`): the same
    tokens, up to float rounding of near-ties.

    Host reads: one per step, and only when `on_token` or `eos_id` needs the step's tokens or whether every
    row has ended; otherwise none until the end, where the new tokens are read from the device at once.
    """
    cfg = model.config
    check_sampling(temperature, top_k, top_p, max_new_tokens)
    check_generate(cfg, prompt_ids, max_new_tokens, min_new_tokens, source_ids)
    if max_new_tokens == 0:
        return [[] for _ in prompt_ids]
    was_training = model.training
    model.eval()
    device = model_device(model)
    lengths = [len(p) for p in prompt_ids]
    B, total = len(prompt_ids), min(cfg.max_seq_len, max(lengths) + max_new_tokens)
    tokens = _prompt_grid(prompt_ids, total, device)  # (B, S)
    stop_at = [min(n + max_new_tokens, total) for n in lengths]  # first position a row may not fill
    lengths_t, stop_at_t = torch.tensor(lengths, device=device), torch.tensor(stop_at, device=device)  # (B,) x2
    memory, src_mask = encode_source(model, source_ids, pad_id) if source_ids is not None else (None, None)
    cache = model.new_kv_cache(B, total, device=device, dtype=next(model.parameters()).dtype)
    if compile:
        cache.mark_static()
    step = compiled(decode_step, device) if compile else decode_step
    generator = None if seed is None else torch.Generator(device=device).manual_seed(seed)

    done = lengths_t >= stop_at_t  # (B,): rows that have ended (on the device: read once per step at most)
    position = torch.zeros((), dtype=torch.long, device=device)  # the step's position, rewritten in place
    start = end = min(lengths)
    logits = prefill(model, tokens[:, :start], cache, memory=memory, src_mask=src_mask)  # (B, V)
    for pos in range(start, total):
        end = pos + 1
        if min_new_tokens and eos_id is not None:
            logits = _hold_eos(logits, eos_id, pos - lengths_t, min_new_tokens)
        chosen = next_token(logits, temperature, top_k, top_p, generator)  # (B,)
        chosen = torch.where(pos < lengths_t, tokens[:, pos], chosen)  # rows still in their prompt
        tokens[:, pos] = chosen
        if on_token is not None or eos_id is not None:
            done, all_done = _report(chosen, pos, lengths_t, stop_at_t, done, eos_id, on_token)
            if all_done:
                break
        if pos + 1 < total:
            position.fill_(pos)
            logits = step(model, chosen[:, None], position, cache, memory, src_mask)  # (B, V)
    model.train(was_training)
    return [_until_eos(row[n:min(stop, end)], eos_id) for row, n, stop in zip(tokens.tolist(), lengths, stop_at)]


def _report(chosen: Tensor, pos: int, lengths: Tensor, stop_at: Tensor, done: Tensor, eos_id: int | None,
            on_token: OnToken | None) -> tuple[Tensor, bool]:
    """After a step: the rows that have ended (B,) and whether all have, with `on_token` called for each
    row's new token. The step's one host read."""
    new = ~done & (pos >= lengths)  # (B,): rows that chose a new token at pos
    if eos_id is not None:
        ended = new & (chosen == eos_id)  # (B,)
        done, new = done | ended, new & ~ended
    done = done | (new & (pos + 1 >= stop_at))
    picked, news, dones = torch.stack([chosen, new.long(), done.long()]).tolist()
    if on_token is not None:
        for row, token in enumerate(picked):
            if news[row]:
                on_token(row, token)
    return done, all(dones)


def _until_eos(ids: list[int], eos_id: int | None) -> list[int]:
    """A row's new tokens up to (without) the first eos_id: where the row ended."""
    return ids[: ids.index(eos_id)] if eos_id is not None and eos_id in ids else ids


@torch.inference_mode()
def fill_mask(model: nn.Module, tokenizer, text_with_mask: str, top_k: int = 5) -> list[list[tuple[str, float]]]:
    """BERT's guesses for each mask in the text: per mask (left to right), the top_k (token, probability).

    The mask may be written as `[MASK]` whatever the tokenizer's own mask token is (`<mask>` for unigram).
    The text is encoded with the tokenizer's special tokens (`[CLS] ... [SEP]`), as in MLM training.
    """
    cfg = model.config
    if cfg.arch != "bert":
        raise ConfigError(f"text_with_mask needs a BERT (masked LM) checkpoint; this one is arch={cfg.arch}",
                          params=("text_with_mask",))
    if tokenizer.mask_id is None:
        raise ConfigError("text_with_mask: the checkpoint's tokenizer has no mask token", params=("text_with_mask",))
    if top_k < 1:
        raise ConfigError(f"top_k must be >= 1, got {top_k}", params=("top_k",))
    mask_token = tokenizer.id_to_token(tokenizer.mask_id)
    ids = tokenizer.encode(text_with_mask.replace("[MASK]", mask_token), add_special_tokens=True)
    positions = [i for i, t in enumerate(ids) if t == tokenizer.mask_id]
    if not positions:
        raise ConfigError(f"text_with_mask: the text has no {mask_token} to fill, e.g. \"The {mask_token} sat.\"",
                          params=("text_with_mask",))
    if len(ids) > cfg.max_seq_len:
        raise ConfigError(f"text_with_mask: the text has {len(ids)} tokens but the model's max_seq_len is "
                          f"{cfg.max_seq_len}", params=("text_with_mask",))
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
