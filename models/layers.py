"""The small pieces every family is built from: norms, feed-forward blocks, position encodings, embeddings.

Each design choice tfkit lets you compare is one function or class here, picked by a `ModelConfig` field:
`norm` (LayerNorm | RMSNorm | BatchNorm), `activation` (relu | gelu | swiglu), `positions` (learned | sinusoidal
added to the embeddings; rope rotating q and k inside attention; alibi as a per-head bias on the scores;
none: nothing anywhere, so an encoder is permutation-equivariant and only a causal mask tells order).
Attention itself lives in attention.py; the block that combines it with these pieces in base.py.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .config import ModelConfig
from .norms import BatchNorm
from .rope_scaling import rope_frequencies

# Output projections that write into the residual stream; the `normal` init scales them by
# 1/sqrt(2 * n_layers) so the residual variance does not grow with depth (GPT-2).
RESIDUAL_OUT = ("o_proj", "down")


def make_norm(cfg: ModelConfig, dim: int | None = None) -> nn.Module:
    """The `cfg.norm` kind over `dim` features (d_model; head_dim for QK-norm)."""
    dim = cfg.d_model if dim is None else dim
    if cfg.norm == "rmsnorm":
        return nn.RMSNorm(dim, eps=cfg.norm_eps)
    if cfg.norm == "batchnorm":
        return BatchNorm(dim, eps=cfg.norm_eps, bias=cfg.bias)
    return nn.LayerNorm(dim, eps=cfg.norm_eps, bias=cfg.bias)


def activation(name: str) -> nn.Module:
    """The pointwise non-linearity of `cfg.activation` (swiglu gates with SiLU inside FeedForward).

    gelu_tanh is GPT-2's tanh approximation (HF `gelu_new`); it exists so imported GPT-2 weights compute
    exactly what they were trained with."""
    if name == "relu":
        return nn.ReLU()
    return nn.GELU(approximate="tanh" if name == "gelu_tanh" else "none")


class FeedForward(nn.Module):
    """Position-wise MLP: down(act(up(x))), or down(silu(gate(x)) * up(x)) for SwiGLU."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.swiglu = cfg.activation == "swiglu"
        self.up = nn.Linear(cfg.d_model, cfg.ffn_dim, bias=cfg.bias)
        self.gate = nn.Linear(cfg.d_model, cfg.ffn_dim, bias=cfg.bias) if self.swiglu else None
        self.act = activation(cfg.activation)
        self.down = nn.Linear(cfg.ffn_dim, cfg.d_model, bias=cfg.bias)

    def forward(self, x: Tensor) -> Tensor:
        if self.swiglu:
            return self.down(F.silu(self.gate(x)) * self.up(x))  # (B, T, C)
        return self.down(self.act(self.up(x)))  # (B, T, C)


def sinusoidal_table(n_positions: int, dim: int) -> Tensor:
    """The fixed encodings of "Attention Is All You Need": sin on even, cos on odd channels."""
    position = torch.arange(n_positions, dtype=torch.float32)[:, None]  # (S, 1)
    inv_freq = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * (-math.log(10000.0) / dim))  # (C/2,)
    table = torch.zeros(n_positions, dim)
    table[:, 0::2] = torch.sin(position * inv_freq)
    table[:, 1::2] = torch.cos(position * inv_freq[: dim // 2])
    return table  # (S, C)


def rope_angles(cfg: ModelConfig, length: int, device: torch.device | None = None) -> tuple[Tensor, Tensor]:
    """RoPE cos/sin for positions 0..length-1 (a full forward, or the table a KV cache indexes by position).

    Computed once per forward and shared by every layer, not stored as a buffer: a buffer would be cast
    with the model to bf16, whose 8-bit mantissa garbles the angles of distant positions.
    """
    return rope_at(cfg, torch.arange(length, device=device))  # (T, D) each


def rope_at(cfg: ModelConfig, positions: Tensor) -> tuple[Tensor, Tensor]:
    """RoPE cos/sin, fp32, for any tensor of positions (..., ) -> (..., D) each: 0..T-1, or the positions
    restarted at each packed document (B, T)."""
    inv_freq, mscale = rope_frequencies(cfg, positions.device)  # (D/2,): theta^(-2i/D), rescaled by rope_scaling
    angles = positions.float()[..., None] * inv_freq  # (..., D/2)
    angles = torch.cat([angles, angles], dim=-1)  # (..., D): rotate-half layout (GPT-NeoX, Llama)
    if mscale == 1.0:
        return angles.cos(), angles.sin()
    return angles.cos() * mscale, angles.sin() * mscale  # YaRN's sharper softmax


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate each (x_i, x_{i+D/2}) pair of x (B, H, T, D) by its position's angle, in fp32."""
    x1, x2 = x.float().chunk(2, dim=-1)  # (B, H, T, D/2) each
    rotated = torch.cat([-x2, x1], dim=-1)  # (B, H, T, D)
    return (x.float() * cos + rotated * sin).to(x.dtype)  # (B, H, T, D)


def alibi_slopes(n_heads: int) -> Tensor:
    """Per-head ALiBi slopes: the geometric sequence 2^(-8/n), 2^(-16/n), ... of the paper.

    For a head count that is not a power of two, the paper's recipe takes the slopes of the closest
    smaller power of two and fills in every other slope of the next power of two.
    """
    def power_of_two(n: int) -> list[float]:
        start = 2 ** (-8 / n)
        return [start ** (i + 1) for i in range(n)]

    closest = 2 ** math.floor(math.log2(n_heads))
    slopes = power_of_two(closest)
    if closest < n_heads:
        slopes += power_of_two(2 * closest)[0::2][: n_heads - closest]
    return torch.tensor(slopes)  # (H,)


class Embeddings(nn.Module):
    """Token embeddings (+ learned or sinusoidal positions) (+ segments) (+ LayerNorm for BERT), dropout.

    `tok` may be passed in so that the encoder, decoder and output head share one matrix. RoPE and ALiBi
    add nothing here: they act inside attention.
    """

    def __init__(self, cfg: ModelConfig, tok: nn.Embedding | None = None, segments: bool = False,
                 norm: bool = False) -> None:
        super().__init__()
        self.tok = tok if tok is not None else nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos = nn.Embedding(cfg.max_seq_len, cfg.d_model) if cfg.positions == "learned" else None
        if cfg.positions == "sinusoidal":
            self.register_buffer("sinusoid", sinusoidal_table(cfg.max_seq_len, cfg.d_model), persistent=False)
        else:
            self.sinusoid = None
        self.seg = nn.Embedding(cfg.type_vocab_size, cfg.d_model) if segments and cfg.type_vocab_size else None
        self.norm = make_norm(cfg) if norm else None
        self.scale = math.sqrt(cfg.d_model) if cfg.scale_embeddings else 1.0
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, ids: Tensor, start_pos: Tensor | None = None, token_type_ids: Tensor | None = None,
                rows: Tensor | None = None, position_ids: Tensor | None = None) -> Tensor:
        """ids (B, T) at positions start_pos..start_pos+T-1 -> (B, T, C); start_pos None = 0, else a 0-dim
        long tensor (a forward over the KV cache): the position rows are indexed on the device, never read back.
        position_ids (B, T), instead: each token's own position (restarted at each packed document).
        rows: (B, T) bool, the real tokens, for a BatchNorm's statistics (None: every row is real)."""
        x = self.tok(ids) * self.scale  # (B, T, C)
        if self.pos is not None or self.sinusoid is not None:
            positions = torch.arange(ids.shape[1], device=ids.device)  # (T,)
            positions = positions if start_pos is None else positions + start_pos
            positions = positions if position_ids is None else position_ids  # (T,) or (B, T)
            if self.pos is not None:
                x = x + self.pos(positions)  # (B, T, C)
            if self.sinusoid is not None:
                x = x + self.sinusoid[positions].to(x.dtype)  # (B, T, C)
        if self.seg is not None:
            segments = token_type_ids if token_type_ids is not None else torch.zeros_like(ids)
            x = x + self.seg(segments)  # (B, T, C)
        if self.norm is not None:
            x = self.norm(x) if rows is None else self.norm(x, rows)
        return self.drop(x)


def init_weights(model: nn.Module, cfg: ModelConfig) -> None:
    """`normal`: N(0, init_std), residual output projections N(0, init_std/sqrt(2*n_layers)) (GPT-2/BERT).
    `xavier`: Glorot-uniform linears, embeddings N(0, d_model^-0.5) (original Transformer). `t5`: xavier with
    every query projection divided by sqrt(head_dim), the scale T5's unscaled attention (attn_scale: none) moves
    from the scores into W_q's initialisation (Mesh TensorFlow's T5: q ~ (d_model * d_kv)^-0.5). Biases 0."""
    residual_std = cfg.init_std / math.sqrt(2 * cfg.n_layers)
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear):
            if cfg.init in ("xavier", "t5"):
                nn.init.xavier_uniform_(module.weight)
                if cfg.init == "t5" and name.rsplit(".", 1)[-1] == "q_proj":
                    with torch.no_grad():
                        module.weight.mul_(cfg.head_dim ** -0.5)
            else:
                is_residual = name.rsplit(".", 1)[-1] in RESIDUAL_OUT
                nn.init.normal_(module.weight, 0.0, residual_std if is_residual else cfg.init_std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            std = cfg.d_model ** -0.5 if cfg.init in ("xavier", "t5") else cfg.init_std
            nn.init.normal_(module.weight, 0.0, std)
        elif isinstance(module, (nn.LayerNorm, nn.RMSNorm, BatchNorm)):
            module.reset_parameters()
