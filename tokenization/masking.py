"""BERT masking as one vectorised, pure function: the same rows and keys give the same masked batch.

`mask_tokens` follows BERT (Devlin et al., 2019): of the maskable positions (non-special tokens) it
selects round(mask_prob * n) per sequence, at least one, uniformly without replacement (an exact count
rather than independent coin flips, as BERT's `create_masked_lm_predictions`, so short sequences are never
left without a target); then 80% of the selected become [MASK], 10% a random non-special token, 10% stay
unchanged (`replace`, the recipe's `objective.mask_replace`). Labels hold the original id at selected
positions and -100 elsewhere (ignored by the loss).

Whole-word masking selects *words* instead: all pieces of a word are masked together, words are taken in
random order until the target count is reached (the last word may overshoot by its length - 1).
`word_start_table` says which vocabulary entries begin a word for each tokenizer kind.

Randomness is counter-based: every random number is a hash of (row key, position, stream) (`uniform`),
so a whole batch is drawn in a few array operations, and row b's masks depend on its key alone: the same
on every rank, for any batch size, after any resume. (One seeded generator per row cost 92 ms per 256 x 128
batch, most of the time a BERT-base step takes on a GPU.)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch

from .mask_replace import MASK_REPLACE

IGNORE_INDEX = -100  # label value the cross-entropy loss skips
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)  # 2^64 / golden ratio: spreads consecutive counters apart


def _mix(z: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer on uint64: a bijection in which every input bit flips every output bit with
    probability about 1/2 (array arithmetic wraps modulo 2^64, as the hash needs)."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def row_keys(keys: Sequence[Sequence[int]]) -> np.ndarray:
    """(B,) uint64: one key per row from that row's integer tuple, e.g. (split, seed, batch, row)."""
    parts = np.asarray(keys, dtype=np.uint64).reshape(len(keys), -1)  # (B, K)
    key = np.zeros(len(keys), dtype=np.uint64)
    for j in range(parts.shape[1]):
        key = _mix(key ^ (parts[:, j] + np.uint64(int(_GOLDEN) * (j + 1) % 2**64)))
    return key


def uniform(keys: np.ndarray, length: int, stream: int) -> torch.Tensor:
    """(B, length) float64 in [0, 1): row b's numbers depend on keys[b], the position and `stream` only."""
    counter = np.arange(length, dtype=np.uint64) + np.uint64(stream << 32)  # (T,)
    z = _mix(keys[:, None] ^ _mix(counter * _GOLDEN)[None, :])  # (B, T)
    return torch.from_numpy((z >> np.uint64(11)).astype(np.float64) * 2.0**-53)


def replacement_ids(vocab_size: int, special_ids: Sequence[int]) -> torch.Tensor:
    """The ids a selected token may be replaced with at random (every non-special id), computed once."""
    allowed = torch.ones(vocab_size, dtype=torch.bool)
    allowed[list(special_ids)] = False
    return torch.nonzero(allowed).squeeze(1)  # (V - n_special,)


def word_start_table(vocab: Mapping[str, int], kind: str) -> np.ndarray:
    """(V,) bool: does this token begin a word? WordPiece: not `##...`; byte-level BPE: `Ġ...` (a leading
    space) or not alphanumeric (punctuation is its own word); Unigram: `▁...` or not alphanumeric.
    A token right after a special token always begins a word (handled by `mask_tokens`)."""
    table = np.ones(max(vocab.values()) + 1, dtype=bool)
    for token, i in vocab.items():
        if kind == "wordpiece":
            table[i] = not token.startswith("##")
        elif kind in ("bpe", "unigram"):
            marker = "Ġ" if kind == "bpe" else "▁"
            table[i] = token.startswith(marker) or not token[:1].isalnum()
    return table


def mask_tokens(
    input_ids: torch.Tensor,
    special_mask: torch.Tensor,
    *,
    mask_id: int,
    replacements: torch.Tensor,
    mask_prob: float,
    keys: np.ndarray,
    word_starts: torch.Tensor | None = None,
    replace: Sequence[float] = MASK_REPLACE,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (masked input_ids, labels), both (B, T) int64; the inputs are not modified.

    input_ids: (B, T) ids. special_mask: (B, T) bool, True where the token must never be selected
    ([CLS], [SEP], padding). replacements: the ids drawn for the 10% random replacement
    (`replacement_ids`). keys: (B,) uint64 row keys (`row_keys`). word_starts: (B, T) bool for whole-word
    masking (None = per token). replace: the shares of the selected tokens that become [MASK], a random
    token and stay unchanged (three non-negative numbers summing to 1, checked by `mask_replace_problem`).
    """
    B, T = input_ids.shape
    maskable = ~special_mask  # (B, T)
    n_maskable = maskable.sum(dim=1)  # (B,)
    target = torch.clamp((n_maskable.float() * mask_prob).round().long(), min=1)
    target = torch.where(n_maskable > 0, target, torch.zeros_like(target))  # (B,)
    score = uniform(keys, T, stream=0)  # (B, T): one random key per position
    if word_starts is None:  # the target[b] maskable positions of smallest key: a uniform sample
        score = torch.where(maskable, score, torch.full_like(score, 2.0))  # specials last
        k = int(target.max())
        chosen = torch.topk(score, k, dim=1, largest=False).indices  # (B, k), smallest key first
        selected = torch.zeros(B, T, dtype=torch.bool).scatter_(1, chosen, torch.arange(k) < target[:, None])
        selected &= maskable  # (B, T)
    else:
        selected = _whole_words(score, special_mask, word_starts, target)  # (B, T)

    labels = torch.where(selected, input_ids, torch.full_like(input_ids, IGNORE_INDEX))
    # The thresholds are replace[0] and 1 - replace[2], not replace[0] + replace[1]: 0.8 + 0.1 rounds to
    # 0.9000000000000001 and 1 - 0.1 to 0.9, the constant the default split has always used.
    to_mask, to_random = replace[0], 1.0 - replace[2]
    action = uniform(keys, T, stream=1)  # (B, T): < to_mask: [MASK]; < to_random: random token; else keep
    pick = (uniform(keys, T, stream=2) * len(replacements)).long().clamp_(max=len(replacements) - 1)  # (B, T)
    out = torch.where(selected & (action < to_mask), torch.full_like(input_ids, mask_id), input_ids)
    out = torch.where(selected & (action >= to_mask) & (action < to_random), replacements[pick], out)
    return out, labels


def _whole_words(score: torch.Tensor, special_mask: torch.Tensor, word_starts: torch.Tensor,
                 target: torch.Tensor) -> torch.Tensor:
    """(B, T) bool: words in random order (each word's key is its first piece's), all of a word's pieces
    together, until `target` tokens per row are reached."""
    B, T = score.shape
    maskable = ~special_mask
    starts = word_starts | torch.roll(special_mask, 1, dims=1)  # after a special: a new word
    starts[:, 0] = True
    unit = torch.cumsum(starts.long(), dim=1) - 1  # (B, T) word index of each token
    unit_score = torch.gather(score, 1, unit)  # (B, T): all pieces of a word share their word's key
    unit_score = torch.where(maskable, unit_score, torch.full_like(unit_score, 2.0))  # specials last
    # Sort by unit key; the stable sort keeps a word's pieces adjacent, in position order.
    order = torch.argsort(unit_score, dim=1, stable=True)
    rank = torch.empty_like(order).scatter_(1, order, torch.arange(T).expand(B, T))  # (B, T)
    first_rank = torch.full((B, T), T, dtype=torch.long).scatter_reduce(1, unit, rank, reduce="amin")
    return (torch.gather(first_rank, 1, unit) < target[:, None]) & maskable
