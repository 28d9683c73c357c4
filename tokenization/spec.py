"""What a tokenizer is to be: `TokenizerSpec`, the recipe's `tokenizer` section and `train-tokenizer`'s options.

Plain Python, without the `tokenizers` library, so that reading a recipe does not import it (CLI start-up
time, see tfkit.models); training lives in `train.py`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from ..errors import ConfigError

KINDS = ("bpe", "wordpiece", "unigram")
KIND_SPECIALS = {
    "bpe": ("<|endoftext|>", "<|pad|>"),
    "wordpiece": ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"),
    "unigram": ("<pad>", "<unk>", "<s>", "</s>", "<mask>"),
}


@dataclass
class TokenizerSpec:
    kind: str = "bpe"  # bpe (GPT-2 byte-level) | wordpiece (BERT) | unigram (SentencePiece / XLM-R)
    vocab_size: int = 8192  # final size including the alphabet and special tokens
    min_frequency: int = 2  # a pair must occur this often to be merged (bpe, wordpiece; unigram ignores it)
    special_tokens: list[str] = field(default_factory=list)  # extra specials, after the kind's own
    limit_alphabet: int | None = None  # wordpiece: keep only the N most frequent characters (rest -> [UNK])
    lowercase: bool = False  # lowercase before splitting (uncased models)
    strip_accents: bool | None = None  # remove accents; None = same as lowercase (BERT's convention)

    def problems(self, prefix: str = "tokenizer") -> list[str]:
        """Every invalid field or impossible combination, each as one line naming the key."""
        out: list[str] = []
        if self.kind not in KINDS:
            out.append(f"{prefix}.kind: got {self.kind!r}, expected one of {', '.join(KINDS)}")
        if not isinstance(self.vocab_size, int) or self.vocab_size < 1:
            out.append(f"{prefix}.vocab_size: got {self.vocab_size!r}, expected a positive integer")
        elif self.kind == "bpe" and self.vocab_size < self.min_vocab_size():
            out.append(
                f"{prefix}.vocab_size: got {self.vocab_size}, byte-level bpe needs at least "
                f"{self.min_vocab_size()} (256 bytes + {len(self.all_special_tokens())} special tokens)"
            )
        if not isinstance(self.min_frequency, int) or self.min_frequency < 0:
            out.append(f"{prefix}.min_frequency: got {self.min_frequency!r}, expected an integer >= 0")
        if self.limit_alphabet is not None and self.kind != "wordpiece":
            out.append(f"{prefix}.limit_alphabet: only wordpiece supports it (bpe keeps all 256 bytes, unigram "
                       f"every character); got {self.limit_alphabet} with kind {self.kind!r}")
        elif self.limit_alphabet is not None and (not isinstance(self.limit_alphabet, int) or self.limit_alphabet < 1):
            out.append(f"{prefix}.limit_alphabet: got {self.limit_alphabet!r}, expected a positive integer")
        bad = [t for t in self.special_tokens if not isinstance(t, str) or not t.strip()]
        if bad:
            out.append(f"{prefix}.special_tokens: got {bad!r}, expected non-empty strings")
        elif len(set(self.all_special_tokens())) != len(self.all_special_tokens()):
            dupes = sorted({t for t in self.special_tokens if self.all_special_tokens().count(t) > 1})
            out.append(f"{prefix}.special_tokens: {', '.join(dupes)} listed twice or already built into {self.kind}")
        return out

    def validate(self) -> "TokenizerSpec":
        if problems := self.problems():
            raise ConfigError("; ".join(problems))
        return self

    def all_special_tokens(self) -> list[str]:
        return list(KIND_SPECIALS.get(self.kind, ())) + list(self.special_tokens)

    def min_vocab_size(self) -> int:
        """Smallest vocabulary known before training (bpe: 256 bytes + specials)."""
        return (256 if self.kind == "bpe" else 1) + len(self.all_special_tokens())

    to_dict = asdict
