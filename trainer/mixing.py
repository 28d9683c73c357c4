"""A run whose `data.train` or `data.valid` is a list of named sources (tokenization/sources.py): the
tokenized sources (one token cache each, so new weights reuse them), the mixed training rows
(tokenization/mixture.py), validation per source, what start.log and the report say about each source, the
steps a source with `repeat: false` leaves, and the tokenizer's training text sampled by the same weights.

Every source is read before any training, and one that is missing, unreadable, empty or too small for its
validation share is refused in one line naming it and its path.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

from rich.console import Console
from rich.table import Table

from ..errors import CheckpointError, ConfigError, DataError, TfkitError
from ..progress import Transcript
from ..tokenization.batches import PureDataset
from ..tokenization.corpus import corpus_files, iter_documents, listing, text_size
from ..tokenization.mixture import Mixture, MixedDataset, SourceStream, ValidSources
from ..tokenization.shards import TokenShards, prepare_tokens
from ..tokenization.sources import Source, is_mixture, mixed_weights, read_sources, spec_text
from ..tokenization.token_bytes import token_byte_lengths
from ..tokenization.train import TfkitTokenizer
from .recipe import Recipe

Make = Callable[[TokenShards], PureDataset]  # the objective's dataset over token shards (data._dataset)


def train_sources(recipe: Recipe) -> list[Source]:
    d = recipe.data
    return read_sources(d.train, "data.train", d.text_field)


def named(exc: TfkitError, key: str, source: Source) -> TfkitError:
    """`exc` as one line that names the source and its path first (`data.train source docs (PATH): ...`)."""
    kind = next(k for k in (ConfigError, CheckpointError, DataError, TfkitError) if isinstance(exc, k))
    return kind(f"{key} source {source.label()}: {exc}", params=exc.params)


def source_tokens(source: Source, key: str, tokenizer: TfkitTokenizer, cache: Path, bars: bool) -> TokenShards:
    """One source tokenized into its own cache (or reopened); a problem reading it names the source."""
    try:
        shards = prepare_tokens(source.path, tokenizer, cache, text_field=source.text_field, show_progress=bars)
    except TfkitError as exc:
        raise named(exc, key, source) from None
    if shards.num_tokens == 0:
        raise DataError(f"{key} source {source.label()}: holds no text")
    return shards


def mixture_datasets(recipe: Recipe, tokenizer: TfkitTokenizer, cache: Path, make: Make, out: Console | Transcript,
                     report: bool, bars: bool) -> tuple[PureDataset, PureDataset | ValidSources]:
    """(train, valid) of a run with a list under data.train or data.valid; with `report`, one line per source."""
    d, seed = recipe.data, recipe.train.seed
    if is_mixture(d.train):
        sources = train_sources(recipe)
        shards = {s.name: source_tokens(s, "data.train", tokenizer, cache, bars) for s in sources}
    else:
        sources, shards = None, {"": prepare_tokens(d.train, tokenizer, cache, text_field=d.text_field,
                                                  show_progress=bars)}
    valid, held = _valid(recipe, tokenizer, cache, make, sources, shards, bars)
    if held:  # the training part of each source, its validation share cut out
        shards = {name: held[name][0] for name in shards}
    if sources is None:
        train = make(shards[""])
    else:
        streams = [SourceStream(s.name, shards[s.name], s.share, s.repeat, seed, i) for i, s in enumerate(sources)]
        train = MixedDataset(Mixture(streams), make, seed)
    if report:
        _describe(recipe, train, valid, sources, shards, held, cache, out)
    return train, valid


def _valid(recipe: Recipe, tokenizer: TfkitTokenizer, cache: Path, make: Make, sources: list[Source] | None,
           shards: dict[str, TokenShards], bars: bool):
    """(validation data, {name: (train part, held-out part)} when held out of the sources, else {})."""
    d = recipe.data
    if is_mixture(d.valid):
        valid_sources = read_sources(d.valid, "data.valid", d.text_field, valid=True)
        datasets = {s.name: make(source_tokens(s, "data.valid", tokenizer, cache, bars)) for s in valid_sources}
        for source in valid_sources:
            _check_rows(datasets[source.name], f"data.valid source {source.label()}", d.seq_len)
        return ValidSources(datasets, mixed_weights(valid_sources, sources), token_byte_lengths(tokenizer)), {}
    if d.valid:
        return make(prepare_tokens(d.valid, tokenizer, cache, text_field=d.text_field, show_progress=bars)), {}
    held = {name: s.split(d.valid_fraction, min_chunk=2 * (d.seq_len + 1)) for name, s in shards.items()}
    datasets = {}  # (a list under data.train: one corpus there with data.valid null is data._build's)
    for source in sources:
        datasets[source.name] = make(held[source.name][1])
        where = f"data.train source {source.label()}: its {d.valid_fraction:.0%} validation share (data.valid_fraction)"
        _check_rows(datasets[source.name], where, d.seq_len, shards[source.name].num_tokens)
    return ValidSources(datasets, {s.name: s.share for s in sources}, token_byte_lengths(tokenizer)), held


def _check_rows(dataset: PureDataset, where: str, seq_len: int, tokens: int | None = None) -> None:
    """A validation source must give at least one row of data.seq_len."""
    if dataset.num_examples >= 1:
        return
    of = f" of its {tokens:,} tokens" if tokens is not None else ""
    raise DataError(f"{where}{of} gives no {dataset.name} of data.seq_len={seq_len} to validate on; give it more "
                    "text, a larger data.valid_fraction, or name the validation text in data.valid")


def _describe(recipe: Recipe, train, valid, sources: list[Source] | None, shards: dict[str, TokenShards],
              held: dict, cache: Path, out: Console | Transcript) -> None:
    """start.log: every source, its files, documents, tokens, weight and the window share it gets."""
    d, t = recipe.data, recipe.train
    tokens_per_step = t.batch_size * d.seq_len
    if sources is not None:
        mixture = train.mixture
        out.print(f"data.train: {len(sources)} sources mixed before packing, in windows of {mixture.window:,} tokens "
                  f"whose rows are shuffled together (one token cache per source, in {cache})",
                  highlight=False, markup=False)
        for source, stream, quota in zip(sources, mixture.streams, mixture.quota):
            per_step = tokens_per_step * quota / mixture.window / stream.num_tokens  # its epochs per update
            span = (f"{1000 * per_step:.2g} epochs per 1,000 steps" if t.max_time
                    else f"{t.max_steps * per_step:.2g} epochs in {t.max_steps:,} steps")
            ends = "" if source.repeat else "; repeat: false (the run ends when it runs out)"
            out.print(f"  {source.name}: {source.path}{_files(source.path)}: {shards[source.name].num_documents:,} "
                      f"documents, {stream.num_tokens:,} tokens{_held_note(held, source.name)}; "
                      f"weight {source.weight:g} "
                      f"(share {100 * source.share:.3g}% asked, {100 * quota / mixture.window:.3g}% of every window); "
                      f"{span}{ends}", highlight=False, markup=False)
    else:
        out.print(f"data: {shards[''].num_tokens:,} training tokens from {d.train}{_files(d.train)} (cache {cache})",
                  highlight=False, markup=False)
    if isinstance(valid, ValidSources):
        parts = [f"{name} {data.num_examples:,} {data.name} (weight {100 * valid.weights[name]:.3g}%)"
                 for name, data in valid.datasets.items()]
        where = "the held-out share of each source" if held else "data.valid"
        out.print(f"validation per source ({where}): {'; '.join(parts)}; val_loss is their weighted mean",
                  highlight=False, markup=False)
    else:
        where = d.valid or f"{d.valid_fraction:.0%} of {spec_text(d.train)}, held out in chunks spread through it"
        out.print(f"validation: {valid.num_examples:,} {valid.name} from {where}", highlight=False, markup=False)


def _files(spec: str) -> str:
    files = corpus_files(spec)
    return "" if files is None else f" ({listing(files)})"


def _held_note(held: dict, name: str) -> str:
    if not held:
        return ""
    return f" (+{held[name][1].num_tokens:,} held out for validation)"


def cap_to_mixture(recipe: Recipe, train_data, out: Transcript | None) -> Recipe:
    """A mixture with a `repeat: false` source ends when the source runs out: train.max_steps becomes the
    updates it leaves, when fewer (written to recipe.yaml, so a resume ends at the same step), said in one line."""
    total = train_data.num_batches(recipe.train.batch_size // recipe.train.grad_accum) \
        if isinstance(train_data, MixedDataset) else None
    if total is None:
        return recipe
    t = recipe.train
    steps = total // t.grad_accum
    names = ", ".join(s.name for s in train_data.mixture.streams if not s.repeat)
    if steps < 1:
        raise ConfigError(f"data.train: {names} (repeat: false) runs out before one update of train.batch_size="
                          f"{t.batch_size}; give it more text or let it repeat")
    if steps >= t.max_steps:
        if out is not None:
            out.print(f"data.train: {names} (repeat: false) lasts {steps:,} steps, more than train.max_steps="
                      f"{t.max_steps:,}", highlight=False, markup=False)
        return recipe
    if out is not None:
        out.print(f"data.train: {names} (repeat: false) runs out after {steps:,} steps: the run ends there "
                  f"(train.max_steps={t.max_steps:,} becomes {steps:,})", highlight=False, markup=False)
    return replace(recipe, train=replace(t, max_steps=steps))


def sources_table(train_data, batches: int, micro_batch: int) -> Table | None:
    """The report's table of a mixture: every source's tokens, weight asked, share realised so far (in the
    packed rows of the batches read) and epochs; None for a single corpus."""
    if not isinstance(train_data, MixedDataset):
        return None
    tokens = train_data.tokens_by_source(batches, micro_batch)
    epochs = train_data.epochs(tokens)
    total = max(sum(tokens.values()), 1)
    table = Table("source", "tokens", "documents", "share asked", "share realised", "epochs",
                  title="data.train sources")
    for stream in train_data.mixture.streams:
        table.add_row(stream.name, f"{stream.num_tokens:,}", f"{stream.shards.num_documents:,}",
                      f"{100 * stream.share:.3g}%", f"{100 * tokens[stream.name] / total:.3g}%",
                      f"{epochs[stream.name]:.3g}" + ("" if stream.repeat else " (repeat: false)"))
    return table


def realised_line(train_data, batches: int, micro_batch: int) -> str | None:
    """start.log of a resumed mixture run: each source's share of the rows trained so far and its epochs."""
    if not isinstance(train_data, MixedDataset) or batches <= 0:
        return None
    tokens = train_data.tokens_by_source(batches, micro_batch)
    epochs, total = train_data.epochs(tokens), max(sum(tokens.values()), 1)
    return "data.train so far: " + ", ".join(f"{name} {100 * n / total:.3g}% ({epochs[name]:.3g} epochs)"
                                             for name, n in tokens.items())


def mixture_text_size(recipe: Recipe) -> int:
    """The text of data.train (every source of a list) in characters, for the tokenizer's progress bar."""
    if not is_mixture(recipe.data.train):
        return text_size(recipe.data.train, recipe.data.text_field)
    return sum(text_size(s.path, s.text_field) for s in train_sources(recipe))


def mixed_texts(sources: list[Source], total_chars: int, key: str = "data.train", once: bool = False) -> Iterator[str]:
    """The sources' documents interleaved by their shares of characters, `total_chars` of them: the next
    document always from the source furthest behind its share; a source that runs out starts again, unless
    it has `repeat: false`, which ends the text there (as it ends the run). What a recipe's tokenizer trains
    on. `once` (validation text): every source read at most once, the others going on after one runs out."""
    streams = {s.name: _documents(s, key) for s in sources}
    queue = [(0.0, i, s) for i, s in enumerate(sources)]  # (characters / share, order, source)
    done = 0
    while queue and done < total_chars:
        chars, i, source = heapq.heappop(queue)
        text = next(streams[source.name], None)
        if text is None and once:
            continue
        if text is None:
            if not source.repeat:
                return
            streams[source.name] = _documents(source, key)
            text = next(streams[source.name], None)
            if text is None:
                return
        yield text
        done += len(text)
        heapq.heappush(queue, (chars + len(text) / source.share, i, source))


def _documents(source: Source, key: str) -> Iterator[str]:
    try:
        yield from iter_documents(source.path, text_field=source.text_field)
    except TfkitError as exc:
        raise named(exc, key, source) from None


def check_sources(recipe: Recipe) -> None:
    """Every source of a list names a corpus that exists (a file, glob or folder that resolves, a stdlib
    corpus), before the tokenizer or anything else reads it; one line naming the first that does not."""
    from ..tokenization.corpus import corpus_fingerprint

    d = recipe.data
    for key, value in (("data.train", d.train), ("data.valid", d.valid)):
        if not is_mixture(value):
            continue
        for source in read_sources(value, key, d.text_field, valid=key == "data.valid"):
            try:
                corpus_fingerprint(source.path, source.text_field)  # resolves the files, reads none
            except TfkitError as exc:
                raise named(exc, key, source) from None
