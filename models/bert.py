"""BERT: encoder-only masked language model (BERT-base layout when built with the `small` size).

token + position + segment embeddings -> LayerNorm -> n_layers bidirectional blocks (padding mask only).
The MLM head (dense -> activation -> norm -> decoder tied to the token embedding, with its own bias) is a
separate call, `mlm_logits`, so training applies it only to the ~15% of rows that are masked: the vocab
projection is the most expensive matmul of a small BERT. `pooled` is the [CLS] summary used for fine-tuning.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .config import ModelConfig
from .layers import Embeddings, activation, init_weights, make_norm
from .base import ModelBase, block_stack


class MLMHead(nn.Module):
    """Transform each hidden row, then project to the vocabulary (BERT's `cls.predictions`)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(cfg.d_model, cfg.d_model, bias=cfg.bias)
        self.act = activation("gelu" if cfg.activation == "swiglu" else cfg.activation)  # swiglu is FFN-only
        self.norm = make_norm(cfg)
        self.decoder = nn.Linear(cfg.d_model, cfg.vocab_size, bias=True)  # own output bias even when tied

    def forward(self, hidden: Tensor) -> Tensor:
        return self.decoder(self.norm(self.act(self.dense(hidden))))  # (..., V)


class BERT(ModelBase):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg)
        self.embed = Embeddings(cfg, segments=True, norm=True)
        self.blocks = block_stack(cfg)  # one Block n_layers times with model.share_layers
        self.ln_f = make_norm(cfg) if cfg.norm_placement == "pre" else None  # post-LN blocks end normalised
        self.pooler = nn.Linear(cfg.d_model, cfg.d_model, bias=cfg.bias)
        self.mlm = MLMHead(cfg)
        init_weights(self, cfg)
        if cfg.tie_embeddings:
            self.mlm.decoder.weight = self.embed.tok.weight

    def encode(self, input_ids: Tensor, attention_mask: Tensor | None = None, token_type_ids: Tensor | None = None,
               doc_ids: Tensor | None = None, position_ids: Tensor | None = None) -> Tensor:
        """input_ids (B, T), attention_mask (B, T) bool True = real token -> hidden (B, T, C).
        doc_ids / position_ids (B, T): packed documents kept apart, positions restarted at each (as in GPT).

        Padding is whatever attention_mask says, never inferred from pad ids: inferring it would read the
        ids back from the GPU on every forward (and break a compiled graph) for batches that have none."""
        self._start(None, input_ids.shape[1], None)
        rows = self.norm_rows(attention_mask, input_ids.shape[1])  # BatchNorm only: the real tokens it counts
        x = self.embed(input_ids, token_type_ids=token_type_ids, rows=rows, position_ids=position_ids)  # (B, T, C)
        masks = self._self_masks(x, causal=False, padding=attention_mask, doc_ids=doc_ids)  # once, for all layers
        rope = self._rope(x, position_ids)
        for block, mask in zip(self.blocks, masks):
            x = block(x, mask, rope=rope, rows=rows)  # (B, T, C)
        return self._final_norm(self.ln_f, x, rows)

    def mlm_logits(self, hidden_rows: Tensor) -> Tensor:
        """The MLM head on the rows you gathered: (N, C) -> (N, V) (any leading shape works)."""
        return self.mlm(hidden_rows)

    def pooled(self, hidden: Tensor) -> Tensor:
        """tanh(dense(hidden of the first token)): (B, T, C) -> (B, C), the sequence summary for fine-tuning."""
        return torch.tanh(self.pooler(hidden[:, 0]))

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None,
                token_type_ids: Tensor | None = None) -> Tensor:
        return self.mlm_logits(self.encode(input_ids, attention_mask, token_type_ids))  # (B, T, V)
