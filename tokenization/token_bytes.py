"""How many bytes of text each token stands for: what bits per byte divide by, and byte coverage.

bits_per_byte = total NLL (nats) / ln 2 / UTF-8 bytes of the scored tokens. Unlike perplexity it does
not depend on the tokenizer, so models with different vocabularies compare. Bytes are counted per
scored token from a per-id table (`token_byte_lengths`), by the scheme read from tokenizer.json itself
(`byte_scheme`; special tokens stand for no text):
- byte-level BPE (tfkit's bpe, GPT-2, RoBERTa): every token is a fixed byte string - exact;
- SentencePiece style (byte-fallback BPE of Llama/Mistral/Gemma, Unigram of T5 and tfkit's unigram): a
`<0xNN>` byte token is one byte, "▁" the one space it stands for, other characters their UTF-8 length -
exact up to the "▁" Metaspace prepends to each encoded text (document, or 64k-character piece of one)
that does not start with a space, the normalizer (NFKC) and text that became <unk>;
- WordPiece drops whitespace while pre-tokenizing, so a word-start token is counted with the one space
it replaced (exact for single-spaced text, an estimate otherwise).

byte_coverage = the bytes the tokens stand for / the UTF-8 bytes of the text, on the corpus's first
COVERAGE_CHARS characters: 1.0 for a lossless tokenizer (byte-level BPE). Below 1, the tokenizer drops
text (newlines and indentation for WordPiece, characters that became <unk>) that the model then never
predicts, so its bits per byte are not comparable with a lossless tokenizer's.
"""

from __future__ import annotations

import json
import re

import numpy as np

from .corpus import iter_documents
from .train import TfkitTokenizer

METASPACE = "\u2581"  # SentencePiece's word-start marker: one space of the text
BYTE_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>")  # a byte-fallback token: one byte of the text
COVERAGE_CHARS = 100_000  # characters byte_coverage tokenizes: enough for a stable share, a fraction of a second


def _component_types(section: dict | list | None) -> set[str]:
    """Every component `type` in a tokenizer.json section (pre_tokenizer, decoder), inside Sequences too."""
    if isinstance(section, list):
        return set().union(*(_component_types(s) for s in section))
    if not isinstance(section, dict):
        return set()
    found = {section["type"]} if isinstance(section.get("type"), str) else set()
    return found.union(*(_component_types(v) for v in section.values() if isinstance(v, (dict, list))))


def byte_scheme(tokenizer: TfkitTokenizer) -> tuple[str, bool]:
    """(scheme, byte_fallback): how a token string maps to text bytes, read from the tokenizer's own pipeline.

    The model type alone cannot tell: Llama's SentencePiece BPE is a "BPE" like GPT-2's but spells text in
    UTF-8 with "▁" and `<0x0A>`, not in the byte-level alphabet. Scheme "byte-level" (a ByteLevel
    pre-tokenizer or decoder), "wordpiece" (a WordPiece model) or "sentencepiece" (everything else: the
    token's own characters, "▁" as a space); byte_fallback says whether `<0xNN>` tokens are bytes."""
    data = json.loads(tokenizer.tokenizer.to_str())
    model = data.get("model") or {}
    parts = _component_types(data.get("pre_tokenizer")) | _component_types(data.get("decoder"))
    byte_fallback = bool(model.get("byte_fallback")) or "ByteFallback" in parts
    if model.get("type") == "WordPiece":
        return "wordpiece", byte_fallback
    return ("byte-level" if "ByteLevel" in parts else "sentencepiece"), byte_fallback


def token_bytes(token: str, scheme: str, byte_fallback: bool) -> int:
    """UTF-8 bytes of text one (non-special) token stands for under `byte_scheme`; see module doc."""
    if scheme == "byte-level":  # one alphabet character per byte
        return len(token)
    if scheme == "wordpiece":
        piece = token[2:] if token.startswith("##") else token
        word_start = not token.startswith("##") and piece[:1].isalnum()
        return len(piece.encode("utf-8")) + word_start
    if byte_fallback and BYTE_TOKEN.fullmatch(token):
        return 1
    return len(token.replace(METASPACE, " ").encode("utf-8"))  # "▁" is exactly the space it replaced


def token_byte_lengths(tokenizer: TfkitTokenizer) -> np.ndarray:
    """(V,) int64: UTF-8 bytes of text each token id stands for (0 for special tokens); see module doc."""
    scheme, byte_fallback = byte_scheme(tokenizer)
    vocab = tokenizer.tokenizer.get_vocab(with_added_tokens=True)
    table = np.zeros(max(max(vocab.values()) + 1, tokenizer.vocab_size), dtype=np.int64)
    specials = set(tokenizer.special_ids)
    for token, i in vocab.items():
        if i not in specials:
            table[i] = token_bytes(token, scheme, byte_fallback)
    return table


def byte_coverage(tokenizer: TfkitTokenizer, byte_table: np.ndarray, data_spec: str, text_field: str = "text",
                  max_chars: int = 0) -> float:
    """The share of the text's UTF-8 bytes its tokens stand for (module doc), on the corpus's first
    `max_chars` (default COVERAGE_CHARS) characters of documents."""
    texts, size = [], 0
    for text in iter_documents(data_spec, text_field=text_field):
        texts.append(text)
        size += len(text)
        if size >= (max_chars or COVERAGE_CHARS):
            break
    total = sum(len(t.encode("utf-8")) for t in texts)
    kept = sum(int(byte_table[np.asarray(ids, dtype=np.int64)].sum()) for ids in tokenizer.encode_batch(texts) if ids)
    return kept / total if total else 1.0
