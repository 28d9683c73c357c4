"""SFT speed: tfkit's chat fine-tuning step against a plain PyTorch loop over HF's GPT2LMHeadModel.

Both sides train the same model (tfkit's weights copied into the HF twin by `tfkit_to_hf`) on the same packed
SFT batch, built by `SftDataset` as `data.format: chat` builds it: input_ids, labels with -100 off the
assistant's tokens (and on padding), doc_ids and restarted position_ids, each (B, T).

- tfkit: `train_step` of the pretraining runner's loop (as train_throughput.tfkit_step): the clm objective
  (fused LM head + cross-entropy on CPU, `fused_loss: auto`), attention kept inside each conversation by
  doc_ids, backward, clip, AdamW.
- HF: `model(input_ids, position_ids, attention_mask).logits` with a 4D bool mask (B, 1, T, T), causal and
  inside each conversation, built from doc_ids in the step (transformers uses a 4D mask as given; the loss
  then equals tfkit's to float precision, tests/test_benchmarks.py), cross-entropy against the same
  (already shifted) labels with ignore_index -100, backward, clip, the same AdamW (`build_optimizer`).

Conversations are random ids with exponential lengths (mean a third of a row), the first 60% prompt (not
trained) and the rest the answer, so about 30% of the positions carry a label. CPU suite only (run.py's
CPU_ONLY).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor, nn

from tfkit.checkpoints.hf_state import tfkit_to_hf
from tfkit.models import ModelConfig
from tfkit.tokenization.sft_batches import Example, SftDataset
from tfkit.trainer.objectives import IGNORE
from tfkit.trainer.optim import autocast_context, build_optimizer, native_bf16
from tfkit.trainer.recipe import OptimSection

from .common import Context, Row, median, paired_ratio, time_interleaved
from .train_throughput import Case, hf_model, tfkit_step

ROW_SHARE = 3  # conversations of mean length T / 3: about three per packed row, few cut
PROMPT_SHARE = 0.6  # of each conversation, not trained on
PAD_ID = 0


def conversations(n: int, vocab_size: int, mean: float, seed: int = 0) -> list[Example]:
    """`n` random conversations (ids, trained flags) of exponential lengths: a prompt, then the answer."""
    rng = np.random.default_rng(seed)
    out = []
    for length in np.maximum(4, rng.exponential(mean, size=n).astype(np.int64)):
        ids = rng.integers(1, vocab_size, size=length).tolist()
        answer_from = int(PROMPT_SHARE * length)
        out.append((ids, [k >= answer_from for k in range(length)]))
    return out


def sft_batch(cfg: ModelConfig, batch: int, seq_len: int) -> dict[str, Tensor]:
    """Batch 0 of an SftDataset packed from enough conversations for `batch` rows."""
    n = 2 * batch * ROW_SHARE + 4
    examples = conversations(n, cfg.vocab_size, seq_len / ROW_SHARE)
    return SftDataset(examples, seq_len, seed=0, pad_id=PAD_ID).batch(0, batch)


def hf_twin(model: nn.Module) -> nn.Module:
    """GPT2LMHeadModel computing what the tfkit `model` computes (its weights, through tfkit_to_hf)."""
    twin = hf_model(model.config)
    _, state = tfkit_to_hf(model.config, model.state_dict())
    missing, unexpected = twin.load_state_dict(state, strict=False)
    if unexpected or any(not key.startswith("lm_head.") for key in missing):
        raise RuntimeError(f"HF twin: missing {missing}, unexpected {unexpected}")
    twin.tie_weights()
    return twin.train()


def document_mask(doc_ids: Tensor) -> Tensor:
    """(B, 1, T, T) bool, True where query t may attend key s: s <= t and both in the same conversation."""
    seq_len = doc_ids.shape[1]
    causal = torch.ones(seq_len, seq_len, dtype=torch.bool).tril()  # (T, T)
    return ((doc_ids[:, :, None] == doc_ids[:, None, :]) & causal)[:, None]  # (B, 1, T, T)


def hf_sft_step(twin: nn.Module, batch: dict[str, Tensor], precision: str) -> Callable[[], None]:
    """One call = one plain-PyTorch SFT step of the HF model: logits, cross-entropy on the assistant's
    labels, backward, clip, AdamW; attention inside each conversation, as tfkit's."""
    device = torch.device("cpu")
    optimizer = build_optimizer(twin, OptimSection(), device)
    clip = OptimSection().grad_clip
    ids, positions, labels = batch["input_ids"], batch["position_ids"], batch["labels"]  # (B, T) each

    def step() -> None:
        mask = document_mask(batch["doc_ids"])  # (B, 1, T, T)
        with autocast_context(precision, device):
            logits = twin(input_ids=ids, position_ids=positions, attention_mask=mask).logits  # (B, T, V)
        loss = nn.functional.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=IGNORE)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(twin.parameters(), clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def measure(ctx: Context, cfg: ModelConfig, batch_size: int, seq_len: int, precision: str) -> Row:
    """Tokens/s (all positions of the packed rows) of both steps, interleaved on one clock."""
    batch = sft_batch(cfg, batch_size, seq_len)
    torch.manual_seed(0)
    case = Case("sft", cfg, batch_size, seq_len, precision)
    ours, model = tfkit_step(case, batch, ctx.device, compile=False)
    theirs = hf_sft_step(hf_twin(model), batch, precision)
    warmup, rounds = (1, 2) if ctx.quick else (2, 10)
    ctx.log(f"sft: B={batch_size} T={seq_len} {precision}")
    samples = time_interleaved({"tfkit": ours, "hf": theirs}, ctx.device, warmup=warmup, rounds=rounds, calls=1,
                               timer=ctx.timer)
    tokens = batch_size * seq_len
    trained = float((batch["labels"] != IGNORE).float().mean())
    docs = float((batch["doc_ids"].max(dim=1).values + 1).float().mean())
    label = (f"SFT step vs plain loop over HF GPT2LMHeadModel, d={cfg.d_model} L={cfg.n_layers} V={cfg.vocab_size}, "
             f"B={batch_size} T={seq_len} {precision}")
    note = (f"{100 * trained:.0f}% of positions trained, {docs:.1f} conversations/row; both with the "
            f"document mask")
    return Row("sft", label, "tok/s", tokens / median(samples["tfkit"]), tokens / median(samples["hf"]), note=note,
               paired=paired_ratio(samples["tfkit"], samples["hf"]),
               extra={"samples_s": samples, "trained_fraction": trained, "conversations_per_row": docs})


def run(ctx: Context) -> list[Row]:
    """The nanoGPT-shaped GPT of train_throughput (learned positions, so it has a GPT2LMHeadModel twin) at
    sft-chat's batch (16 rows of 128), in fp32 and, where this CPU multiplies bf16 natively (what
    `precision: auto` picks there), in bf16."""
    cfg = ModelConfig(arch="gpt", vocab_size=8192, d_model=256, n_layers=4, n_heads=4, max_seq_len=256,
                      positions="learned", norm="layernorm", norm_placement="pre", activation="gelu", bias=True,
                      tie_embeddings=True, dropout=0.0, attn_dropout=0.0).validate()
    if ctx.quick:
        cfg = dataclasses.replace(cfg, vocab_size=512, d_model=64, n_layers=1).validate()
    batch_size, seq_len = (2, 32) if ctx.quick else (16, 128)
    precisions = ("fp32", "bf16") if native_bf16(torch.device("cpu")) and not ctx.quick else ("fp32",)
    return [measure(ctx, cfg, batch_size, seq_len, precision) for precision in precisions]
