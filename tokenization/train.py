"""Train a tokenizer (byte-level BPE, BERT WordPiece, SentencePiece-style Unigram) into a folder.

Each kind is a composed HuggingFace `tokenizers` pipeline (normalizer -> pre-tokenizer -> model ->
post-processor -> decoder) trained from an iterator, so a corpus larger than memory streams through and
the result is the standard `tokenizer.json` that `tokenizers`, `transformers` and tfkit all load:

| kind      | like    | special tokens (ids from 0)             | unknown text           |
| --------- | ------- | --------------------------------------- | ---------------------- |
| bpe       | GPT-2   | `<|endoftext|>` (BOS = EOS), `<|pad|>`  | impossible (256 bytes) |
| wordpiece | BERT    | `[PAD] [UNK] [CLS] [SEP] [MASK]`        | `[UNK]`                |
| unigram   | XLM-R   | `<pad> <unk> <s> </s> <mask>`           | `<unk>`                |

Training is deterministic for every kind: the same text and spec give a byte-identical tokenizer.json
in any process. tokenizers trains WordPiece and Unigram in hash-map order; `determinism.py` works around
it (WordPiece reads the corpus twice for that: `texts` may be a function returning a fresh iterable).

The output folder is written to a temporary sibling and published whole (files.py): new, or replacing
an existing one in one step, with whatever else that held carried over, so an interrupted run or a full
disk leaves the old tokenizer or the new one, never a mix; an existing folder holding a different
tokenizer is never replaced unless `force=True`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from ..errors import ConfigError, DataError
from ..files import carry_over, holds_working_folder, staged_folder, write_files_into
from ..progress import interactive, progress_bar
from .determinism import canonical_unigram, continuing_pieces, count_words, unpin_continuing_pieces
from .report import build_report
from .spec import KIND_SPECIALS, KINDS, TokenizerSpec  # noqa: F401 - re-exported: tfkit.tokenization.train.TokenizerSpec
from .tokenizer import (KIND_ROLES, MASK_NAMES, ROLES, TfkitTokenizer, parse_tokenizer,  # noqa: F401 - re-exported
                        check_vocab_fits, load_tokenizer, roles_for, tokenizer_files, write_tokenizer_files)

if TYPE_CHECKING:
    from tqdm import tqdm  # the type of the bars progress_bar makes

REPORT_FILE = "tokenizer_report.json"
MAX_VOCAB = 2**24  # far beyond any real vocabulary; tokenizers' BPE trainer aborts the process near 1e9


def _normalizer(spec: TokenizerSpec):
    strip = spec.lowercase if spec.strip_accents is None else spec.strip_accents
    if spec.kind == "wordpiece":
        return normalizers.BertNormalizer(clean_text=True, lowercase=spec.lowercase, strip_accents=strip)
    steps = [normalizers.NFKC()] if spec.kind == "unigram" else []  # SentencePiece's default
    if strip:
        steps += [normalizers.NFD(), normalizers.StripAccents(), normalizers.NFC()]
    if spec.lowercase:
        steps.append(normalizers.Lowercase())
    return normalizers.Sequence(steps) if steps else None


def build_pipeline(spec: TokenizerSpec, show_progress: bool = False) -> tuple[Tokenizer, trainers.Trainer]:
    """The untrained tokenizer and its trainer for a spec: the single place the three kinds differ.
    `show_progress` enables tokenizers' own bars for the merge / EM phase after the text is read."""
    specials = spec.all_special_tokens()
    if spec.kind == "bpe":
        tok = Tokenizer(models.BPE())  # no unk_token: every byte is in the alphabet
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=spec.vocab_size,
            min_frequency=spec.min_frequency,
            special_tokens=specials,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=show_progress,
        )
    elif spec.kind == "wordpiece":
        tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        cls, sep = specials.index("[CLS]"), specials.index("[SEP]")
        tok.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]",
            pair="[CLS] $A [SEP] $B:1 [SEP]:1",
            special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
        )
        tok.decoder = decoders.WordPiece(prefix="##")
        trainer = trainers.WordPieceTrainer(
            vocab_size=spec.vocab_size,
            min_frequency=spec.min_frequency,
            special_tokens=specials,
            continuing_subword_prefix="##",
            show_progress=show_progress,
            **({} if spec.limit_alphabet is None else {"limit_alphabet": spec.limit_alphabet}),
        )
    elif spec.kind == "unigram":
        tok = Tokenizer(models.Unigram())
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
        bos, eos = specials.index("<s>"), specials.index("</s>")
        tok.post_processor = processors.TemplateProcessing(
            single="<s> $A </s>",
            pair="<s> $A </s> </s> $B </s>",
            special_tokens=[("<s>", bos), ("</s>", eos)],
        )
        tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
        trainer = trainers.UnigramTrainer(
            vocab_size=spec.vocab_size, special_tokens=specials, unk_token="<unk>", show_progress=show_progress
        )
    else:
        raise ConfigError(f"tokenizer.kind: got {spec.kind!r}, expected one of {', '.join(KINDS)}")
    normalizer = _normalizer(spec)
    if normalizer is not None:
        tok.normalizer = normalizer
    return tok, trainer


def _counted(texts: Iterable[str], bar: tqdm, seen: dict) -> Iterator[str]:
    """Drive the progress bar and remember the characters seen (for the empty/too-small checks)."""
    for text in texts:
        seen["chars"] += len(text)
        seen["alphabet"].update(text)
        bar.update(len(text))
        yield text


def _reader(texts: Iterable[str] | Callable[[], Iterable[str]], kind: str) -> Callable[[], Iterable[str]]:
    """A function giving the corpus once per call: wordpiece reads it twice (see determinism.py)."""
    if callable(texts):
        return texts
    if kind == "wordpiece" and iter(texts) is texts:
        raise TypeError("wordpiece training reads the texts twice: pass a collection or a function returning "
                        "a fresh iterable, not a one-shot iterator")
    return lambda: texts


def _check_out_dir(out: Path, force: bool) -> None:
    if out.exists() and not out.is_dir():
        raise DataError(f"tokenizer output {out}: exists and is not a folder")
    if not force and out.is_dir() and any(out.iterdir()) and not (out / "tokenizer.json").exists():
        raise DataError(f"tokenizer output {out}: folder is not empty and holds no tokenizer (use force)",
                        params=("force",))


def _publish(files: dict[str, bytes], out: Path, force: bool) -> None:
    """Write the finished files as the folder `out`, published whole (staged and renamed into place), so
    a full disk or a killed process leaves the old folder or the complete new one, never a mix of two
    tokenizers (the working folder itself, `--out .`, has its files replaced: `write_files_into`).
    Anything else an existing folder holds (a model's weights beside its tokenizer, the
    user's notes) is carried into the new one, with --force too. A different tokenizer already there is
    replaced only with `force`; the same one is refreshed."""
    old = out / "tokenizer.json"
    if old.exists() and old.read_bytes() != files["tokenizer.json"] and not force:
        raise DataError(f"tokenizer output {out}: holds a different tokenizer; use force to replace it",
                        params=("force",))
    if holds_working_folder(out):  # `--out .`: the folder itself is never renamed
        write_files_into(out, files)
        return
    with staged_folder(out) as tmp:
        carry_over(out, tmp, files)
        for name, data in files.items():
            (tmp / name).write_bytes(data)


def train_tokenizer(
    spec: TokenizerSpec,
    texts: Iterable[str] | Callable[[], Iterable[str]],
    out_dir: str | Path,
    *,
    show_progress: bool = True,
    heldout: list[str] | None = None,
    force: bool = False,
    progress_total: int | None = None,
    corpus_files: list[str] | None = None,
) -> dict:
    """Train on `texts`, save the folder, return the report (also saved as JSON).

    `texts` is streamed once, except for wordpiece, which first reads the characters of the corpus: give
    it a collection or a function that returns a fresh iterable each time it is called.

    `heldout` texts (never trained on) give the compression and unknown-rate figures of the report.
    `progress_total` is the approximate corpus size in characters, for the progress bar only;
    `corpus_files`, the files a folder or glob corpus reads, are recorded in the report.
    Raises ConfigError for an invalid spec or a vocabulary smaller than the corpus alphabet, DataError
    for an empty corpus or an output folder that must not be overwritten.
    """
    spec.validate()
    if spec.vocab_size > MAX_VOCAB:  # the tokenizers trainer aborts the whole process (capacity overflow) near 1e9
        raise ConfigError(f"vocab_size: got {spec.vocab_size}, expected at most {MAX_VOCAB:,} (2**24)")
    out = Path(out_dir)
    _check_out_dir(out, force)
    tok, trainer = build_pipeline(spec, show_progress and interactive())  # off a terminal its bars leave empty lines
    stream = _reader(texts, spec.kind)
    start = time.perf_counter()
    pinned: list[str] = []
    if spec.kind == "wordpiece":
        with progress_bar(total=progress_total, unit="char", unit_scale=True, desc="read words",
                          enabled=show_progress) as bar:
            words = count_words(stream(), bar.update)
        pinned, alphabet = continuing_pieces(tok, words, spec.limit_alphabet)
        trainer.special_tokens = spec.all_special_tokens() + pinned
        if spec.limit_alphabet is not None:
            trainer.initial_alphabet = alphabet
    texts = stream()
    length = len(texts) if hasattr(texts, "__len__") else None  # type: ignore[arg-type]
    with progress_bar(total=progress_total, unit="char", unit_scale=True, desc=f"train {spec.kind}",
                      enabled=show_progress) as bar:
        seen: dict = {"chars": 0, "alphabet": set()}
        try:
            tok.train_from_iterator(_counted(texts, bar, seen), trainer, length=length)
        except Exception as e:  # noqa: BLE001 - tokenizers raises bare Exception for user problems
            if "not large enough" in str(e):
                raise _too_small(spec, tok, seen["alphabet"]) from None
            raise
    if pinned:
        tok = unpin_continuing_pieces(tok, pinned)
    elif spec.kind == "unigram":
        tok = canonical_unigram(tok, len(spec.all_special_tokens()))
    seconds = time.perf_counter() - start
    if seen["chars"] == 0 or not "".join(seen["alphabet"]).strip():
        raise DataError("tokenizer corpus is empty: no text to train on")
    if tok.get_vocab_size() > spec.vocab_size:
        raise _too_small(spec, tok, seen["alphabet"], minimum=tok.get_vocab_size())
    files = tokenizer_files(tok, spec.kind, roles_for(spec.kind, spec.special_tokens), spec.special_tokens,
                            spec.to_dict())
    trained = parse_tokenizer(files["tokenizer.json"], files["tokenizer_config.json"], out / "tokenizer.json")
    report = build_report(trained, spec, heldout, seconds, seen["chars"], corpus_files)
    files[REPORT_FILE] = (json.dumps(report, indent=2, ensure_ascii=False) + "\n").encode()
    _publish(files, out, force)
    return report


def _too_small(spec: TokenizerSpec, tok: Tokenizer, alphabet: set[str], minimum: int | None = None) -> ConfigError:
    """One line naming tokenizer.vocab_size and the minimum the corpus alphabet (plus specials) needs."""
    about = "" if minimum is not None else "about "
    if minimum is None:  # unigram refuses before building anything: estimate from the normalized alphabet
        chars = tok.normalizer.normalize_str("".join(sorted(alphabet))) if tok.normalizer else "".join(alphabet)
        minimum = len(set(chars) - set(" \t\n\r")) + 1 + len(spec.all_special_tokens())
    hint = " (or set tokenizer.limit_alphabet)" if spec.kind == "wordpiece" else ""
    return ConfigError(
        f"tokenizer.vocab_size: got {spec.vocab_size}, smaller than the alphabet of this corpus; "
        f"{spec.kind} needs at least {about}{minimum}{hint}"
    )
