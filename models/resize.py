"""A vocabulary grown after pretraining (chat fine-tuning adds role tokens, tokenization/chat.py): the token
embedding and the LM head gain rows for the new ids.

A pure function from state dict to state dict, as the MHA -> GQA conversion is (models/convert.py). The new
rows start as the mean of the old ones: a new token then looks like an average token to the first layer and
is predicted with an average logit, instead of a random vector whose norm the trained rows never had (the
initialisation HF's `resize_token_embeddings(mean_resizing=True)` uses). A tied head is the same tensor as the
embedding and is stored once, so growing the embedding grows it.
"""

from __future__ import annotations

import torch
from torch import Tensor

VOCAB_ROWS = ("embed.tok.weight", "lm_head.weight")  # the GPT tensors indexed by token id


def grow_vocab(state: dict[str, Tensor], vocab_size: int) -> dict[str, Tensor]:
    """`state` with every token-indexed tensor grown to `vocab_size` rows, new rows the mean of the old."""
    out = dict(state)
    for name in VOCAB_ROWS:
        if name in state:
            old = state[name]  # (V_old, C)
            if vocab_size < old.shape[0]:
                raise ValueError(f"{name}: {old.shape[0]} rows, cannot shrink to {vocab_size}")
            mean = old.float().mean(dim=0, keepdim=True).to(old.dtype)  # (1, C)
            out[name] = torch.cat([old, mean.expand(vocab_size - old.shape[0], -1)])  # (V, C)
    return out
