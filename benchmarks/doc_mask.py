"""Document masking: what keeping packed documents apart (`data.document_mask`) costs per training step.

The same packed rows, the same weights, one training step (the objective's loss, forward + backward):
- tfkit: the batch carries doc_ids (B, T), so every layer attends inside each document only (CPU: one bool
  (B, 1, T, T) mask per forward into SDPA; CUDA: a flex_attention block mask per forward);
- baseline: the batch without doc_ids, attention across the separators (the causal fast path for clm,
  no mask at all for mlm).
The ratio is unmasked / masked time (> 1 would mean masking is free); the goal is masking at most 1.15x
the unmasked step at T=512. CPU suite only (run.py's CPU_ONLY): the CUDA path, flex_attention, needs a
GPU this suite was not sized on. Documents are drawn with exponential lengths of mean 300 tokens (about the
stdlib:docs mean), cut by rows as packing cuts them; B*T = 4,096 tokens per step at every T.
"""

from __future__ import annotations

import numpy as np
import torch

from tfkit.models import ModelConfig, build_model
from tfkit.tokenization.packing import document_ids
from tfkit.trainer.objectives import clm_loss, mlm_loss

from .common import Context, Goal, Row, median, paired_ratio, time_interleaved

GOAL = Goal("masked <= 1.15x unmasked at T=512", 1 / 1.15)
MEAN_DOC = 300
VOCAB = 4096


def packed_batch(objective: str, batch: int, seq_len: int) -> dict[str, torch.Tensor]:
    """Random ids over `batch` packed rows with doc_ids from documents of exponential length (seeded)."""
    rng = np.random.default_rng(0)
    n = batch * seq_len
    lengths = np.maximum(1, rng.exponential(MEAN_DOC, size=n // 8 + 2).astype(np.int64))
    doc_starts = np.concatenate([[0], np.cumsum(lengths)])
    stream = np.arange(n).reshape(batch, seq_len)  # (B, T)
    ids = torch.from_numpy(rng.integers(5, VOCAB, size=(batch, seq_len)))  # (B, T)
    out = {"input_ids": ids, "doc_ids": document_ids(doc_starts, stream)}
    if objective == "clm":
        out["labels"] = torch.roll(ids, -1, dims=1)
    else:  # 15% of the positions are targets, at fixed slots (as MlmDataset's mlm_positions)
        k = max(1, int(0.15 * seq_len))
        out["mlm_positions"] = torch.from_numpy(np.sort(rng.choice(seq_len, size=(batch, k)), axis=1))
        out["mlm_labels"] = torch.gather(ids, 1, out["mlm_positions"])
        out["token_type_ids"] = torch.zeros_like(ids)
    return out


def step(model: torch.nn.Module, objective: str, batch: dict[str, torch.Tensor]) -> None:
    model.zero_grad(set_to_none=True)
    loss = clm_loss(model, batch) if objective == "clm" else mlm_loss(model, batch)
    loss.loss_sum.backward()


def run(ctx: Context) -> list[Row]:
    lengths = (32, 64) if ctx.quick else (128, 256, 512, 1024)
    tokens = 256 if ctx.quick else 4096
    rows = []
    for objective, arch in (("clm", "gpt"), ("mlm", "bert")):
        torch.manual_seed(0)
        cfg = ModelConfig(arch=arch, vocab_size=VOCAB, d_model=64 if ctx.quick else 256, n_layers=2 if ctx.quick else 4,
                          n_heads=4, max_seq_len=max(lengths), positions="rope")
        model = build_model(cfg)
        for seq_len in lengths:
            ctx.log(f"doc_mask: {objective} T={seq_len}")
            masked = packed_batch(objective, tokens // seq_len, seq_len)
            plain = {k: v for k, v in masked.items() if k != "doc_ids"}
            samples = time_interleaved({"masked": lambda: step(model, objective, masked),
                                        "plain": lambda: step(model, objective, plain)},
                                       ctx.device, warmup=1, rounds=2 if ctx.quick else 5, calls=1, timer=ctx.timer)
            docs = float((masked["doc_ids"].max(dim=1).values + 1).float().mean())
            rows.append(Row("doc_mask", f"{objective} step with document mask vs without, d={cfg.d_model} "
                                        f"L={cfg.n_layers}, B={tokens // seq_len} T={seq_len}", "ms",
                            1000 * median(samples["masked"]), 1000 * median(samples["plain"]),
                            higher_is_better=False, goal=GOAL if seq_len == 512 else None,
                            note=f"{docs:.1f} documents per row", paired=paired_ratio(samples["masked"],
                                                                                      samples["plain"])))
    return rows
