"""`tfkit train-tokenizer`: train a BPE / WordPiece / Unigram tokenizer on a corpus and print its report.

Thin on purpose: the work lives in `tfkit.tokenization` (corpus readers, training, report), so the same
thing is one function call from Python. Errors are `TfkitError`s, printed by the app's error boundary.
The options and --out are checked before the corpus is read, so a typo costs a second, not a training.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from ..errors import ConfigError
from ..files import write_problem
from ..replacing import check_not_an_input


def check_out_folder(out: Path, corpus: str | None = None) -> None:
    """--out must be a folder or a path where one can be made: a regular file there, or in its way
    (`--out notes.txt/tok`), is refused before training rather than after it; and never the corpus, a folder
    that holds it or one inside a corpus folder (the next read of the corpus would take the tokenizer's
    files for text)."""
    if corpus is not None:
        check_not_an_input(out, [corpus], "--out")
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out}: is a file, expected a folder (tokenizer.json and its companions go inside)")
    problem = write_problem(out)
    if problem:
        raise ConfigError(f"--out {out}: {problem}")


def train_tokenizer(
    corpus: Annotated[
        str, typer.Argument(help="File, glob ('data/*.txt'), folder, JSONL, Parquet, a datasets save_to_disk folder, "
                                 ".txt/.jsonl .gz/.zst, or stdlib:docs / stdlib:code[:train].")
    ],
    out: Annotated[Path, typer.Option("--out", "-o", help="Output folder for tokenizer.json and friends.")],
    kind: Annotated[str, typer.Option(help="bpe (GPT-2 byte-level) | wordpiece (BERT) | unigram (SentencePiece).")] = (
        "bpe"
    ),
    vocab_size: Annotated[int, typer.Option(help="Final vocabulary size, specials and alphabet included.")] = 8192,
    min_frequency: Annotated[int, typer.Option(help="Minimum pair count for a merge (bpe, wordpiece).")] = 2,
    special_token: Annotated[
        Optional[list[str]], typer.Option("--special-token", help="Extra special token (repeatable).")
    ] = None,
    limit_alphabet: Annotated[Optional[int], typer.Option(help="wordpiece: keep the N most frequent chars.")] = None,
    lowercase: Annotated[bool, typer.Option(help="Lowercase the text first (uncased models).")] = False,
    strip_accents: Annotated[
        Optional[bool], typer.Option("--strip-accents/--keep-accents", help="wordpiece: remove accents (default: when lowercasing, as BERT).")
    ] = None,
    text_field: Annotated[str, typer.Option(help="JSON/JSONL key or Parquet/Arrow column holding the text.")] = "text",
    heldout_chars: Annotated[
        int, typer.Option(help="Characters held out for the report (at most 10%), in blocks of lines drawn through the whole corpus.")
    ] = 200_000,
    force: Annotated[bool, typer.Option("--force", help="Replace an output folder with a different tokenizer.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")] = False,
) -> None:
    """Train a tokenizer on CORPUS and save tokenizer.json, the transformers config files and a report.

    About --heldout-chars of the corpus, blocks of lines drawn (seeded) from all through it, are not
    trained on; the report measures bytes per token, tokens per word and the unknown-token rate on them.
    """
    from ..tokenization.corpus import check_text_field, corpus_files, iter_documents, text_size
    from ..tokenization.holdout import hold_out_spread
    from ..tokenization.report import print_report  # imports deferred: `--help` stays fast
    from ..tokenization.train import TokenizerSpec, train_tokenizer as train

    if heldout_chars < 0:
        raise ConfigError(f"--heldout-chars must be >= 0 (0 = no held-out report), got {heldout_chars}")
    check_out_folder(out, corpus)
    check_text_field(corpus, text_field)
    spec = TokenizerSpec(
        kind=kind,
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(special_token or []),
        limit_alphabet=limit_alphabet,
        lowercase=lowercase,
        strip_accents=strip_accents,
    ).validate()
    heldout: list[str] = []  # filled by hold_out_spread when the stream ends, read by the report

    def texts():  # a fresh stream per call: wordpiece reads the corpus twice
        heldout.clear()
        return hold_out_spread(iter_documents(corpus, text_field=text_field), heldout_chars, heldout)

    report = train(spec, texts, out, show_progress=not quiet, heldout=heldout, force=force,
                   progress_total=text_size(corpus, text_field), corpus_files=corpus_files(corpus))
    print_report(report)
    typer.echo(f"saved {out}")
