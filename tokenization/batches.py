"""Datasets for the three objectives; batch `i` is a pure function of `(seed, i)`.

Why pure functions instead of a stateful DataLoader: the loader's position in a checkpoint is just the
number of batches consumed, so resume is exact, and DDP ranks take disjoint row slices of the same global
batch (`rank` r of `world_size` W gets rows [r*B/W, (r+1)*B/W)) with no sampler state to keep in sync.

Each dataset is a list of *examples* (CLM: packed blocks; MLM: document chunks; seq2seq: pairs or
chunks). Epoch e visits them in a permutation seeded by (seed, e); global batch i is epoch
i // batches_per_epoch, slice i % batches_per_epoch of it (the last partial batch of each epoch is
dropped; it differs every epoch). Randomness inside an example (masking, noise) comes from a generator
seeded by (seed, i, global row), so a row is the same whichever rank computes it. `eval_batches` takes
examples spread evenly through the validation set with fixed seeds, so every evaluation sees the same batches.
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence

import numpy as np
import torch

from ..errors import ConfigError, DataError
from .packing import layout
from .pairs import read_pairs
from .mask_replace import MASK_REPLACE, mask_replace_problem
from .masking import IGNORE_INDEX, mask_tokens, replacement_ids, row_keys, word_start_table
from .shards import TokenShards
from .train import TfkitTokenizer

TRAIN, EVAL = 0, 1  # seed-stream tags: evaluation randomness never collides with training's


def _seed(*keys: int) -> int:
    """A 63-bit seed from integer keys (SeedSequence mixes them well; Python's hash is salted)."""
    return int(np.random.SeedSequence([int(k) for k in keys]).generate_state(1, dtype=np.uint64)[0] >> 1)


def _require(value: int | None, what: str, tok: TfkitTokenizer) -> int:
    if value is None:
        raise ConfigError(f"tokenizer {tok.path}: kind {tok.kind} has no {what}, which this objective needs")
    return value


class PureDataset(ABC):
    """Shared batching: per-epoch permutations, rank slices, sequential evaluation; the base of every dataset
    here and of the fine-tuning ones (`task_batches`, `sft_batches`)."""

    num_examples: int
    seed: int
    name = "examples"

    @abstractmethod
    def _rows(self, idx: np.ndarray, keys: list[tuple[int, ...]]) -> dict[str, torch.Tensor]:
        """The rows for example indices `idx`, randomness seeded by one key per row."""

    def rows(self, idx: np.ndarray, keys: list[tuple[int, ...]]) -> dict[str, torch.Tensor]:
        """The rows for example indices `idx`, each row's randomness keyed by its key: what a dataset that
        chooses its own examples (mixture.MixedDataset) reads through."""
        return self._rows(idx, keys)

    def over(self, tokens: np.ndarray, doc_starts: np.ndarray) -> "PureDataset":
        """A packed stream's dataset (clm, mlm: `examples_in`) over another stream, its tables and masking kept
        (a window of a mixture, mixture.py); `doc_starts` kept where this one has a document mask."""
        out = copy.copy(self)
        out.tokens, out.num_examples = tokens, self.examples_in(len(tokens))
        out.doc_starts = doc_starts if getattr(self, "doc_starts", None) is not None else None
        out.__dict__.pop("_perm_cache", None)
        return out

    def num_batches_per_epoch(self, batch_size: int) -> int:
        n = self.num_examples // batch_size
        if n == 0:
            raise DataError(f"the data gives {self.num_examples} {self.name}, fewer than one batch of {batch_size}")
        return n

    def _permutation(self, epoch: int) -> np.ndarray:
        cache = self.__dict__.setdefault("_perm_cache", {})
        if epoch not in cache:
            cache.clear()  # one epoch at a time: permutations of a large corpus are large
            cache[epoch] = np.random.default_rng([self.seed, epoch]).permutation(self.num_examples)
        return cache[epoch]

    @staticmethod
    def _local(batch_size: int, rank: int, world_size: int) -> range:
        if world_size < 1 or not 0 <= rank < world_size:
            raise ConfigError(f"rank {rank} is not in 0..world_size-1 (world_size={world_size})")
        if batch_size < 1 or batch_size % world_size:
            raise ConfigError(f"train.batch_size: {batch_size} is not divisible by the world size {world_size}")
        per = batch_size // world_size
        return range(rank * per, (rank + 1) * per)

    def batch(self, i: int, batch_size: int, rank: int = 0, world_size: int = 1) -> dict[str, torch.Tensor]:
        """Global batch `i` (batch_size rows), this rank's slice of it."""
        rows = self._local(batch_size, rank, world_size)
        per_epoch = self.num_batches_per_epoch(batch_size)
        perm = self._permutation(i // per_epoch)
        offset = (i % per_epoch) * batch_size
        idx = perm[[offset + r for r in rows]]
        return self._rows(idx, [(TRAIN, self.seed, i, r) for r in rows])

    def every_example(self, batch_size: int) -> Iterator[dict]:
        """Every example in order, `batch_size` at a time, the last batch partial: scoring a whole corpus
        (`tfkit eval`) then gives the same numbers whatever the batch size, MLM masks included, since
        each row's randomness is keyed by its example alone."""
        for lo in range(0, self.num_examples, batch_size):
            idx = np.arange(lo, min(lo + batch_size, self.num_examples))
            yield self._rows(idx, [(EVAL, self.seed, int(k)) for k in idx])

    def eval_batches(self, n: int, batch_size: int, rank: int = 0, world_size: int = 1) -> Iterator[dict]:
        """Up to `n` batches, identical on every call. Where the examples hold more than `n` batches, the
        scored ones are spread evenly through them (`_spread`), not their first n batches: a held-out sample
        or a user's validation file runs in document order, and its first rows alone are one corner of it
        (the first 40 of 175 batches of stdlib:code's held-out scored 4.23 nats where all of it scores 3.0).
        Otherwise every example in order, the last batch short when they run out first, as every trainer
        scores a small validation set (under data parallelism its length is rounded down to a multiple of the
        world size, so every rank computes as many rows)."""
        rows = self._local(batch_size, rank, world_size)
        full = self.num_examples // batch_size
        for k in range(min(n, full)):
            idx = np.array([_spread(k * batch_size + r, n * batch_size, self.num_examples) for r in rows])
            yield self._rows(idx, [(EVAL, self.seed, k, r) for r in rows])
        short = (self.num_examples - full * batch_size) // world_size * world_size
        if full < n and short:
            local = self._local(short, rank, world_size)
            yield self._rows(np.array([full * batch_size + r for r in local]), [(EVAL, self.seed, full, r) for r in local])


def _spread(position: int, scored: int, examples: int) -> int:
    """The example at `position` of `scored` evenly spaced over `examples` (the identity when all are scored)."""
    return position * examples // scored if scored < examples else position


class ClmDataset(PureDataset):
    """Causal LM: the flat stream (documents separated by EOS) cut into blocks of seq_len+1 tokens.

    Blocks overlap by one token so every token is a label exactly once; a block may span a document
    boundary, where the EOS tells the model a new document starts (GPT-2/nanoGPT packing, no padding).
    `eos_id` is that separator, kept so callers can find document boundaries inside a block.
    Returns input_ids (B, T) and labels (B, T) = the next tokens, both int64; with `doc_starts` (the
    shards', `data.document_mask`) also doc_ids (B, T), and position_ids (B, T) with `reset_positions`
    (tokenization/packing.py).
    """

    name = "blocks"

    def __init__(self, tokens: np.ndarray, seq_len: int, seed: int, eos_id: int | None, *,
                 doc_starts: np.ndarray | None = None, reset_positions: bool = False):
        if seq_len < 1:
            raise ConfigError(f"data.seq_len: got {seq_len}, expected a positive integer")
        self.tokens, self.seq_len, self.seed, self.eos_id = tokens, seq_len, seed, eos_id
        self.doc_starts, self.reset_positions = doc_starts, reset_positions
        self.num_examples = max(0, (len(tokens) - 1) // seq_len)

    @classmethod
    def from_shards(cls, shards: TokenShards, seq_len: int, seed: int, *, document_mask: bool = False,
                    reset_positions: bool = False) -> "ClmDataset":
        return cls(shards.tokens, seq_len, seed, shards.separator_id,
                   doc_starts=shards.doc_starts if document_mask else None, reset_positions=reset_positions)

    def examples_in(self, num_tokens: int) -> int:
        """Blocks a stream of `num_tokens` tokens makes."""
        return max(0, (num_tokens - 1) // self.seq_len)

    def _rows(self, idx: np.ndarray, keys: list) -> dict[str, torch.Tensor]:
        T = self.seq_len
        blocks = np.stack([np.asarray(self.tokens[k * T : k * T + T + 1], dtype=np.int64) for k in idx])
        blocks_t = torch.from_numpy(blocks)  # (B, T+1)
        batch = {"input_ids": blocks_t[:, :-1].contiguous(), "labels": blocks_t[:, 1:].contiguous()}
        if self.doc_starts is not None:
            stream = np.asarray(idx, np.int64)[:, None] * T + np.arange(T)  # (B, T) positions in the stream
            batch.update(layout(self.doc_starts, stream, self.reset_positions))
        return batch


def _chunks(starts: np.ndarray, ends: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Cut each document [start, end) into pieces of at most `size`: (chunk starts, chunk lengths)."""
    n = np.maximum(0, (ends - starts + size - 1) // size)  # chunks per document
    doc = np.repeat(np.arange(len(starts)), n)
    k = np.arange(int(n.sum())) - np.repeat(np.cumsum(n) - n, n)  # chunk number inside its document
    chunk_starts = starts[doc] + k * size
    return chunk_starts, np.minimum(size, ends[doc] - chunk_starts)


def _document_spans(tokens: np.ndarray, doc_starts: np.ndarray, separator_id: int | None):
    """(starts, ends) of each document's own tokens, without the separator the shards appended."""
    starts, ends = np.asarray(doc_starts[:-1], np.int64), np.asarray(doc_starts[1:], np.int64)
    if separator_id is not None and len(ends):
        ends = ends - (np.asarray(tokens[np.maximum(ends - 1, 0)]) == separator_id)
    return starts, np.maximum(ends, starts)


def pad_rows(rows: list[list[int]], length: int, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, length) int64 ids and (B, length) bool mask (True = real token)."""
    ids = torch.full((len(rows), length), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), length), dtype=torch.bool)
    for b, row in enumerate(rows):
        ids[b, : len(row)] = torch.as_tensor(row, dtype=torch.long)
        mask[b, : len(row)] = True
    return ids, mask


class MlmDataset(PureDataset):
    """Masked LM over packed rows: `[CLS] tokens [SEP]`, every row exactly `max_len` long.

    Row k is `[CLS]`, the k-th slice of max_len - 2 tokens of the token stream, `[SEP]`. The stream holds
    the documents back to back, each followed by its separator (`[SEP]`, or EOS for BPE), so a row may
    hold the end of one document and the start of the next with the separator between them: RoBERTa's
    FULL-SENTENCES packing, as HuggingFace's run_mlm groups texts. One document per padded row instead
    spends the compute on padding: on stdlib:docs only 41% of the positions were real at max_len 128
    and 12% at 512. Packed rows have no padding, so batches carry no attention mask, and the attention
    runs its fastest kernel (FlashAttention-2 on CUDA takes no mask). The stream's tail shorter than a
    row is dropped, as in `ClmDataset`.

    Returns input_ids (B, L), token_type_ids (B, L) zeros and labels (B, L) with -100 except at masked
    positions (see `masking.mask_tokens`), and the same targets as a fixed number K per row:
    mlm_positions (B, K) and mlm_labels (B, K), the masked positions in order, padded with position 0 and
    label -100. K depends on the shape only (`num_targets`), so the objective gathers the masked rows with
    no data-dependent shape, hence no host sync and no recompilation (STYLE.md 13). For tokenizers without
    [CLS]/[SEP] (bpe) BOS/EOS play their part; a mask token is required.
    """

    name = "rows"

    def __init__(self, tokens: np.ndarray, max_len: int, seed: int, tokenizer: TfkitTokenizer, *,
                 mask_prob: float = 0.15, whole_word: bool = False,
                 mask_replace: Sequence[float] = MASK_REPLACE, doc_starts: np.ndarray | None = None,
                 reset_positions: bool = False):
        if max_len < 3:
            raise ConfigError(f"data.seq_len: got {max_len}, MLM needs at least 3 ([CLS] token [SEP])")
        if not 0.0 < mask_prob < 1.0:
            raise ConfigError(f"objective.mask_prob: got {mask_prob}, expected 0 < value < 1")
        problem = mask_replace_problem(mask_replace)
        if problem:
            raise ConfigError(problem)
        self.mask_replace = tuple(float(v) for v in mask_replace)  # [MASK], random, unchanged
        tok = tokenizer
        self.cls_id = _require(tok.cls_id if tok.cls_id is not None else tok.bos_id, "[CLS]/BOS token", tok)
        self.sep_id = _require(tok.sep_id if tok.sep_id is not None else tok.eos_id, "[SEP]/EOS token", tok)
        self.mask_id = _require(tok.mask_id, "mask token (add '<|mask|>' to tokenizer.special_tokens)", tok)
        self.tokens, self.max_len, self.seed, self.mask_prob = tokens, max_len, seed, mask_prob
        self.doc_starts, self.reset_positions = doc_starts, reset_positions
        self.vocab_size, self.special_ids = tok.vocab_size, tok.special_ids
        self.is_special = torch.zeros(self.vocab_size, dtype=torch.bool)  # a lookup table: faster than isin
        self.is_special[self.special_ids] = True
        self.replacements = replacement_ids(self.vocab_size, self.special_ids)  # once, not per batch
        self.word_starts = word_start_table(tok.tokenizer.get_vocab(), tok.kind) if whole_word else None
        self.body_len = max_len - 2  # stream tokens per row, between [CLS] and [SEP]
        self.num_examples = len(tokens) // self.body_len
        self.num_targets = mlm_num_targets(max_len, mask_prob, whole_word)  # K of mlm_positions (B, K)

    @classmethod
    def from_shards(cls, shards: TokenShards, tokenizer: TfkitTokenizer, max_len: int, seed: int, *,
                    document_mask: bool = False, **kw):
        return cls(shards.tokens, max_len, seed, tokenizer, doc_starts=shards.doc_starts if document_mask else None,
                   **kw)

    def examples_in(self, num_tokens: int) -> int:
        """Rows a stream of `num_tokens` tokens makes."""
        return num_tokens // self.body_len

    def originals(self, idx: np.ndarray) -> torch.Tensor:
        """(B, L) int64 rows `idx` before masking: [CLS] slice [SEP]."""
        n = self.body_len
        body = np.stack([np.asarray(self.tokens[k * n : k * n + n], dtype=np.int64) for k in idx])  # (B, L-2)
        ids = torch.from_numpy(body)
        return torch.cat([torch.full((len(idx), 1), self.cls_id), ids, torch.full((len(idx), 1), self.sep_id)], 1)

    def _rows(self, idx: np.ndarray, keys: list) -> dict[str, torch.Tensor]:
        ids = self.originals(idx)  # (B, L)
        special = self.is_special[ids]  # (B, L): [CLS], [SEP], separators
        starts = None if self.word_starts is None else torch.from_numpy(self.word_starts[ids.numpy()])
        input_ids, labels = mask_tokens(ids, special, mask_id=self.mask_id, replacements=self.replacements,
                                        mask_prob=self.mask_prob, keys=row_keys(keys), word_starts=starts,
                                        replace=self.mask_replace)
        if starts is not None:  # whole words can overshoot K: the words past it stay unmasked
            begins = starts | special  # a special token ends the word before it
            begins[:, 0] = True
            over = _words_past(labels != IGNORE_INDEX, begins, self.num_targets)  # (B, L)
            input_ids, labels = torch.where(over, ids, input_ids), labels.masked_fill(over, IGNORE_INDEX)
        positions, targets = mlm_targets(labels, self.num_targets)
        batch = {"input_ids": input_ids, "labels": labels, "token_type_ids": torch.zeros_like(input_ids),
                 "mlm_positions": positions, "mlm_labels": targets}
        if self.doc_starts is not None:  # [CLS] joins the row's first document, the closing [SEP] its last
            n = self.body_len
            body = np.asarray(idx, np.int64)[:, None] * n + np.arange(n)  # (B, L-2) positions in the stream
            stream = np.concatenate([body[:, :1], body, body[:, -1:]], axis=1)  # (B, L)
            batch.update(layout(self.doc_starts, stream, self.reset_positions))
        return batch


def mlm_num_targets(max_len: int, mask_prob: float, whole_word: bool = False) -> int:
    """K, the most targets a packed MLM row of `max_len` holds: the per-row count `mask_tokens` selects for a
    body of max_len - 2 maskable tokens (its own float32 arithmetic; fewer maskable tokens never select
    more). Whole-word masking completes the last word it picks, overshooting by that word's length - 1, so
    it gets max(4, K // 4) more slots. Rows that would still overshoot leave their last words unmasked
    (`_words_past`): on stdlib:docs with 8k-token vocabularies, 0 to 0.3% of rows at L = 32..512 (2% with a
    600-token one, where a row whose first word alone is longer than K is left without a target)."""
    per_token = max(1, int((torch.tensor([float(max_len - 2)]) * mask_prob).round()))
    if not whole_word:
        return per_token
    return min(max_len - 2, per_token + max(4, per_token // 4))


def mlm_targets(labels: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The labelled positions of `labels (B, L)` (-100 = none) as `(positions (B, k), targets (B, k))`: the
    labelled positions of each row in order, then position 0 with target -100 as padding. A row with
    more than k labels is an error of the caller (`MlmDataset` caps its rows at `num_targets`)."""
    B, L = labels.shape
    labelled = labels != IGNORE_INDEX  # (B, L)
    count = labelled.sum(dim=1, keepdim=True)  # (B, 1)
    if B and int(count.max()) > k:
        raise ValueError(f"a row holds more than {k} targets")
    slot = torch.where(labelled, labelled.cumsum(dim=1) - 1, k)  # (B, L) each label's slot; k = none (dropped)
    positions = torch.zeros(B, k + 1, dtype=torch.long).scatter_(1, slot, torch.arange(L).expand(B, L))[:, :k]
    real = torch.arange(k) < count  # (B, k)
    positions = positions.masked_fill(~real, 0)
    return positions, torch.gather(labels, 1, positions).masked_fill(~real, IGNORE_INDEX)


def _words_past(selected: torch.Tensor, starts: torch.Tensor, k: int) -> torch.Tensor:
    """(B, L) bool: the selected tokens of the words that end past the row's k-th selected token, in
    position order (whole words, so whole-word masking stays whole). `starts`: where a word begins."""
    unit = torch.cumsum(starts.long(), dim=1) - 1  # (B, L) word index of each token
    upto = torch.cumsum(selected.long(), dim=1)  # (B, L) selected tokens up to here
    word_end = torch.zeros_like(upto).scatter_reduce(1, unit, upto, reduce="amax")  # (B, L) per word: at its end
    return selected & (torch.gather(word_end, 1, unit) > k)


def _noise_spans(n: int, density: float, mean_span: float, rng: np.random.Generator) -> np.ndarray:
    """(n,) bool noise mask of about density*n tokens in spans of mean length `mean_span` (T5's
    random_spans_noise_mask): noise and kept lengths are random compositions, kept text first."""
    n_noise = min(max(1, round(n * density)), n - 1)
    n_spans = max(1, min(round(n_noise / mean_span), n_noise, n - n_noise))

    def parts(total: int) -> np.ndarray:
        cuts = np.sort(rng.choice(np.arange(1, total), n_spans - 1, replace=False)) if n_spans > 1 else []
        return np.diff(np.concatenate([[0], cuts, [total]])).astype(np.int64)

    lengths = np.stack([parts(n - n_noise), parts(n_noise)], axis=1).reshape(-1)  # kept, noise, kept, ...
    return np.repeat(np.tile([False, True], n_spans), lengths)


class Seq2SeqDataset(PureDataset):
    """Encoder-decoder pairs: `from_pairs` / `from_file` (translation-style data) or `denoising` (plain
    text, BART-style infilling: source = a chunk with ~15% of its tokens, in spans of mean length 3,
    each span replaced by ONE mask token, target = the original chunk; one mask token rather than T5's
    sentinels because every tfkit tokenizer has a mask token and the target is the whole text).

    Returns src_ids (B, S) = source + EOS, src_mask (B, S) bool, tgt_ids (B, T) = BOS + target,
    tgt_mask (B, T) bool, labels (B, T) = target + EOS with -100 on padding. S = max_src_len,
    T = max_tgt_len; longer pairs are truncated and counted in `self.truncated`.
    """

    name = "pairs"

    def __init__(self, tokenizer: TfkitTokenizer, seed: int, max_src_len: int, max_tgt_len: int):
        if max_src_len < 2 or max_tgt_len < 2:
            raise ConfigError(f"data.max_src_len/max_tgt_len: got {max_src_len}/{max_tgt_len}, expected >= 2")
        tok = tokenizer
        self.bos_id = _require(tok.bos_id if tok.bos_id is not None else tok.cls_id, "BOS/[CLS] token", tok)
        self.eos_id = _require(tok.eos_id if tok.eos_id is not None else tok.sep_id, "EOS/[SEP] token", tok)
        self.pad_id = _require(tok.pad_id, "padding token", tok)
        self.tokenizer, self.seed, self.max_src_len, self.max_tgt_len = tok, seed, max_src_len, max_tgt_len
        self.truncated = {"source": 0, "target": 0}
        self.pairs: tuple[list[list[int]], list[list[int]]] | None = None
        self.noise: tuple[np.ndarray, np.ndarray, np.ndarray, float, float] | None = None
        self.num_examples = 0

    @classmethod
    def from_pairs(cls, pairs: Sequence[tuple[str, str]], tokenizer: TfkitTokenizer, seed: int, *,
                   max_src_len: int = 256, max_tgt_len: int = 256) -> "Seq2SeqDataset":
        ds = cls(tokenizer, seed, max_src_len, max_tgt_len)
        src = tokenizer.encode_batch([p[0] for p in pairs])
        tgt = tokenizer.encode_batch([p[1] for p in pairs])
        ds.truncated = {"source": sum(len(s) > max_src_len - 1 for s in src),
                        "target": sum(len(t) > max_tgt_len - 1 for t in tgt)}
        ds.pairs = ([s[: max_src_len - 1] for s in src], [t[: max_tgt_len - 1] for t in tgt])
        ds.num_examples = len(pairs)
        return ds

    @classmethod
    def from_file(cls, spec: str, tokenizer: TfkitTokenizer, seed: int, *, source_field: str = "source",
                  target_field: str = "target", **lengths) -> "Seq2SeqDataset":
        return cls.from_pairs(read_pairs(spec, source_field, target_field), tokenizer, seed, **lengths)

    @classmethod
    def denoising(cls, shards: TokenShards, tokenizer: TfkitTokenizer, seed: int, *, max_src_len: int = 256,
                  max_tgt_len: int = 256, noise_density: float = 0.15, mean_span: float = 3.0) -> "Seq2SeqDataset":
        ds = cls(tokenizer, seed, max_src_len, max_tgt_len)
        mask = _require(tokenizer.mask_id, "mask token (add '<|mask|>' to tokenizer.special_tokens)", tokenizer)
        starts, ends = _document_spans(shards.tokens, shards.doc_starts, shards.separator_id)
        chunk_starts, chunk_lens = _chunks(starts, ends, min(max_src_len, max_tgt_len) - 1)
        ds.noise = (shards.tokens, chunk_starts, chunk_lens, noise_density, mean_span)
        ds.mask_id, ds.num_examples = mask, len(chunk_starts)
        return ds

    def _example(self, k: int, key: tuple[int, ...]) -> tuple[list[int], list[int]]:
        if self.pairs is not None:
            return self.pairs[0][k], self.pairs[1][k]
        tokens, starts, lens, density, mean_span = self.noise  # type: ignore[misc]
        target = np.asarray(tokens[starts[k] : starts[k] + lens[k]], dtype=np.int64)
        if len(target) < 2:
            return target.tolist(), target.tolist()
        noise = _noise_spans(len(target), density, mean_span, np.random.default_rng(_seed(*key)))
        span_start = noise & ~np.concatenate([[False], noise[:-1]])
        source = np.where(span_start, self.mask_id, target)[~noise | span_start]
        return source.tolist(), target.tolist()

    def _rows(self, idx: np.ndarray, keys: list) -> dict[str, torch.Tensor]:
        examples = [self._example(int(k), key) for k, key in zip(idx, keys)]
        src_ids, src_mask = pad_rows([s + [self.eos_id] for s, _ in examples], self.max_src_len, self.pad_id)
        tgt_ids, tgt_mask = pad_rows([[self.bos_id] + t for _, t in examples], self.max_tgt_len, self.pad_id)
        labels, _ = pad_rows([t + [self.eos_id] for _, t in examples], self.max_tgt_len, IGNORE_INDEX)
        return {"src_ids": src_ids, "src_mask": src_mask, "tgt_ids": tgt_ids, "tgt_mask": tgt_mask, "labels": labels}
