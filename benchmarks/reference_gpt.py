"""A minimal nanoGPT-style GPT: the reference tfkit's training speed and time-to-quality are measured against.

Why a second baseline beside HuggingFace: HF's models carry generality (many options, hooks, output
objects) whose cost a user of a lean research codebase does not pay. This is what such a codebase runs:
token + learned position embeddings, pre-LayerNorm blocks with one fused qkv projection and PyTorch's
SDPA with `is_causal=True`, a 4x GELU MLP, a final LayerNorm, an output head tied to the token
embedding, and plain `F.cross_entropy`. Initialisation, optimizer groups and the LR schedule follow
nanoGPT (Karpathy), so `benchmarks/nanogpt_char.py` can reproduce its README's CPU run with it.

Nothing here is imported by tfkit itself; it exists to be compared with.
"""

from __future__ import annotations

import inspect
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class CausalSelfAttention(nn.Module):
    """All heads at once: one Linear makes q, k and v, SDPA applies the causal mask inside its kernel."""

    def __init__(self, d: int, n_heads: int, dropout: float, bias: bool) -> None:
        super().__init__()
        if d % n_heads:
            raise ValueError(f"d={d} is not divisible by n_heads={n_heads}")
        self.n_heads, self.dropout = n_heads, dropout
        self.c_attn = nn.Linear(d, 3 * d, bias=bias)  # q, k, v of every head in one matmul
        self.c_proj = nn.Linear(d, d, bias=bias)  # back into the residual stream
        self.resid_dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        B, T, C = x.shape  # batch, time, channels (d)
        q, k, v = self.c_attn(x).split(C, dim=2)  # 3 x (B, T, C)
        q = q.view(B, T, self.n_heads, C // self.n_heads).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(B, T, self.n_heads, C // self.n_heads).transpose(1, 2)  # (B, nh, T, hs)
        v = v.view(B, T, self.n_heads, C // self.n_heads).transpose(1, 2)  # (B, nh, T, hs)
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0,
                                           is_causal=True)  # (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # (B, T, C): heads side by side again
        return self.resid_dropout(self.c_proj(y))  # (B, T, C)


class MLP(nn.Module):
    """Position-wise feed-forward: widen 4x, exact (erf) GELU, project back."""

    def __init__(self, d: int, dropout: float, bias: bool) -> None:
        super().__init__()
        self.c_fc = nn.Linear(d, 4 * d, bias=bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * d, d, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))  # (B, T, d) -> (B, T, 4d) -> (B, T, d)


class Block(nn.Module):
    """Pre-LN residual block: x + attn(ln(x)), then x + mlp(ln(x)) (GPT-2's placement)."""

    def __init__(self, d: int, n_heads: int, dropout: float, bias: bool) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(d, bias=bias)
        self.attn = CausalSelfAttention(d, n_heads, dropout, bias)
        self.ln_2 = nn.LayerNorm(d, bias=bias)
        self.mlp = MLP(d, dropout, bias)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln_1(x))  # (B, T, d)
        return x + self.mlp(self.ln_2(x))  # (B, T, d)


class ReferenceGPT(nn.Module):
    """GPT-2-shaped decoder-only LM. `forward(idx, targets=None) -> (logits (B, T, V), mean loss or None)`.

    vocab: tokens; d: residual width; block_size: longest sequence (the position table's rows);
    dropout on embeddings, attention and residual branches (0.0 for pretraining small models);
    bias: biases in the Linear and LayerNorm layers (GPT-2 has them; nanoGPT's train.py turns them off).
    """

    def __init__(self, vocab: int, d: int, n_layers: int, n_heads: int, block_size: int, dropout: float = 0.0,
                 bias: bool = True) -> None:
        super().__init__()
        self.block_size = block_size
        self.wte = nn.Embedding(vocab, d)  # token embedding, shared with the output head
        self.wpe = nn.Embedding(block_size, d)  # learned absolute positions
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(d, n_heads, dropout, bias) for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(d, bias=bias)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.wte.weight = self.lm_head.weight  # weight tying (Press & Wolf 2017): one (V, d) matrix
        self.apply(self._init_weights)
        for name, param in self.named_parameters():
            if name.endswith("c_proj.weight"):  # GPT-2: residual projections shrink with depth so the
                nn.init.normal_(param, mean=0.0, std=0.02 / math.sqrt(2 * n_layers))  # stream's variance stays put

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def num_params(self) -> int:
        """Parameters, the tied matrix counted once (parameters() already yields a shared tensor once)."""
        return sum(p.numel() for p in self.parameters())

    def forward(self, idx: Tensor, targets: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        B, T = idx.shape
        if T > self.block_size:
            raise ValueError(f"sequence of {T} tokens is longer than block_size={self.block_size}")
        pos = torch.arange(T, device=idx.device)  # (T,)
        x = self.drop(self.wte(idx) + self.wpe(pos))  # (B, T, d) + (T, d) -> (B, T, d)
        for block in self.blocks:
            x = block(x)  # (B, T, d)
        logits = self.lm_head(self.ln_f(x))  # (B, T, V)
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.view(B * T, -1), targets.view(B * T), ignore_index=-1)  # mean over B*T
        return logits, loss


def configure_optimizers(model: nn.Module, weight_decay: float, learning_rate: float, betas: tuple[float, float],
                         device_type: str) -> torch.optim.AdamW:
    """nanoGPT's AdamW: weight decay on every tensor with >= 2 dims (matmul weights and embeddings, the tied
    head with them), none on biases and LayerNorm gains; the fused kernel wherever this torch has one.

    nanoGPT asked for fused only on CUDA because PyTorch had no fused CPU AdamW then; it has one now, and
    tfkit's optimizer uses it, so the reference is given it too rather than be slower for an old reason."""
    params = [p for p in model.parameters() if p.requires_grad]  # a tied tensor appears once
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    fused = "fused" in inspect.signature(torch.optim.AdamW).parameters and device_type in ("cuda", "cpu")
    return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, fused=fused or None)


def get_lr(it: int, *, learning_rate: float, min_lr: float, warmup_iters: int, lr_decay_iters: int) -> float:
    """nanoGPT's schedule, a pure function of the iteration: linear warmup to `learning_rate` over
    `warmup_iters` (never 0 at it=0), half a cosine down to `min_lr` at `lr_decay_iters`, then `min_lr`."""
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    if it > lr_decay_iters:
        return min_lr
    decay_ratio = (it - warmup_iters) / max(1, lr_decay_iters - warmup_iters)  # 0 -> 1
    coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))  # 1 -> 0
    return min_lr + coeff * (learning_rate - min_lr)
