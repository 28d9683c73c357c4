"""Length extrapolation judged on what it is about: the loss past the training length, against the 1x figure.

Scoring a model on rows of 2x its training length and comparing overall losses mostly repeats the 1x
comparison: half of every row sits inside the training length, where the models already differ (an
audit found "alibi < rope @2x" carried by the 1x gap). So `probes: {lengths: [2, 4, 8]}` scores each
causal checkpoint on rows of factor x data.seq_len tokens and splits every row at the training length L:
- within: the loss on positions 0..L-1, which a causal model computes exactly as on a 1x row starting at
  the same token (the 1x figure, on the same text);
- past: the loss on positions L..factor*L-1, positions the model never trained at;
- the column's loss is past - within, the degradation past the training length (bits per byte alike).
A comparison on `LABEL@2x` is then a paired difference of degradations, so each model's own 1x quality
cancels: "alibi degrades less than rope past the training length", not "alibi is better at 2x".
Tokens past L have more context than those before it, which lowers their loss for a model that
extrapolates perfectly; that offset is the same for every model scored on the same rows, so it cancels
from paired differences too, but a degradation near or below 0 means "no worse", not "better".

The rows are the ones `evaluate` scores at that length (the same seed, batches and layout), in fp32 as the
lab's other scores are."""

from __future__ import annotations

import hashlib
import math
from pathlib import Path

import torch
import torch.nn.functional as F

from ..errors import ConfigError
from ..tokenization.batches import IGNORE_INDEX

ROWS_PER_FORWARD = 4  # rows of factor x L tokens scored at once: (4, 8 x 128, 4096) fp32 logits are 64 MiB


def split_sums(logits: torch.Tensor, labels: torch.Tensor, split: int, byte_table: torch.Tensor) -> torch.Tensor:
    """(2, 3) float64: [nats, tokens, bytes] scored before `split` (row 0) and from it on (row 1), for
    logits (B, T, V) and labels (B, T) with IGNORE_INDEX where nothing is scored."""
    nll = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX,
                          reduction="none").view(labels.shape).double()  # (B, T)
    scored = labels != IGNORE_INDEX  # (B, T)
    n_bytes = byte_table[labels.clamp_min(0)].double() * scored  # (B, T)
    out = torch.zeros(2, 3, dtype=torch.float64)
    for row, part in enumerate((slice(0, split), slice(split, None))):
        out[row] = torch.stack([nll[:, part].sum(), scored[:, part].sum().double(), n_bytes[:, part].sum()])
    return out


@torch.no_grad()
def past_training_length(checkpoint: Path, text: str, seq_len: int, factor: int, batch_size: int,
                         batches: int | None, cache_dir: Path) -> dict:
    """The degradation of `checkpoint` past its training length `seq_len` on `text`, at rows of
    factor x seq_len tokens (module doc): {loss, bits_per_byte (past - within), past / within losses and
    bits per byte, tokens past and within, seq_len, data_fingerprint, params}."""
    from ..checkpoints.record import CheckpointRecord
    from ..checkpoints.weights import load_model
    from ..evaluation.evaluate import eval_batches, trained_layout
    from ..tokenization.token_bytes import token_byte_lengths
    from ..tokenization.train import load_tokenizer
    from .mechanisms import model_inputs

    record = CheckpointRecord.read(checkpoint)
    if (record.objective or "clm") != "clm":
        raise ConfigError(f"probes.lengths: splits rows at the training length, which needs a causal (clm) model; "
                          f"{checkpoint} is {record.objective}")
    model, _ = load_model(checkpoint)
    tokenizer = load_tokenizer(checkpoint)
    byte_table = torch.from_numpy(token_byte_lengths(tokenizer))
    rows, _ = eval_batches(tokenizer, text, "clm", seq_len=factor * seq_len, batch_size=batch_size, stride=None,
                           seed=0, cache_dir=cache_dir, show_progress=False, **trained_layout(record))
    sums, digest = torch.zeros(2, 3, dtype=torch.float64), hashlib.sha256()
    for n, batch in enumerate(rows):
        if batches is not None and n >= batches:
            break
        for name in ("input_ids", "labels"):
            digest.update(name.encode() + batch[name].numpy().tobytes())
        for lo in range(0, batch["input_ids"].shape[0], ROWS_PER_FORWARD):
            part = {k: v[lo:lo + ROWS_PER_FORWARD] for k, v in batch.items()}
            logits = model_inputs(model, part)  # (b, factor * L, V)
            sums += split_sums(logits, part["labels"], seq_len, byte_table)
    (within_nll, within_n, within_bytes), (past_nll, past_n, past_bytes) = sums.tolist()
    if within_n == 0 or past_n == 0:
        raise ConfigError(f"probes.lengths: {text} gives no rows of {factor * seq_len} tokens to score; use a "
                          "smaller factor or a longer text")
    loss = {"within": within_nll / within_n, "past": past_nll / past_n}
    bpb = {k: nll / math.log(2) / b if b else math.nan
           for k, nll, b in (("within", within_nll, within_bytes), ("past", past_nll, past_bytes))}
    return {"loss": loss["past"] - loss["within"], "bits_per_byte": bpb["past"] - bpb["within"],
            "past_loss": loss["past"], "within_loss": loss["within"], "past_bits_per_byte": bpb["past"],
            "within_bits_per_byte": bpb["within"], "tokens": int(past_n), "tokens_within": int(within_n),
            "seq_len": factor * seq_len, "data_fingerprint": digest.hexdigest()[:16], "params": model.num_params()}
