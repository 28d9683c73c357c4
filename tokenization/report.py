"""The tokenizer report: the numbers that tell you whether a vocabulary is any good, as JSON and a table.

Measured on held-out text (never trained on), because compression on the training text flatters the
tokenizer: bytes per token (higher = shorter sequences = cheaper training), tokens per whitespace word
(fertility; ~1.3 for a good English vocabulary), and the unknown-token rate (information lost; 0 for
byte-level BPE by construction). The first merges (bpe, wordpiece: the most frequent pairs at training
time) or highest-scoring pieces (unigram) are a quick sanity check that the corpus was what you meant.
"""

from __future__ import annotations

import json
import platform
from collections import Counter
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

from ..progress import console as output_console
from .corpus import listing

if TYPE_CHECKING:
    from .spec import TokenizerSpec
    from .tokenizer import TfkitTokenizer

TOP_N = 10


def _top_entries(tok: "TfkitTokenizer", heldout_ids: list[list[int]]) -> list[str]:
    """bpe: the first merges (most frequent pairs at training time, in training order). wordpiece and
    unigram: the most frequent multi-character pieces of the held-out text (wordpiece ids carry no
    frequency order), else unigram's highest-scoring pieces."""
    model = json.loads(tok.tokenizer.to_str())["model"]
    if model["type"] == "BPE":
        return [m if isinstance(m, str) else " ".join(m) for m in model["merges"][:TOP_N]]
    special = set(tok.special_ids)
    counts = Counter(i for ids in heldout_ids for i in ids if i not in special)
    pieces = [tok.id_to_token(i) for i, _ in counts.most_common()]
    if not pieces and model["type"] == "Unigram":
        pieces = [p for p, _ in sorted(model["vocab"], key=lambda p: -p[1]) if tok.token_to_id(p) not in special]
    return [p for p in pieces if len(p.removeprefix("##").removeprefix("\u2581")) > 1][:TOP_N]


def heldout_stats(tok: "TfkitTokenizer", heldout: list[str] | None) -> tuple[dict, list[list[int]]]:
    """Compression and unknown rate on held-out text (None values when there is none), and its ids."""
    texts = [t for t in heldout or [] if t.strip()]
    if not texts:
        return {"heldout_bytes": 0, "bytes_per_token": None, "tokens_per_word": None, "unk_rate": None}, []
    ids = tok.encode_batch(texts)
    n_tokens = sum(len(x) for x in ids)
    n_bytes = sum(len(t.encode("utf-8")) for t in texts)
    n_words = sum(len(t.split()) for t in texts)
    unk = tok.unk_id
    n_unk = 0 if unk is None else sum(x.count(unk) for x in ids)
    return {
        "heldout_bytes": n_bytes,
        "bytes_per_token": round(n_bytes / n_tokens, 4) if n_tokens else None,
        "tokens_per_word": round(n_tokens / n_words, 4) if n_words else None,
        "unk_rate": round(n_unk / n_tokens, 6) if n_tokens else None,
    }, ids


def build_report(
    tok: "TfkitTokenizer", spec: "TokenizerSpec", heldout: list[str] | None, seconds: float, chars: int,
    files: list[str] | None = None,
) -> dict:
    """Everything `tokenizer_report.json` holds; `files`: those a folder or glob corpus read."""
    stats, heldout_ids = heldout_stats(tok, heldout)
    return {
        "kind": spec.kind,
        "vocab_size": tok.vocab_size,
        "requested_vocab_size": spec.vocab_size,
        "special_tokens": {i: tok.id_to_token(i) for i in tok.special_ids},
        "training_chars": chars,
        "training_seconds": round(seconds, 3),
        **stats,
        "top_merges" if spec.kind == "bpe" else "top_pieces": _top_entries(tok, heldout_ids),
        "fingerprint": tok.fingerprint(),
        "spec": spec.to_dict(),
        "python": platform.python_version(),
        **({"corpus_files": files} if files is not None else {}),
    }


def print_report(report: dict, console: Console | None = None) -> None:
    """The report as a two-column rich table (what `tfkit train-tokenizer` prints)."""
    table = Table(title=f"{report['kind']} tokenizer", show_header=False)
    table.add_column("metric", style="bold")
    table.add_column("value")
    rows = [
        ("vocab size", f"{report['vocab_size']:,} (asked {report['requested_vocab_size']:,})"),
        ("training text", f"{report['training_chars']:,} chars in {report['training_seconds']:.1f} s"),
        ("held-out text", f"{report['heldout_bytes']:,} bytes"),
        ("bytes / token", _fmt(report["bytes_per_token"])),
        ("tokens / word", _fmt(report["tokens_per_word"])),
        ("unknown-token rate", _fmt(report["unk_rate"], pct=True)),
        ("special tokens", " ".join(f"{i}:{t}" for i, t in report["special_tokens"].items())),
    ]
    if "corpus_files" in report:
        rows.insert(1, ("corpus files", listing(report["corpus_files"])))
    key = "top_pieces" if "top_pieces" in report else "top_merges"
    rows.append((key.replace("_", " "), ", ".join(repr(m) for m in report[key])))
    for name, value in rows:
        table.add_row(name, value)
    (console or output_console()).print(table)


def _fmt(value: float | None, pct: bool = False) -> str:
    if value is None:
        return "n/a (no held-out text)"
    return f"{value:.3%}" if pct else f"{value:.3f}"
