"""GPT: decoder-only causal language model (GPT-2 layout when built with the `small` size).

token (+ learned/sinusoidal positions) -> n_layers causal blocks -> final norm (pre-LN) -> LM head,
tied to the token embedding when `tie_embeddings`. Incremental decoding writes each layer's keys/values
into a static `KVCache` at `start_pos`, a 0-dim tensor, and attends over the whole cache under a mask
whose positions, RoPE angles and ALiBi distances match, so cached decoding reproduces a full forward
(see base.py and kv_cache.py).
"""

from __future__ import annotations

from torch import Tensor, nn

from .config import ModelConfig
from .kv_cache import KVCache
from .layers import Embeddings, init_weights, make_norm
from .base import ModelBase, block_stack


class GPT(ModelBase):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg)
        self.embed = Embeddings(cfg)
        self.blocks = block_stack(cfg)  # one Block n_layers times with model.share_layers
        self.ln_f = make_norm(cfg) if cfg.norm_placement == "pre" else None  # post-LN blocks end normalised
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        init_weights(self, cfg)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.embed.tok.weight

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, kv_cache: KVCache | None = None,
                start_pos: Tensor | None = None, head: bool = True, doc_ids: Tensor | None = None,
                position_ids: Tensor | None = None) -> Tensor:
        """input_ids (B, T) at positions start_pos..start_pos+T -> logits (B, T, V).

        start_pos: None (position 0), or a 0-dim long tensor with a kv_cache (the decode step).
        attention_mask: (B, T) bool, True = real token; not with a kv_cache (every cached row is real).
        doc_ids (B, T): each token's document in a packed row; attention stays inside it (data.document_mask).
        position_ids (B, T): positions restarted at each document (data.reset_positions); None = 0..T-1.
        head=False returns the final hidden states (B, T, C) instead, for a training objective that fuses
        `lm_head` into its loss (trainer/fused_loss.py). It is a flag on forward rather than a separate
        method because FSDP gathers the root's parameters (embeddings, ln_f, lm_head) in forward's hooks.
        """
        T = input_ids.shape[1]
        start_pos = self._start(start_pos, T, kv_cache)
        x = self.embed(input_ids, start_pos, position_ids=position_ids)  # (B, T, C)
        masks, rope = self._decoder_inputs(x, start_pos, attention_mask, kv_cache, doc_ids, position_ids)  # once
        rows = self.norm_rows(attention_mask, T)  # BatchNorm only: the real tokens its statistics count
        for i, block in enumerate(self.blocks):
            cache = None if kv_cache is None else kv_cache.layers[i]
            x = block(x, masks[i], rope=rope, cache=cache, start_pos=start_pos, rows=rows)  # (B, T, C)
        x = self._final_norm(self.ln_f, x, rows)
        return self.lm_head(x) if head else x  # (B, T, V) or (B, T, C)
