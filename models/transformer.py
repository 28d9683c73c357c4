"""The original encoder-decoder Transformer ("Attention Is All You Need"), built from the shared `Block`
and `ModelBase` of models/base.py."""

from __future__ import annotations

from torch import Tensor, nn

from .attention import cross_attention_mask
from .base import ModelBase, block_stack
from .config import ModelConfig
from .kv_cache import KVCache
from .layers import Embeddings, init_weights, make_norm


class Transformer(ModelBase):
    """Encoder-decoder: encoder self-attention with padding mask; decoder masked self-attention then
    cross-attention (queries from the decoder, keys/values from the encoder memory). With tie_embeddings the
    encoder, decoder and output projection share one matrix, as in the paper."""

    attention_layers_per_token = 3  # encoder self, decoder self, decoder cross
    cross_attention = True

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg)
        shared = nn.Embedding(cfg.vocab_size, cfg.d_model) if cfg.tie_embeddings else None
        self.src_embed = Embeddings(cfg, tok=shared)
        self.tgt_embed = Embeddings(cfg, tok=shared)
        self.encoder = block_stack(cfg)  # with model.share_layers: one block per stack, each stack its own
        self.decoder = block_stack(cfg, cross=True)
        # Pre-LN stacks end un-normalised, so they get a final norm; post-LN blocks already end in one.
        self.enc_norm = make_norm(cfg) if cfg.norm_placement == "pre" else None
        self.dec_norm = make_norm(cfg) if cfg.norm_placement == "pre" else None
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        init_weights(self, cfg)
        if shared is not None:
            self.lm_head.weight = shared.weight

    def encode(self, src_ids: Tensor, src_mask: Tensor | None = None) -> Tensor:
        """src_ids (B, S), src_mask (B, S) bool True = real token -> memory (B, S, C)."""
        self._start(None, src_ids.shape[1], None)
        x = self.src_embed(src_ids)  # (B, S, C)
        masks = self._self_masks(x, causal=False, padding=src_mask)
        rope, rows = self._rope(x), self.norm_rows(src_mask, src_ids.shape[1])
        for block, mask in zip(self.encoder, masks):
            x = block(x, mask, rope=rope, rows=rows)
        return self._final_norm(self.enc_norm, x, rows)  # (B, S, C)

    def decode(self, tgt_ids: Tensor, memory: Tensor, src_mask: Tensor | None = None,
               kv_cache: KVCache | None = None, start_pos: Tensor | None = None, tgt_mask: Tensor | None = None,
               head: bool = True) -> Tensor:
        """tgt_ids (B, T) at positions start_pos.. -> logits (B, T, V). tgt_mask (B, T): not with a kv_cache.

        With a kv_cache, the decoder's own keys/values are written at start_pos (a 0-dim tensor, None = 0)
        and the memory's cross-attention keys/values are computed on the first call and reused afterwards
        (so a decode step follows a prefill and reads no memory).
        head=False returns the final decoder states (B, T, C) instead, for an objective that fuses `lm_head`
        into its loss (trainer/fused_loss.py).
        """
        T = tgt_ids.shape[1]
        start_pos = self._start(start_pos, T, kv_cache)
        x = self.tgt_embed(tgt_ids, start_pos)  # (B, T, C)
        self_masks, rope = self._decoder_inputs(x, start_pos, tgt_mask, kv_cache)
        memory_mask = cross_attention_mask(src_mask, self.config.padding_fill, x.dtype)
        rows = self.norm_rows(tgt_mask, T)
        for i, block in enumerate(self.decoder):
            x = block(x, self_masks[i], rope=rope, start_pos=start_pos, memory=memory, memory_mask=memory_mask,
                      cache=None if kv_cache is None else kv_cache.layers[i],
                      cross_cache=None if kv_cache is None else kv_cache.cross[i], rows=rows)
        x = self._final_norm(self.dec_norm, x, rows)
        return self.lm_head(x) if head else x  # (B, T, V) or (B, T, C)

    def forward(self, src_ids: Tensor, tgt_ids: Tensor, src_mask: Tensor | None = None,
                tgt_mask: Tensor | None = None, head: bool = True) -> Tensor:
        """Teacher-forced logits (B, T, V); head=False: decoder states (B, T, C), as in `decode`."""
        memory = self.encode(src_ids, src_mask)  # (B, S, C)
        return self.decode(tgt_ids, memory, src_mask=src_mask, tgt_mask=tgt_mask, head=head)  # (B, T, V)
