"""Log-likelihoods of continuations given a context, as lm-evaluation-harness computes them, with the
context run through the model once for all of its continuations.

Framing is lm-eval's for a causal model (`_encode_pair`): trailing spaces of the context move to the
continuation, `context + continuation` is encoded whole, and the continuation is what follows the
context's own tokens. Both start with the tokenizer's document prefix (the separator, or Llama's BOS),
the ids a prompt is framed with (`models.framing.frame_prompt`) and the ids `tfkit export-hf`'s
tokenizer adds to a text, so lm-eval's HF backend on an exported checkpoint scores the same tokens.

Sharing: a multiple-choice item's choices follow one context. The contexts of up to `batch_size` items
(taken in order of length) are run as one right-padded batch into a KV cache (right padding leaves every
real position as it was); each context's cache rows are then copied once per choice, and the choices of
contexts of one length (one start position) run together, up to `batch_size` rows, from the end of
their contexts: a context's tokens are computed once instead of once per choice. A choice of one token
needs no second forward at all: its distribution is the context's last. An item whose context and
longest choice do not fit the model's max_seq_len is scored choice by choice, each sequence cut from the
left to max_seq_len + 1 tokens, as lm-eval cuts it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..errors import DataError
from ..models.generation import model_device
from ..tokenization.train import TfkitTokenizer

Pair = tuple[list[int], list[int]]  # (context ids, continuation ids)


@dataclass(frozen=True)
class Group:
    """One context and the continuations scored after it (the choices of one item)."""

    context: list[int]
    continuations: list[list[int]]


def encode_pair(tokenizer: TfkitTokenizer, context: str, continuation: str, prefix: list[int] | None = None) -> Pair:
    """lm-eval's split of a (context, continuation) pair into token ids (module docstring); `prefix`: the
    tokenizer's document prefix, passed when known."""
    prefix = tokenizer.document_prefix() if prefix is None else prefix
    spaces = len(context) - len(context.rstrip())
    if spaces:
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    if not context:  # the document prefix alone is the context (lm-eval's prefix token)
        ids = tokenizer.encode(continuation)
        return (prefix, ids) if prefix else (ids[:1], ids[1:])
    whole = prefix + tokenizer.encode(context + continuation)
    context_ids = prefix + tokenizer.encode(context)
    return context_ids, whole[len(context_ids):]


def fits(group: Group, max_len: int) -> bool:
    """Whether a group's context and longest continuation fit `max_len` (else it is scored apart, cut)."""
    longest = max(len(c) for c in group.continuations)
    return len(group.context) + longest - 1 <= max_len and all(group.continuations)


class ContinuationScorer:
    """(log-likelihood, greedy) of each continuation given its context, for one causal model and tokenizer.

    `greedy` is lm-eval's `is_greedy`: every continuation token is the model's argmax at its position
    (LAMBADA's accuracy). `batch_size` bounds the rows of every forward: contexts per prefill, choices per
    choice forward."""

    def __init__(self, model: nn.Module, tokenizer: TfkitTokenizer, batch_size: int = 8,
                 autocast: Callable = nullcontext, max_len: int | None = None) -> None:
        self.model, self.tokenizer, self.batch_size, self.autocast = model, tokenizer, batch_size, autocast
        self.max_len = max_len or model.config.max_seq_len
        self.prefix = tokenizer.document_prefix()
        self.device = model_device(model)

    def encode_pair(self, context: str, continuation: str) -> Pair:
        """lm-eval's split of a (context, continuation) pair into token ids (module docstring)."""
        return encode_pair(self.tokenizer, context, continuation, self.prefix)

    def score(self, groups: Sequence[Group], part: tuple[int, int] = (0, 1)) -> list[list[tuple[float, bool]]]:
        """Per group, per continuation: (log-likelihood in nats, greedy), in the order given.

        `part` = (rank, world): only this process's share, None for the others' groups: the batches one process
        would run, every world-th of them, and every world-th group scored apart, so each score is bit for bit
        the one a single process computes (the training loop under torchrun, evaluation/inloop.py)."""
        rank, world = part
        results: list[list[tuple[float, bool]] | None] = [None] * len(groups)
        fitting = [fits(g, self.max_len) for g in groups]
        shared = sorted((i for i in range(len(groups)) if fitting[i]), key=lambda i: len(groups[i].context))
        for k, start in enumerate(range(0, len(shared), self.batch_size)):  # by length: equal lengths together
            if k % world != rank:
                continue
            chunk = shared[start:start + self.batch_size]
            for i, scores in zip(chunk, self._score_shared([groups[i] for i in chunk])):
                results[i] = scores
        for k, i in enumerate(i for i in range(len(groups)) if not fitting[i]):
            if k % world == rank:
                results[i] = self._score_apart(groups[i])
        return results  # type: ignore[return-value]

    @torch.inference_mode()
    def _score_shared(self, groups: list[Group]) -> list[list[tuple[float, bool]]]:
        """Contexts in one forward, then the choices of contexts of one length together from the cache."""
        lengths = [len(g.context) for g in groups]
        cache = self.model.new_kv_cache(len(groups), max(lengths), device=self.device, dtype=self._cache_dtype())
        with self.autocast():  # the head only where a choice's first token is predicted: each context's end
            hidden = self.model(self._padded([g.context for g in groups]), kv_cache=cache, head=False)  # (G, L, C)
            ends = torch.tensor(lengths, device=self.device) - 1  # (G,)
            firsts = self.model.lm_head(hidden[torch.arange(len(groups), device=self.device), ends])  # (G, V)
        firsts = firsts.float().log_softmax(-1)  # (G, V): each context's next-token distribution
        out: list[list] = [[None] * len(g.continuations) for g in groups]
        by_length: dict[int, list[tuple[int, int]]] = {}  # context length -> (group, choice) still to run
        for g, group in enumerate(groups):
            for n, ids in enumerate(group.continuations):
                if len(ids) == 1:  # the context's last distribution is all a one-token choice needs
                    out[g][n] = _sum_and_greedy(firsts[g][None], ids)
                else:
                    by_length.setdefault(lengths[g], []).append((g, n))
        for length, pending in by_length.items():
            for start in range(0, len(pending), self.batch_size):
                rows = pending[start:start + self.batch_size]
                choices = [groups[g].continuations[n] for g, n in rows]
                for (g, n), ids, after in zip(rows, choices, self._after_choices(cache, length, rows, choices)):
                    out[g][n] = _sum_and_greedy(torch.cat([firsts[g][None], after]), ids)
        return out

    def _after_choices(self, cache, length: int, rows: list[tuple[int, int]], choices: list[list[int]]) -> list[Tensor]:
        """Per choice, the log-probabilities (len - 1, V) after each of its tokens but the last, from its
        context's rows of the cache (every context here is `length` long); the head runs on real tokens only."""
        width = max(len(c) for c in choices) - 1
        mine = self.model.new_kv_cache(len(rows), length + width, device=self.device, dtype=self._cache_dtype())
        contexts = torch.tensor([g for g, _ in rows], device=self.device)  # (R,): each choice's context row
        for to, source in zip(mine.layers, cache.layers):  # each context's keys/values, once per choice
            to.k[:, :, :length] = source.k[contexts, :, :length]  # (R, H_kv, L, D)
            to.v[:, :, :length] = source.v[contexts, :, :length]
        real = torch.zeros(len(rows), width, dtype=torch.bool)  # (R, W)
        for r, ids in enumerate(choices):
            real[r, :len(ids) - 1] = True
        with self.autocast():
            hidden = self.model(self._padded([c[:-1] for c in choices], width), kv_cache=mine,
                                start_pos=torch.tensor(length, device=self.device),
                                head=False)  # (R, W, C)
            logits = self.model.lm_head(hidden[real.to(self.device)])  # (sum of len - 1, V)
        return list(logits.float().log_softmax(-1).split([len(c) - 1 for c in choices]))

    @torch.inference_mode()
    def _score_apart(self, group: Group) -> list[tuple[float, bool]]:
        """Each continuation as its own sequence, cut from the left to max_len + 1 tokens (lm-eval's rule)."""
        scores = []
        for ids in group.continuations:
            if len(ids) > self.max_len:
                raise DataError(f"a continuation of {len(ids)} tokens ({self.tokenizer.decode(ids)[:60]!r}...) is "
                                f"longer than the model's max_seq_len ({self.max_len}): it cannot be scored")
            whole = (group.context + ids)[-(self.max_len + 1):]
            with self.autocast():
                logits = self.model(torch.tensor([whole[:-1]], device=self.device))  # (1, T, V)
            end = len(whole) - 1
            dists = logits[0, end - len(ids):end].float().log_softmax(-1)  # (len(ids), V)
            scores.append(_sum_and_greedy(dists, ids))
        return scores

    def _padded(self, rows: list[list[int]], width: int | None = None) -> Tensor:
        """Right-padded ids (B, width): padding after a row's tokens never changes a causal model's outputs
        at them."""
        width = width or max(len(r) for r in rows)
        ids = torch.zeros(len(rows), width, dtype=torch.long)  # (B, T)
        for b, row in enumerate(rows):
            ids[b, :len(row)] = torch.tensor(row, dtype=torch.long)
        return ids.to(self.device)

    def _cache_dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype


def _sum_and_greedy(logprobs: Tensor, ids: list[int]) -> tuple[float, bool]:
    """(sum of log p(ids[t]) under logprobs[t], whether every ids[t] is the argmax): logprobs (T, V)."""
    target = torch.tensor(ids, device=logprobs.device)  # (T,)
    picked = logprobs.gather(-1, target[:, None]).squeeze(-1)  # (T,)
    greedy = bool((logprobs.argmax(-1) == target).all())
    return float(picked.sum()), greedy
