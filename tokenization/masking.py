"""BERT masking as one pure function: same inputs and generator state give the same masked batch.

`mask_tokens` follows BERT (Devlin et al., 2019): of the maskable positions (non-special tokens) it
selects round(mask_prob * n) per sequence, at least one, uniformly without replacement (an exact count
rather than independent coin flips, as BERT's `create_masked_lm_predictions`, so short sequences are never
left without a target); then 80% of the selected become [MASK], 10% a random non-special token, 10% stay
unchanged. Labels hold the original id at selected positions and -100 elsewhere (ignored by the loss).

Whole-word masking selects *words* instead: all pieces of a word are masked together, words are taken in
random order until the target count is reached (the last word may overshoot by its length - 1).
`word_start_table` says which vocabulary entries begin a word for each tokenizer kind.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch

IGNORE_INDEX = -100  # label value the cross-entropy loss skips


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
    vocab_size: int,
    mask_prob: float,
    generator: torch.Generator,
    word_starts: torch.Tensor | None = None,
    special_ids: Sequence[int] = (),
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (masked input_ids, labels), both (B, T) int64; the inputs are not modified.

    input_ids: (B, T) ids. special_mask: (B, T) bool, True where the token must never be selected
    ([CLS], [SEP], padding). word_starts: (B, T) bool for whole-word masking (None = per token).
    special_ids: ids never drawn as the 10% random replacement.
    """
    B, T = input_ids.shape
    maskable = ~special_mask  # (B, T)
    n_maskable = maskable.sum(dim=1)  # (B,)
    target = torch.clamp((n_maskable.float() * mask_prob).round().long(), min=1)
    target = torch.where(n_maskable > 0, target, torch.zeros_like(target))  # (B,)
    if word_starts is None:
        unit = torch.arange(T).expand(B, T)  # every token is its own unit
    else:
        starts = word_starts | torch.roll(special_mask, 1, dims=1)  # after a special: a new word
        starts[:, 0] = True
        unit = torch.cumsum(starts.long(), dim=1) - 1  # (B, T) word index of each token
    score = torch.rand(B, T, generator=generator)  # one random key per unit, drawn per position
    unit_score = torch.gather(score, 1, unit)  # (B, T): all pieces of a word share their word's key
    unit_score = torch.where(maskable, unit_score, torch.full_like(unit_score, 2.0))  # specials last
    # Sort by unit key; the stable sort keeps a word's pieces adjacent, in position order.
    order = torch.argsort(unit_score, dim=1, stable=True)
    rank = torch.empty_like(order).scatter_(1, order, torch.arange(T).expand(B, T))  # (B, T)
    first_rank = torch.full((B, T), T, dtype=torch.long).scatter_reduce(1, unit, rank, reduce="amin")
    selected = (torch.gather(first_rank, 1, unit) < target[:, None]) & maskable  # (B, T)

    labels = torch.where(selected, input_ids, torch.full_like(input_ids, IGNORE_INDEX))
    action = torch.rand(B, T, generator=generator)  # < 0.8: [MASK]; < 0.9: random token; else keep
    allowed = torch.ones(vocab_size, dtype=torch.bool)
    allowed[list(special_ids)] = False
    candidates = torch.nonzero(allowed).squeeze(1)  # non-special ids to draw replacements from
    random_ids = candidates[torch.randint(len(candidates), (B, T), generator=generator)]
    out = torch.where(selected & (action < 0.8), torch.full_like(input_ids, mask_id), input_ids)
    out = torch.where(selected & (action >= 0.8) & (action < 0.9), random_ids, out)
    return out, labels
