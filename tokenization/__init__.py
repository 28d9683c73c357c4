"""Tokenization and data pipeline: corpus -> trained tokenizer -> token shards -> batches.

- `corpus`: read a corpus spec (file, glob, folder, JSONL, `stdlib:docs`) as a stream of text.
- `train`: train / load tokenizers (`TokenizerSpec`, `train_tokenizer`, `load_tokenizer`).
- `shards`: tokenize a corpus once into a memory-mapped token file (cached by fingerprints).
- `batches`, `masking`: CLM / MLM / seq2seq datasets whose batch `i` is a pure function of (seed, i).

Only the torch-free parts are re-exported here so that `import tfkit.tokenization` (and the CLI) stay
fast; import datasets from `tfkit.tokenization.batches`.
"""

from .corpus import corpus_fingerprint, iter_documents, iter_pieces, split_documents
from .train import TfkitTokenizer, TokenizerSpec, check_vocab_fits, load_tokenizer, train_tokenizer

__all__ = [
    "TfkitTokenizer",
    "TokenizerSpec",
    "check_vocab_fits",
    "corpus_fingerprint",
    "iter_documents",
    "iter_pieces",
    "load_tokenizer",
    "split_documents",
    "train_tokenizer",
]
