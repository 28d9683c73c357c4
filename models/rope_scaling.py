"""RoPE context extension: the rotation frequencies of `model.rope_scaling`, so a model trained at length L
can be evaluated or fine-tuned at `rope_factor` * L.

- linear (position interpolation, Chen et al. 2023): every frequency divided by the factor, so position
  p rotates as p / factor did in training; the positions seen stay inside the trained range.
- yarn (Peng et al. 2023, "YaRN"): the high frequencies, which complete many turns within the trained length
  and so already saw every angle, are kept; the low ones, which never completed a turn, are interpolated
  as in linear; a linear ramp between `BETA_FAST` and `BETA_SLOW` turns blends the two. The softmax is
  sharpened back by scaling cos/sin by 0.1 * ln(factor) + 1 (`mscale`). The trained length is
  max_seq_len / rope_factor. Written as HuggingFace's `_compute_yarn_parameters` computes it, with the
  paper's defaults (beta_fast 32, beta_slow 1), so the two agree.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .config import ModelConfig

BETA_FAST, BETA_SLOW = 32.0, 1.0  # YaRN's ramp: frequencies above 32 turns are kept, below 1 interpolated


def rope_frequencies(cfg: ModelConfig, device: torch.device | None = None) -> tuple[Tensor, float]:
    """(inv_freq (D/2,) fp32, mscale): the rotation per position of each pair of channels, and the factor
    cos and sin are multiplied by (1.0 except for yarn)."""
    dim = cfg.head_dim
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float32, device=device) / dim))  # (D/2,)
    factor = cfg.rope_factor
    if cfg.rope_scaling is None:
        return inv_freq, 1.0
    if cfg.rope_scaling == "linear":
        return inv_freq / factor, 1.0
    trained = cfg.max_seq_len / factor

    def turns_to_dim(turns: float) -> float:  # the channel pair whose frequency makes `turns` turns in `trained`
        return dim * math.log(trained / (turns * 2 * math.pi)) / (2 * math.log(cfg.rope_theta))

    low = max(math.floor(turns_to_dim(BETA_FAST)), 0)
    high = min(math.ceil(turns_to_dim(BETA_SLOW)), dim - 1)
    high = high + 0.001 if low == high else high
    ramp = ((torch.arange(dim // 2, dtype=torch.float32, device=device) - low) / (high - low)).clamp(0, 1)  # (D/2,)
    kept = 1 - ramp  # 1 = the trained frequency (high frequencies), 0 = interpolated (low ones)
    inv_freq = inv_freq / factor * (1 - kept) + inv_freq * kept
    mscale = 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0
    return inv_freq, mscale
