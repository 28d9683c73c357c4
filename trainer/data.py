"""The data side of a run: its tokenizer folder, its train/validation datasets, and the loader thread that
prepares the next update's batches while the current one trains (`Prefetcher`).

`build_run_data` gives a fine-tuning run its labelled examples (task.py) and any other run the datasets of
its objective. With `data.format: chat` the run's tokenizer is grown by the chat tokens
(`prepare_chat_tokenizer`) and the model's vocabulary with it (`grow_chat_vocab`).

Rank 0 calls `prepare_tokenizer` (training or copying) and the shard-building half of `build_datasets`
while the other ranks wait at a barrier; afterwards every rank opens the same cached shards. Token shards
are cached under `data.cache_dir` (default `<run folder>/data`) keyed by corpus and tokenizer, so a
resumed run or a second run with the same tokenizer skips tokenization.
"""

from __future__ import annotations

import dataclasses
import math
import shutil
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import torch
from rich.console import Console

from ..errors import CheckpointError, ConfigError
from ..files import carry_over, staged_folder
from ..layout import TOKENIZER_FILES
from ..models.config import ModelConfig
from ..models.heads import HeadConfig
from ..progress import Transcript
from ..tokenization.batches import ClmDataset, MlmDataset, Seq2SeqDataset
from ..tokenization.chat import encode_chat, grow_tokenizer, read_conversations
from ..tokenization.sft_batches import SftDataset
from ..tokenization.pairs import is_pair_data, read_pairs
from ..tokenization.corpus import corpus_files, iter_documents, listing, text_size
from ..tokenization.holdout import hold_out_spread, sample_documents
from ..tokenization.shards import prepare_tokens
from ..tokenization.sources import is_mixture, read_sources, spec_text
from ..tokenization.train import TfkitTokenizer, TokenizerSpec, load_tokenizer, train_tokenizer
from . import task
from .mixing import cap_to_mixture, check_sources, mixed_texts, mixture_datasets, mixture_text_size
from .distributed import DistInfo, barrier
from .objectives import count_inputs, count_targets
from .recipe import Recipe

HELDOUT_CHARS = 200_000  # validation text used for the tokenizer report (bytes per token, unknown rate)


def prepare_tokenizer(recipe: Recipe, out: Path, source: Path | None, console: Console | Transcript) -> None:
    """Fill `out` with the run's tokenizer: the checkpoint's (resume / init_from), the one at
    `tokenizer.path`, or a new one trained on at most `tokenizer.max_train_mb` of `data.train` (a list of
    sources: sampled by their weights, `mixing.mixed_texts`)."""
    check_sources(recipe)  # every source of a list exists, before anything reads one
    if source is not None:
        if not (source / "tokenizer.json").is_file():
            raise CheckpointError(f"{source}: holds no tokenizer.json, so the run cannot know its token ids")
        with staged_folder(out) as tmp:  # the run's tokenizer/ is replaced whole, never left half copied
            carry_over(out, tmp, TOKENIZER_FILES)  # its tokenizer_report.json stays
            for name in TOKENIZER_FILES:
                if (source / name).is_file():
                    shutil.copy2(source / name, tmp / name)
        copied = load_tokenizer(out)
        console.print(f"tokenizer: {copied.kind}, vocab {copied.vocab_size}, copied from {source}", highlight=False)
        return
    if recipe.tokenizer.path:
        tokenizer = load_tokenizer(recipe.tokenizer.path)  # validates it
        if recipe.objective.name in ("mlm", "seq2seq") and tokenizer.mask_id is None and \
                (is_mixture(recipe.data.train) or not is_pair_data(recipe.data.train, recipe.data.source_field)):
            raise ConfigError(
                f"tokenizer.path {recipe.tokenizer.path}: a {tokenizer.kind} tokenizer without a mask token, which "
                f"objective {recipe.objective.name} needs; train one with `tfkit train-tokenizer ... "
                "--special-token '<|mask|>'` (bpe) or use kind wordpiece or unigram")
        with staged_folder(out) as tmp:
            carry_over(out, tmp, TOKENIZER_FILES)
            tokenizer.save(tmp)  # writes the standard files
        console.print(f"tokenizer: {tokenizer.kind}, vocab {tokenizer.vocab_size}, from {recipe.tokenizer.path}",
                      highlight=False)
        return
    spec = TokenizerSpec(**{f.name: getattr(recipe.tokenizer, f.name) for f in dataclasses.fields(TokenizerSpec)})
    limit = int(recipe.tokenizer.max_train_mb * 1e6) if recipe.tokenizer.max_train_mb else None

    size = mixture_text_size(recipe)
    total = min(size, limit or size)
    heldout: list[str] = []  # the report's text: the valid corpus, or blocks held out of the training text

    def texts() -> Iterator[str]:  # a fresh stream per call: wordpiece reads the corpus twice
        stream = _first_chars(tokenizer_texts(recipe, total_chars=total), limit)
        if recipe.data.valid:
            return stream
        heldout.clear()
        return hold_out_spread(stream, HELDOUT_CHARS, heldout, max_fraction=recipe.data.valid_fraction)

    if recipe.data.valid:
        heldout = list(_first_chars(tokenizer_texts(recipe, recipe.data.valid, HELDOUT_CHARS), HELDOUT_CHARS))
    amount = f"{total / 1e6:.1f} MB" if total >= 100_000 else f"{total / 1e3:.1f} kB"
    console.print(f"training a {spec.kind} tokenizer (vocab {spec.vocab_size}) on {amount} of "
                  f"{spec_text(recipe.data.train)}", highlight=False)
    report = train_tokenizer(spec, texts, out, show_progress=recipe.log.progress, heldout=heldout, force=True,
                             progress_total=total)
    summary = {k: v for k, v in report.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    console.print("tokenizer: " + ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}"
                                            for k, v in list(summary.items())[:6]), highlight=False)


def prepare_chat_tokenizer(recipe: Recipe, out: Path, console: Console | Transcript) -> None:
    """`data.format: chat`: the run's tokenizer grown by the chat template's tokens (tokenization/chat.py);
    one that has them (a resume, a chat model fine-tuned again), or any other run's, is left as it is."""
    if recipe.data.format != "chat":
        return
    tokenizer = load_tokenizer(out)
    grown = grow_tokenizer(tokenizer)
    if grown is tokenizer:
        return
    with staged_folder(out) as tmp:
        carry_over(out, tmp, TOKENIZER_FILES)
        grown.save(tmp)
    console.print(f"tokenizer: {grown.vocab_size - tokenizer.vocab_size} chat tokens added, vocab "
                  f"{grown.vocab_size}", highlight=False)


def grow_chat_vocab(recipe: Recipe, cfg: ModelConfig, tokenizer: TfkitTokenizer) -> tuple[Recipe, ModelConfig]:
    """`data.format: chat`: the model config and the recipe's model section grown to the vocabulary of the
    tokenizer with the chat tokens (`prepare_chat_tokenizer`), so recipe.yaml says what a resume builds;
    the weights follow in `checkpoint.load_source_weights`. Any other run is returned as it is."""
    if recipe.data.format != "chat" or tokenizer.vocab_size <= cfg.vocab_size:
        return recipe, cfg
    cfg = dataclasses.replace(cfg, vocab_size=tokenizer.vocab_size)
    return dataclasses.replace(recipe, model=dataclasses.replace(recipe.model, vocab_size=cfg.vocab_size)), cfg


def _first_chars(texts: Iterable[str], limit: int | None) -> Iterator[str]:
    """The stream cut after `limit` characters (the last text truncated), all of it when None."""
    seen = 0
    for text in texts:
        if limit is not None and seen + len(text) >= limit:
            yield text[: limit - seen]
            return
        seen += len(text)
        yield text


def build_datasets(recipe: Recipe, tokenizer: TfkitTokenizer, run_dir: Path, info: DistInfo,
                   console: Console | Transcript):
    """(train, valid) datasets of the recipe's objective. Rank 0 tokenizes into the shard cache first;
    the other ranks then open the cached shards (a memmap, no second tokenization)."""
    cache = Path(recipe.data.cache_dir) if recipe.data.cache_dir else run_dir / "data"
    datasets = _build(recipe, tokenizer, cache, console, report=True, bars=recipe.log.progress) if info.is_main else None
    barrier(info)
    return datasets if info.is_main else _build(recipe, tokenizer, cache, console, report=False, bars=False)


def fit_to_data(recipe: Recipe, train_data, out: Transcript | None) -> Recipe:
    """The recipe and training data as the data's size decides them: `data.max_train_samples` keeps the first N
    training examples, and `train.epochs` becomes `train.max_steps` (examples // batch_size updates an epoch,
    rounded up), written to recipe.yaml so a resume runs the same schedule. Each is said on `out`."""
    d, t = recipe.data, recipe.train
    if d.max_train_samples is not None and d.max_train_samples < train_data.num_examples:
        if out is not None:
            out.print(f"data: data.max_train_samples={d.max_train_samples:,}: training on the first "
                      f"{d.max_train_samples:,} of {train_data.num_examples:,} {train_data.name}", highlight=False,
                      markup=False)
        train_data.num_examples = d.max_train_samples
    if t.epochs is None:
        return cap_to_mixture(recipe, train_data, out)
    per_epoch = train_data.num_examples // t.batch_size
    if per_epoch < 1:
        raise ConfigError(f"train.epochs: the training data gives {train_data.num_examples:,} {train_data.name}, "
                          f"fewer than one batch of train.batch_size={t.batch_size}")
    steps = math.ceil(t.epochs * per_epoch)
    if out is not None:
        out.print(f"train.epochs={t.epochs:g}: {steps:,} steps ({per_epoch:,} an epoch: {train_data.num_examples:,} "
                  f"{train_data.name} at train.batch_size={t.batch_size}), in place of train.max_steps",
                  highlight=False, markup=False)
    return cap_to_mixture(dataclasses.replace(recipe, train=dataclasses.replace(t, max_steps=steps)), train_data, out)


def build_run_data(recipe: Recipe, tokenizer: TfkitTokenizer, cfg: ModelConfig, run_dir: Path, info: DistInfo,
                   console: Transcript) -> tuple[object, object, HeadConfig | None]:
    """(train, valid, head) of a run: a fine-tuning recipe's labelled examples and the head their labels
    make (`task.build_task_data`), or a language-model objective's datasets (`build_datasets`) and None."""
    if recipe.head_task is not None:
        return task.build_task_data(recipe, tokenizer, cfg, console if info.is_main else None)
    return (*build_datasets(recipe, tokenizer, run_dir, info, console), None)


def _build(recipe: Recipe, tokenizer: TfkitTokenizer, cache: Path, console: Console | Transcript, report: bool,
           bars: bool):
    """`report`: print what the run trains and validates on (rank 0, whatever log.progress says);
    `bars`: progress bars while tokenizing (log.progress)."""
    d, seed, name = recipe.data, recipe.train.seed, recipe.objective.name
    where = d.valid if d.valid else f"{d.valid_fraction:.0%} of {d.train}, held out in chunks spread through it"
    if d.format == "chat":
        return _chat_datasets(recipe, tokenizer, console, report)
    if is_mixture(d.train) or is_mixture(d.valid):  # named sources: mixing.py
        return mixture_datasets(recipe, tokenizer, cache, lambda shards: _dataset(recipe, tokenizer, shards),
                                console, report, bars)
    if name == "seq2seq" and is_pair_data(d.train, d.source_field):
        lengths = dict(max_src_len=d.seq_len, max_tgt_len=d.seq_len)
        pairs = read_pairs(d.train, d.source_field, d.target_field)
        if d.valid:
            valid_pairs = read_pairs(d.valid, d.source_field, d.target_field)
        else:
            pairs, valid_pairs = sample_documents(pairs, d.valid_fraction)
        out = (Seq2SeqDataset.from_pairs(pairs, tokenizer, seed, **lengths),
               Seq2SeqDataset.from_pairs(valid_pairs, tokenizer, seed, **lengths))
        if report:
            console.print(f"data: {out[0].num_examples:,} training pairs from {d.train}; {out[1].num_examples:,} "
                          f"validation pairs from {where}", highlight=False)
        for what, dataset in zip(("training", "validation"), out):
            if report and any(dataset.truncated.values()):
                console.print(f"warning: data.seq_len={d.seq_len} cuts {truncation_note(dataset)} of the {what} "
                              "data; the cut tokens are never trained on", style="yellow", highlight=False)
    else:
        train = prepare_tokens(d.train, tokenizer, cache, text_field=d.text_field, show_progress=bars)
        if d.valid:
            valid = prepare_tokens(d.valid, tokenizer, cache, text_field=d.text_field, show_progress=bars)
        else:
            train, valid = train.split(d.valid_fraction, min_chunk=2 * (d.seq_len + 1))
        if report:
            per_step = recipe.train.batch_size * d.seq_len / max(train.num_tokens, 1)  # epochs per update
            epochs = (f"{1000 * per_step:.2g} epochs per 1,000 steps; train.max_time decides the steps"
                      if recipe.train.max_time else
                      f"{recipe.train.max_steps * per_step:.2g} epochs in {recipe.train.max_steps:,} steps")
            console.print(f"data: {train.num_tokens:,} training tokens from {d.train} ({epochs}); "
                          f"{valid.num_tokens:,} validation tokens from {where} (cache {cache})", highlight=False)
            for key, spec in (("data.train", d.train), ("data.valid", d.valid)):
                if spec and (files := corpus_files(spec)) is not None:  # a folder or glob: which files it read
                    console.print(f"{key}: {listing(files)}", highlight=False)
        out = tuple(_dataset(recipe, tokenizer, shards) for shards in (train, valid))
    return out


def _dataset(recipe: Recipe, tokenizer: TfkitTokenizer, shards):
    d, o, seed = recipe.data, recipe.objective, recipe.train.seed
    packing = {"document_mask": d.document_mask, "reset_positions": d.reset_positions}
    if o.name == "clm":
        return ClmDataset.from_shards(shards, d.seq_len, seed, **packing)
    if o.name == "mlm":
        return MlmDataset.from_shards(shards, tokenizer, d.seq_len, seed, mask_prob=o.mask_prob,
                                      whole_word=o.whole_word_mask, mask_replace=o.mask_replace, **packing)
    return Seq2SeqDataset.denoising(shards, tokenizer, seed, max_src_len=d.seq_len, max_tgt_len=d.seq_len)


def _chat_datasets(recipe: Recipe, tokenizer: TfkitTokenizer, console: Console | Transcript, report: bool):
    """(train, valid) packed chat rows; validation from data.valid, or conversations sampled out of data.train."""
    d, seed = recipe.data, recipe.train.seed
    pad = tokenizer.pad_id if tokenizer.pad_id is not None else tokenizer.separator_id or 0
    train = [encode_chat(tokenizer, turns, where=where) for where, turns in read_conversations(d.train)]
    if d.valid:
        valid = [encode_chat(tokenizer, turns, where=where) for where, turns in read_conversations(d.valid)]
    else:
        train, valid = sample_documents(train, d.valid_fraction)
    out = SftDataset(train, d.seq_len, seed, pad), SftDataset(valid, d.seq_len, seed, pad)
    if report:
        console.print(f"data: {out[0].num_conversations:,} conversations from {d.train} in {out[0].num_examples:,} "
                      f"rows ({out[0].num_tokens:,} assistant tokens); {out[1].num_conversations:,} for validation "
                      f"from {d.valid or f'{d.valid_fraction:.0%} of {d.train}'}", highlight=False)
        for what, dataset in zip(("training", "validation"), out):
            if dataset.cut:
                console.print(f"warning: data.seq_len={d.seq_len} cuts {dataset.cut:,} {what} conversations; "
                              "their tails are never trained on", style="yellow", highlight=False)
    return out


def truncation_note(dataset: Seq2SeqDataset) -> str:
    """'3 sources and 12 targets (of N pairs)': what a length limit cut, which the loss never sees."""
    cut = dataset.truncated
    return f"{cut['source']:,} sources and {cut['target']:,} targets (of {dataset.num_examples:,} pairs)"


def tokenizer_texts(recipe: Recipe, spec: str | list | None = None, total_chars: int | None = None) -> Iterator[str]:
    """The text of corpus `spec` (default: data.train) as a tokenizer sees it: documents, or both sides of
    seq2seq pairs (whose JSONL records have no `text` field); a list of sources sampled by their weights,
    `total_chars` of it (default: as much as the sources hold)."""
    d = recipe.data
    spec = d.train if spec is None else spec
    if is_mixture(spec):
        key = "data.train" if spec is d.train else "data.valid"
        sources = read_sources(spec, key, d.text_field, valid=key == "data.valid")
        total = total_chars or sum(text_size(s.path, s.text_field) for s in sources)
        return mixed_texts(sources, total, key, once=key == "data.valid")
    if d.format == "chat":
        return (content for _, turns in read_conversations(spec) for _, content in turns)
    if recipe.objective.name == "seq2seq" and is_pair_data(spec, d.source_field):
        return (f"{s}\n{t}" for s, t in read_pairs(spec, d.source_field, d.target_field))
    return iter_documents(spec, text_field=d.text_field)


class Prefetcher:
    """The micro-batches of one update, prepared on a background thread while the previous update runs.

    `get(first)` returns the update whose first global micro-batch is `first` (this rank's micro-batches of it,
    as `plan` splits it: trainer/batch_plan.py): (batches, counts), where
    `counts` is a float64 (2,) tensor of this rank's predicted and input tokens, counted here on the host
    from the host copies, so the training thread never reads a count back. `prefetch(first)` starts the
    next one; `wait()` lets it finish. The datasets are pure functions of the batch index (ARCHITECTURE.md),
    so reading ahead changes nothing a checkpoint holds: the index is the whole state, resume stays exact.
    On CUDA the tensors come in pinned memory, and `objectives.move_batch` copies them without blocking.
    The dataset is only ever called from this thread, one batch at a time.
    """

    def __init__(self, dataset, plan, info: DistInfo) -> None:
        self.dataset, self.plan, self.info = dataset, plan, info  # plan: batch_plan.BatchPlan, this rank's rows
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tfkit-batches")
        self._pending: tuple[int, Future] | None = None

    def _prepare(self, first: int) -> tuple[list[dict[str, torch.Tensor]], torch.Tensor]:
        micro = [self.dataset.batch(index, size, part, parts)
                 for index, size, part, parts in self.plan.parts(first, self.info.rank)]
        counts = torch.tensor([sum(count_targets(b) for b in micro), sum(count_inputs(b) for b in micro)],
                              dtype=torch.float64)  # (2,) predicted, input tokens
        if self.info.device.type == "cuda":
            micro = [{k: v.pin_memory() for k, v in b.items()} for b in micro]
            counts = counts.pin_memory()
        return micro, counts

    def prefetch(self, first: int) -> None:
        if self._pending is None or self._pending[0] != first:
            self.wait()
            self._pending = (first, self._pool.submit(self._prepare, first))

    def get(self, first: int) -> tuple[list[dict[str, torch.Tensor]], torch.Tensor]:
        self.prefetch(first)
        _, future = self._pending
        self._pending = None
        return future.result()

    def wait(self) -> None:
        """Until the batches being prepared are ready (an error in the dataset is raised by `get`)."""
        if self._pending is not None:
            self._pending[1].exception()

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> "Prefetcher":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
