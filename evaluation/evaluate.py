"""Checkpoint evaluation: the numbers that compare models, beyond the trainer's validation loss.

`evaluate` scores a checkpoint on a corpus with the trainer's own objective code
(`objectives.compute_loss`, label smoothing off, so the loss is the true NLL) over the tokenization
datasets' `eval_batches`, and adds what a comparison table needs:

- perplexity = exp(loss), token accuracy (argmax = label), over the scored tokens;
- bits_per_byte = total NLL (nats) / ln 2 / UTF-8 bytes of the scored tokens, and byte_coverage: the
  share of the text's bytes the tokens stand for (tokenization/token_bytes.py says how bytes are counted
  for each kind of tokenizer). Unlike perplexity, bits per byte do not depend on the tokenizer;
- MLM: masked-token loss/accuracy with masks drawn from `seed` (not the run's training seed), so every
  checkpoint sharing a tokenizer is scored on the same masked tokens; `data_fingerprint` (sha256 of every
  evaluated batch's tokens and targets, not of the document layout a checkpoint reads them with) proves two
  rows saw identical inputs and targets;
- causal models with `stride`: sliding-window perplexity per document, each token scored once with at
  least seq_len - stride tokens of context (documents longer than the context are not cut blind), each
  document seen from its own start, never after another document's tail;
- a checkpoint trained with a document mask (`data.document_mask`, `data.reset_positions`, recorded in its
  config.json) is scored under the same layout: packed blocks carry its doc_ids and restarted positions,
  so its loss is the one its training validated, and a sliding window keeps the separator before a
  document out of that document, as training did (the separator ends the document before it);
- params, kv_cache_bytes_per_token (at bf16, as convert-mqa-to-gqa reports it), tokens_per_sec (tokens fed through the
  model per second of forward passes), and the precision the forward passes ran in (`dtype`).
"""

from __future__ import annotations

import hashlib
import math
import os
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor

from ..checkpoints.folders import read_checkpoint
from ..checkpoints.record import CheckpointRecord
from ..checkpoints.weights import load_with_tokenizer
from ..errors import ConfigError, DataError
from ..models import kv_cache_bytes_per_token
from ..runtime import PRECISIONS, check_precision, pick_device
from ..tokenization.batches import IGNORE_INDEX, ClmDataset, MlmDataset, Seq2SeqDataset
from ..tokenization.corpus import CorpusWarning
from ..tokenization.packing import restarted_positions
from ..tokenization.shards import TokenShards, prepare_tokens
from ..tokenization.token_bytes import byte_coverage, token_byte_lengths
from ..tokenization.train import TfkitTokenizer
from ..trainer.data import is_pair_data, truncation_note
from ..trainer.objectives import compute_loss, count_inputs, move_batch
from ..trainer.optim import autocast_context
from ..trainer.recipe import OBJECTIVE_FOR_ARCH, ObjectiveSection
from ..trainer.source import trained_precision
from .model_overrides import with_model_overrides
from .scoring_progress import ScoringProgress

LAYOUT_KEYS = ("doc_ids", "position_ids")  # how a checkpoint reads the rows: not part of their data_fingerprint


def default_cache_dir() -> Path:
    """Token shards of evaluation corpora, shared by every checkpoint with the same tokenizer."""
    root = os.environ.get("TFKIT_CACHE") or os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "tfkit")
    return Path(root).expanduser() / "eval-tokens"


class Window(NamedTuple):
    """One scoring window of a document: up to seq_len+1 tokens, the first `skip` labels already scored by
    the window before (context only), and `lead`: 1 when the window opens with the separator put before
    the document (the end of the document before it, in training's layout), else 0."""
    tokens: np.ndarray
    skip: int
    lead: int


def sliding_windows(shards: TokenShards, seq_len: int, stride: int) -> Iterator[Window]:
    """The windows over each document, framed as in training.

    A document is scored as `SEP doc SEP` (it starts after a separator, as in training, and its end is
    predicted too), or `BOS doc SEP` where the tokenizer starts documents with a BOS of its own (then
    already in the shards: Llama, as transformers scores it); a window's first `skip` labels were scored
    by the previous window and only give context. stride = seq_len reproduces non-overlapping blocks,
    smaller strides give more context.
    """
    own_start = shards.doc_start_id is not None
    sep = [shards.separator_id] if shards.separator_id is not None and not own_start else []
    for d in range(shards.num_documents):
        lo, hi = int(shards.doc_starts[d]), int(shards.doc_starts[d + 1])
        seq = np.concatenate([np.asarray(sep, np.int64), np.asarray(shards.tokens[lo:hi], np.int64)])
        scored_until, begin = 1, 0  # position of the next token to score
        while scored_until < len(seq):
            end = min(begin + seq_len + 1, len(seq))
            yield Window(seq[begin:end], scored_until - (begin + 1), len(sep) if begin == 0 else 0)
            scored_until, begin = end, begin + stride


def window_batches(windows: Iterator[Window], seq_len: int, batch_size: int, *, document_mask: bool = False,
                   reset_positions: bool = False) -> Iterator[dict]:
    """CLM batches (input_ids, labels) of windows right-padded to seq_len; padding and context get -100.
    With `document_mask`, also doc_ids (B, T) (and with `reset_positions`, position_ids (B, T)) that keep a
    window's leading separator a document of its own, as in the packed rows the checkpoint trained on.

    Right padding never changes a causal model's outputs at the real positions before it."""
    rows: list[Window] = []
    for window in windows:
        rows.append(window)
        if len(rows) == batch_size:
            yield _window_batch(rows, seq_len, document_mask, reset_positions)
            rows = []
    if rows:
        yield _window_batch(rows, seq_len, document_mask, reset_positions)


def _window_batch(rows: list[Window], seq_len: int, document_mask: bool, reset_positions: bool) -> dict[str, Tensor]:
    input_ids = torch.zeros(len(rows), seq_len, dtype=torch.long)  # (B, T)
    labels = torch.full((len(rows), seq_len), IGNORE_INDEX, dtype=torch.long)  # (B, T)
    doc_ids = torch.ones(len(rows), seq_len, dtype=torch.long)  # (B, T): the document, padding included
    for b, (seq, skip, lead) in enumerate(rows):
        n = len(seq) - 1
        input_ids[b, :n] = torch.from_numpy(seq[:-1])
        labels[b, skip:n] = torch.from_numpy(seq[1 + skip:])
        doc_ids[b, :lead] = 0  # the separator ends the document before: outside this one's attention
    batch = {"input_ids": input_ids, "labels": labels}
    if document_mask:
        batch["doc_ids"] = doc_ids
        if reset_positions:
            batch["position_ids"] = restarted_positions(doc_ids)  # (B, T): the document starts at 0
    return batch


def eval_batches(tokenizer: TfkitTokenizer, data_spec: str, objective: str, *, seq_len: int, batch_size: int,
                 stride: int | None, seed: int, cache_dir: Path, show_progress: bool,
                 text_field: str = "text", pair_fields: tuple[str, str] = ("source", "target"),
                 document_mask: bool = False, reset_positions: bool = False,
                 masking: dict | None = None) -> tuple[Iterator[dict], int | None]:
    """(the batches to score, how many there are when known): the tokenization datasets in evaluation
    order, or sliding windows.

    `text_field` is the JSON/JSONL key holding each document's text; seq2seq pairs are read with the
    (source, target) keys the checkpoint trained with, `pair_fields`. `document_mask` / `reset_positions`:
    the packed layout the checkpoint trained with (`trained_layout`). `masking` (MLM): `MlmDataset`'s
    mask_prob / mask_replace / whole_word instead of its defaults (15%, 80/10/10)."""
    if objective == "seq2seq" and is_pair_data(data_spec, pair_fields[0]):
        dataset = Seq2SeqDataset.from_file(data_spec, tokenizer, seed, source_field=pair_fields[0],
                                           target_field=pair_fields[1], max_src_len=seq_len, max_tgt_len=seq_len)
        if any(dataset.truncated.values()):
            warnings.warn(f"{data_spec}: seq_len {seq_len} cuts {truncation_note(dataset)}; the cut tokens "
                          "are not scored", CorpusWarning, stacklevel=2)
        return _all_batches(dataset, batch_size, data_spec, seq_len)
    shards = prepare_tokens(data_spec, tokenizer, cache_dir, text_field=text_field, show_progress=show_progress)
    packing = {"document_mask": document_mask, "reset_positions": reset_positions}
    if stride is not None:
        return window_batches(sliding_windows(shards, seq_len, stride), seq_len, batch_size, **packing), None
    if objective == "clm":
        dataset = ClmDataset.from_shards(shards, seq_len, seed, **packing)
    elif objective == "mlm":
        dataset = MlmDataset.from_shards(shards, tokenizer, seq_len, seed, **packing, **(masking or {}))
    else:
        dataset = Seq2SeqDataset.denoising(shards, tokenizer, seed, max_src_len=seq_len, max_tgt_len=seq_len)
    return _all_batches(dataset, batch_size, data_spec, seq_len)


class TooLittleText(DataError):
    """The corpus gives nothing to score at this context length. Its own type, so a command without
    eval's seq_len (convert-mqa-to-gqa's eval_data) can say what helps there."""

    def __init__(self, message: str, seq_len: int, params: tuple[str, ...] = ()):
        super().__init__(message, params=params)
        self.seq_len = seq_len


def _all_batches(dataset, batch_size: int, data_spec: str, seq_len: int) -> tuple[Iterator[dict], int]:
    """Every example of the dataset in order, the last batch partial, and the number of batches; no
    example names what helps."""
    if dataset.num_examples == 0:
        raise TooLittleText(f"{data_spec}: the text gives no {dataset.name} at seq_len {seq_len}; "
                            "use a smaller seq_len, or more text", seq_len, params=("seq_len",))
    return dataset.every_example(batch_size), -(-dataset.num_examples // batch_size)


def trained_seq_len(record: CheckpointRecord) -> int:
    """The context length a checkpoint's weights were trained at (`train_seq_len`, which the trainer
    writes), or its max_seq_len when unknown (imported checkpoints). Scoring at a longer context than
    training saw measures extrapolation rather than the model: positions past data.seq_len were never
    trained (learned tables keep their init; sinusoidal/RoPE run past what the weights fit), and a
    transformer-tiny checkpoint (trained at 64, max 128) scored 6.02 at 128 against 4.53 at 64."""
    max_len = record.model.max_seq_len
    return min(record.train_seq_len or max_len, max_len)


def trained_layout(record: CheckpointRecord) -> dict[str, bool]:
    """{document_mask, reset_positions}: how the packed rows a checkpoint trained on were laid out, from its
    config.json's data record (both False where it says nothing: imports, checkpoints from before the
    record, runs without a document mask)."""
    data = record.data_record
    return {"document_mask": data.document_mask, "reset_positions": data.document_mask and data.reset_positions}


def check_batch_size(batch_size: int) -> None:
    if batch_size < 1:
        raise ConfigError(f"batch_size must be >= 1, got {batch_size}", params=("batch_size",))


def check_options(stride: int | None, seq_len: int, max_seq_len: int, objective: str, batch_size: int) -> None:
    check_batch_size(batch_size)
    if not 1 <= seq_len <= max_seq_len:
        raise ConfigError(f"seq_len must be in 1..{max_seq_len} (the model's max_seq_len), got {seq_len}",
                          params=("seq_len",))
    if stride is not None and objective != "clm":
        raise ConfigError(f"stride (sliding-window perplexity) needs a causal (GPT) checkpoint, not {objective}",
                          params=("stride",))
    if stride is not None and not 1 <= stride <= seq_len:
        raise ConfigError(f"stride must be in 1..seq_len={seq_len}, got {stride}", params=("stride",))


@dataclass
class Tally:
    """What scoring adds up over the batches: summed NLL (nats), correct and scored (predicted) tokens, their
    UTF-8 bytes, tokens fed to the model, seconds of timed forward passes, and a digest of every batch."""

    nll: float = 0.0
    correct: int = 0
    scored: int = 0
    n_bytes: int = 0
    fed: int = 0
    seconds: float = 0.0
    batches: int = 0
    digest: Any = field(default_factory=hashlib.sha256)


def _load(folder: Path, device: torch.device,
          overrides: list[str]) -> tuple[torch.nn.Module, Any, TfkitTokenizer, CheckpointRecord]:
    """(model under `overrides`, its config, tokenizer, config.json) of one checkpoint, read together so they
    all come from the same folder (`read_checkpoint`)."""
    model, cfg, tokenizer = load_with_tokenizer(folder, device=device)
    model, cfg = with_model_overrides(model, cfg, overrides)
    return model, cfg, tokenizer, CheckpointRecord.read(folder)


def checkpoint_precision(folder: Path, record: CheckpointRecord, precision: str) -> str:
    """`precision` as given, or for `auto` the one the checkpoint trained in: its config.json's, or its run's
    recipe.yaml's for a checkpoint from before `train.precision: auto`; fp32 where neither says (imports)."""
    if precision != "auto":
        return precision
    trained = record.precision or trained_precision(folder)
    return trained if trained in PRECISIONS else "fp32"


def _score(model, batches: Iterator[dict], loss_spec: ObjectiveSection, byte_table: Tensor, precision: str,
           device: torch.device, progress: ScoringProgress, max_batches: int | None,
           max_tokens: int | None) -> Tally:
    """Every batch through the model until a limit is reached; the first one once more untimed, before, so
    kernel selection and allocator growth do not count as throughput."""
    t = Tally()
    for batch in batches:
        if (max_batches is not None and t.batches >= max_batches) or (max_tokens is not None and t.scored >= max_tokens):
            break
        for name in sorted(set(batch) - set(LAYOUT_KEYS)):  # the tokens and targets, whatever layout reads them
            t.digest.update(name.encode() + batch[name].numpy().tobytes())
        labels = batch["labels"]
        if t.batches == 0:
            with autocast_context(precision, device):
                float(compute_loss(model, move_batch(batch, device), loss_spec).loss_sum)
        start = time.perf_counter()
        with autocast_context(precision, device):
            out = compute_loss(model, move_batch(batch, device), loss_spec)
        t.nll += float(out.loss_sum)  # float() syncs, so the forward is inside the timing
        t.seconds += time.perf_counter() - start
        count = int(out.count)
        t.correct, t.scored, t.batches = t.correct + int(out.correct), t.scored + count, t.batches + 1
        t.fed += count_inputs(batch)
        t.n_bytes += int(byte_table[labels[labels != IGNORE_INDEX]].sum())
        progress.update(count)
    progress.close()
    return t


@dataclass(frozen=True)
class EvalRequest:
    """How `evaluate` scores a checkpoint on a corpus (`tfkit eval`'s options, the lab's and the tests').

    Scoring stops after `max_batches` batches or once `max_tokens` tokens are scored, whichever comes first (both
    None: the whole corpus). `seq_len` defaults to the length the checkpoint trained at (`trained_seq_len`; only
    None does: 0 is an error, not "the default"); `stride` (causal models) scores sliding windows. `device` is a
    device name (runtime.pick_device) or a torch.device. `dtype` is fp32 / bf16 / fp16 autocast, or `auto`: the
    precision the checkpoint trained in (`tfkit eval`'s default; fp32 stays the library's, so callers such as the
    lab, whose scores must compare with those already written, keep their arithmetic). `seed` draws the MLM masks.
    `text_field` is the JSON/JSONL key holding the text. `overrides` (`model.KEY=VALUE`, eval's --set) evaluate the
    weights under another setting of a model key that keeps every weight (evaluation/model_overrides.py).
    `show_progress`: a bar on a terminal, a line now and then off one. `best`: a run folder's best/ when it kept
    one. `masking` (MLM checkpoints): the masking to score under, `eval_batches`' (the lab scores a model on the
    corruption it trained with); None = the common 15% with 80/10/10."""

    batch_size: int = 8
    max_batches: int | None = None
    max_tokens: int | None = None
    seq_len: int | None = None
    stride: int | None = None
    device: str | torch.device = "cpu"
    dtype: str = "fp32"
    seed: int = 0
    cache_dir: str | Path | None = None
    show_progress: bool = True
    text_field: str = "text"
    overrides: tuple[str, ...] = ()
    best: bool = False
    masking: dict | None = None


@torch.no_grad()
def evaluate(path: str | Path, data_spec: str, request: EvalRequest = EvalRequest()) -> dict:
    """Score one checkpoint (folder, or run folder: its latest checkpoint, its best/ with `request.best`) on
    `data_spec` as `request` says; returns the metrics dict (module doc)."""
    return evaluate_corpora(path, {data_spec: data_spec}, request)[data_spec]


@torch.no_grad()
def evaluate_corpora(path: str | Path, corpora: dict[str, str],
                     request: EvalRequest = EvalRequest()) -> dict[str, dict]:
    """name -> the metrics dict of one checkpoint on each named corpus (`tfkit eval --data NAME=CORPUS ...`, the
    sources of a mixture side by side), the checkpoint read once; each as `evaluate` scores it."""
    q = request
    precision = check_precision(q.dtype, allow_auto=True)
    device = q.device if isinstance(q.device, torch.device) else pick_device(q.device)
    folder, (model, cfg, tokenizer, record) = read_checkpoint(
        path, lambda f: _load(f, device, list(q.overrides)), best=q.best)
    precision = checkpoint_precision(folder, record, precision)
    objective = OBJECTIVE_FOR_ARCH[cfg.arch]
    seq_len = trained_seq_len(record) if q.seq_len is None else q.seq_len
    check_options(q.stride, seq_len, cfg.max_seq_len, objective, q.batch_size)
    byte_table = torch.from_numpy(token_byte_lengths(tokenizer))
    loaded = Loaded(folder, model, cfg, tokenizer, record, precision, objective, seq_len, byte_table, device)
    return {name: _score_corpus(loaded, spec, q, name if len(corpora) > 1 else None) for name, spec in corpora.items()}


class Loaded(NamedTuple):
    """One checkpoint as `evaluate_corpora` scores it on each corpus."""
    folder: Path
    model: torch.nn.Module
    cfg: Any
    tokenizer: TfkitTokenizer
    record: CheckpointRecord
    precision: str
    objective: str
    seq_len: int
    byte_table: Tensor
    device: torch.device


def _score_corpus(c: Loaded, data_spec: str, q: EvalRequest, name: str | None) -> dict:
    model, cfg, tokenizer, record, objective, seq_len = c.model, c.cfg, c.tokenizer, c.record, c.objective, c.seq_len
    pair_fields = record.pair_fields or ("source", "target")
    batches, total = eval_batches(tokenizer, data_spec, objective, seq_len=seq_len, batch_size=q.batch_size,
                                  stride=q.stride, seed=q.seed,
                                  cache_dir=Path(q.cache_dir) if q.cache_dir else default_cache_dir(),
                                  show_progress=q.show_progress, text_field=q.text_field, pair_fields=pair_fields,
                                  masking=q.masking if objective == "mlm" else None, **trained_layout(record))
    total = total if total is None or q.max_batches is None else min(total, q.max_batches)
    label = c.folder.name if name is None else f"{c.folder.name} on {name}"
    progress = ScoringProgress(label, total, q.max_tokens, enabled=q.show_progress)
    t = _score(model, batches, ObjectiveSection(name=objective, label_smoothing=0.0), c.byte_table, c.precision,
               c.device, progress, q.max_batches, q.max_tokens)
    if t.scored == 0:
        raise TooLittleText(f"{data_spec}: no tokens to score at seq_len {seq_len} (use a smaller seq_len, "
                            "or more data)", seq_len, params=("seq_len",))
    loss = t.nll / t.scored
    byte_table, precision, folder = c.byte_table, c.precision, c.folder
    return {
        "checkpoint": str(folder),
        "arch": cfg.arch,
        "step": record.step,  # this checkpoint's own training run
        "prior_steps": record.prior_steps,  # updates its initial weights had had (uptraining)
        "objective": objective,
        "data": data_spec,
        "loss": loss,
        "perplexity": math.exp(min(loss, 700.0)),
        "bits_per_byte": t.nll / math.log(2) / t.n_bytes if t.n_bytes else None,
        "token_accuracy": t.correct / t.scored,
        "tokens": t.scored,
        "bytes": t.n_bytes,
        "byte_coverage": (byte_coverage(tokenizer, byte_table.numpy(), data_spec, q.text_field)
                          if objective != "seq2seq" else None),
        "seq_len": seq_len,
        "stride": q.stride,
        "params": model.num_params(),
        "dtype": precision,  # of the forward passes
        # at bf16, the dtype a KV cache is kept in for inference, whatever --dtype scored: one number per model,
        # the same in convert-mqa-to-gqa's report; BERT (an encoder) has no KV cache.
        "kv_cache_bytes_per_token": None if cfg.arch == "bert" else kv_cache_bytes_per_token(cfg),
        "tokens_per_sec": t.fed / t.seconds if t.seconds else None,
        "data_fingerprint": t.digest.hexdigest()[:16],
        "set": list(q.overrides),  # the model keys evaluated under another value than the checkpoint's
    }
