"""Same corpus, same spec, same `tokenizer.json`: working around hash-map order in `tokenizers` training.

`tokenizers` trains BPE deterministically, but not WordPiece or Unigram (huggingface/tokenizers#1794):

- **WordPiece.** The trainer creates each continuing piece (`##e`) the first time it meets one while
  walking the word counts, a hash map, so those pieces get ids in a different order in every process.
  Merges of equal count are then ranked by those ids, so two runs learn different vocabularies (2 of
  4,096 tokens and 537 ids moved on a 1 MB corpus). Fix: a first pass over the corpus finds exactly the
  `##c` the trainer will create (`count_words`, `continuing_pieces`), which are handed to it up front in
  sorted order as special tokens, so none is created in hash order; afterwards they go back to being
  ordinary vocabulary (`unpin_continuing_pieces`). The vocabulary is the raw trainer's where it has no
  ties.
- **Unigram.** The EM sums run over sentences in hash order (scores differ by up to 4e-11), and rare
  characters that EM dropped are put back with scores `min + k * 1e-4`, k in hash order. Fix
  (`canonical_unigram`): give those characters the ladder in character order, round every score to
  `UNIGRAM_SCORE_STEP` (far above the noise, far below any difference that matters to segmentation),
  and order pieces of equal score by their text.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterable

from tokenizers import Tokenizer

CONTINUING_PREFIX = "##"
UNIGRAM_SCORE_STEP = 1e-4  # nats; the EM noise is ~1e-11, a segmentation-relevant difference >> 1e-3
UNIGRAM_PENALTY_STEP = 1e-4  # what tokenizers adds per re-inserted required character


def count_words(texts: Iterable[str], progress: Callable[[int], object] = lambda n: None) -> Counter:
    """How often each whitespace-separated raw token occurs: the first pass over a WordPiece corpus (C-speed
    splitting and counting; the per-token work below then runs once per distinct token). `progress` is
    called with each text's length (a progress bar's `update`)."""
    counts: Counter = Counter()
    for text in texts:
        counts.update(text.split())
        progress(len(text))
    return counts


def continuing_pieces(tok: Tokenizer, words: Counter, limit_alphabet: int | None) -> tuple[list[str], list[str]]:
    """(exactly the `##c` the trainer will create, the alphabet it will keep), both sorted.

    A word is a run of characters that are neither whitespace nor punctuation (BERT's pre-tokenizer), so
    `c` continues a word where it follows such a character inside a normalized token and is one itself.
    With `limit_alphabet`, the alphabet is the most frequent normalized characters, counted over words as
    the trainer counts them, ties broken by the character (tokenizers breaks them in hash order too); it
    is passed as the initial alphabet.
    """
    normalize = tok.normalizer.normalize_str if tok.normalizer is not None else (lambda s: s)
    text = normalize(" ".join(words))  # every distinct token once; normalizing may insert spaces (CJK)
    pairs = set(zip(text, text[1:]))  # pairs across a space are dropped below: a space is in no word
    chars = set(text)
    in_words = {c for c in chars if not c.isspace() and len(tok.pre_tokenizer.pre_tokenize_str("a" + c)) == 1}
    joining = {b for a, b in pairs if a in in_words and b in in_words}
    if not limit_alphabet:
        return sorted(CONTINUING_PREFIX + c for c in joining), sorted(c for c in chars if not c.isspace())
    counts: Counter = Counter()
    for raw, n in words.items():
        for char, k in Counter(normalize(raw)).items():
            if not char.isspace():
                counts[char] += k * n
    alphabet = sorted(counts, key=lambda c: (-counts[c], c))[:limit_alphabet]
    return sorted(CONTINUING_PREFIX + c for c in joining & set(alphabet)), sorted(alphabet)


def unpin_continuing_pieces(tok: Tokenizer, pinned: list[str]) -> Tokenizer:
    """The trained tokenizer with the pinned `##c` kept as ordinary vocabulary, not special tokens
    (a special `##e` would be cut out of any text that happens to contain those three characters)."""
    data = json.loads(tok.to_str())
    drop = set(pinned)
    data["added_tokens"] = [t for t in data["added_tokens"] if t["content"] not in drop]
    return Tokenizer.from_str(json.dumps(data, ensure_ascii=False))


def canonical_unigram(tok: Tokenizer, n_specials: int) -> Tokenizer:
    """The trained Unigram tokenizer with hash-order effects removed (see the module docstring).
    The first `n_specials` pieces (ids of the special tokens) stay where they are."""
    data = json.loads(tok.to_str())
    vocab = data["model"]["vocab"]
    head, pieces = vocab[:n_specials], [list(p) for p in vocab[n_specials:]]
    if pieces:
        base = min(score for _, score in pieces)
        rungs: dict[int, list[list]] = {}  # k -> single characters scored base + k * step
        for piece in pieces:
            k = (piece[1] - base) / UNIGRAM_PENALTY_STEP
            if len(piece[0]) == 1 and abs(k - round(k)) < 0.01:
                rungs.setdefault(round(k), []).append(piece)
        ladder: list[list] = []  # consecutive rungs from the bottom: the re-inserted characters
        k = 0
        while k in rungs:
            ladder += rungs[k]
            k += 1
        for k, piece in enumerate(sorted(ladder, key=lambda p: p[0])):
            piece[1] = base + k * UNIGRAM_PENALTY_STEP
        for piece in pieces:
            piece[1] = round(round(piece[1] / UNIGRAM_SCORE_STEP) * UNIGRAM_SCORE_STEP, 6)
        pieces.sort(key=lambda p: (-p[1], p[0]))
    data["model"]["vocab"] = head + pieces
    return Tokenizer.from_str(json.dumps(data, ensure_ascii=False))
