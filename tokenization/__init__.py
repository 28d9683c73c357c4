"""Tokenization and data pipeline: corpus -> trained tokenizer -> token shards -> batches.

- `corpus`: read a corpus spec (file, glob, folder, JSONL, `stdlib:docs`) as a stream of text.
- `readers`, `encoding`: one reader per text format (plain text, JSON lines, CSV / TSV) for every data
  file, and the one UTF-8 policy they read by.
- `spec`, `train`, `tokenizer`: what a tokenizer is to be (`TokenizerSpec`); training one; a trained one
  as tfkit reads it (`TfkitTokenizer`, `load_tokenizer`).
- `determinism`: the same corpus gives the same tokenizer.json (WordPiece and Unigram included).
- `shards`: tokenize a corpus once into a memory-mapped token file (cached by fingerprints).
- `batches`, `masking`: CLM / MLM / seq2seq datasets whose batch `i` is a pure function of (seed, i).

Names are imported on first use (PEP 562), so that `tfkit.tokenization.spec` (read by every recipe)
costs neither the `tokenizers` library nor torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "corpus_fingerprint": "corpus", "iter_documents": "corpus", "iter_pieces": "corpus", "sample_documents": "holdout",
    "TokenizerSpec": "spec", "TfkitTokenizer": "tokenizer", "check_vocab_fits": "tokenizer",
    "load_tokenizer": "tokenizer", "train_tokenizer": "train",
}


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = list(_EXPORTS)
