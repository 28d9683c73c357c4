"""Fine-tuning inputs: labelled texts laid out as each family was pretrained, cut to length, batched.

Layouts (`layout_for`), so a fine-tuned model reads its input the way it learned to read text:
- bert: `[CLS] a [SEP]`, a pair `[CLS] a [SEP] b [SEP]` with segment ids 0 up to the first [SEP] and 1
  after it, as BERT was pretrained and as its tokenizer's own post-processor lays pairs out;
- gpt: `a EOS`, a pair `a EOS b EOS`, after the document prefix generation uses (the previous document's
  EOS, or the BOS a Llama-style tokenizer starts documents with): pretraining packed `doc EOS doc EOS`, so
  EOS is the separator the model knows, and the last real token, the one a GPT head pools, is always
  that EOS, which has read the whole input;
- transformer (its encoder): `a EOS`, a pair `a EOS b EOS`: seq2seq sources are encoded as `source EOS`.
A tokenizer without a token the layout needs is a ConfigError naming it.

Long texts are cut to `max_len` (`truncation`): `head` keeps the first tokens, `tail` the last, `head+tail`
the first `HEAD_SHARE` of the room and the end (Sun et al. 2019, "How to Fine-Tune BERT for Text
Classification?": the first 128 and last 382 tokens did best on IMDb, and HEAD_SHARE = 128 / 510 keeps
exactly those at BERT's 512). A pair is cut longest first, as HF tokenizers' `longest_first`: the shorter
text keeps all its tokens when it fits in half the room, each keeps half otherwise (the longer, or the
second of equals, the odd token). `Encoded.truncated` counts the examples that lost tokens, for the run
to report. Or a long single text is read whole, as sliding windows (`encode_windows`, every `stride`
tokens, the last ending at the text's end), each window a row with its text's target; `Encoded.owners`
maps rows to texts, and `models.heads.pool_windows` averages a text's window logits.

`TaskDataset` batches them as every tfkit dataset does: batch `i` a pure function of `(seed, i)`,
`labels` class ids (int64) or float targets (float32), and the rows either padded on the right to
`max_len` (fixed shapes) or, `packed` (bert and gpt), laid back to back in as few rows of `max_len` as
fit, attention and positions kept inside each example (task_packing.py: the same logits, less padding).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..errors import ConfigError
from .batches import PureDataset, pad_rows
from .labelled import Examples
from .task_packing import packed_batch
from .tokenizer import TfkitTokenizer

ARCHS = ("bert", "gpt", "transformer")
PACKABLE = ("bert", "gpt")  # families whose forward takes doc_ids and position_ids (the encoder-decoder's does not)
TRUNCATIONS = ("head", "tail", "head+tail")
HEAD_SHARE = 128 / 510  # head+tail: the share of the room kept from the start (Sun et al. 2019)


@dataclass(frozen=True)
class Layout:
    """The special ids around one text (`prefix a suffix`) or a pair (`prefix a middle b suffix`)."""

    prefix: tuple[int, ...]
    middle: tuple[int, ...]
    suffix: tuple[int, ...]
    segments: bool  # token_type_ids: 0 for prefix, a and middle, 1 for b and suffix (BERT pairs)

    def specials(self, pair: bool) -> int:
        return len(self.prefix) + len(self.suffix) + (len(self.middle) if pair else 0)


def _need(token_id: int | None, what: str, tokenizer: TfkitTokenizer, arch: str) -> int:
    if token_id is None:
        raise ConfigError(f"tokenizer {tokenizer.path}: kind {tokenizer.kind} has no {what}, which the {arch} "
                          "input layout needs")
    return token_id


def layout_for(arch: str, tokenizer: TfkitTokenizer, pairs: bool, type_vocab_size: int = 2) -> Layout:
    """The layout of family `arch` with this tokenizer's special tokens (see the module doc)."""
    if arch not in ARCHS:
        raise ConfigError(f"model.arch: got {arch!r}, expected one of {', '.join(ARCHS)}")
    if arch == "bert":
        if pairs and type_vocab_size < 2:
            raise ConfigError(f"model.type_vocab_size: {type_vocab_size}, but a text pair needs segment ids 0 "
                              "and 1 (BERT's layout of pairs)")
        cls = _need(tokenizer.cls_id, "[CLS] token", tokenizer, arch)
        sep = _need(tokenizer.sep_id, "[SEP] token", tokenizer, arch)
        return Layout((cls,), (sep,), (sep,), segments=pairs)
    sep = _need(tokenizer.separator_id, "EOS or [SEP] token", tokenizer, arch)
    prefix = tuple(tokenizer.document_prefix()) if arch == "gpt" else ()
    return Layout(prefix, (sep,), (sep,), segments=False)


def cut(ids: list[int], keep: int, truncation: str) -> list[int]:
    """`ids` cut to `keep` tokens: the first (head), the last (tail), or HEAD_SHARE of them from the start
    and the rest from the end (head+tail)."""
    if len(ids) <= keep:
        return ids
    head = {"head": keep, "tail": 0}.get(truncation, round(keep * HEAD_SHARE))
    return ids[:head] + ids[len(ids) - (keep - head):]


def pair_room(len_a: int, len_b: int, room: int) -> tuple[int, int]:
    """How many tokens each text of a pair keeps in `room`: longest first (see the module doc)."""
    if len_a + len_b <= room:
        return len_a, len_b
    if len_a > len_b:  # the longer text takes what the shorter leaves, an odd room's extra token too
        keep_b = min(len_b, room // 2)
        return room - keep_b, keep_b
    keep_a = min(len_a, room // 2)
    return keep_a, room - keep_a


@dataclass
class Encoded:
    rows: list[list[int]]  # token ids, specials included, each at most max_len
    segments: list[list[int]] | None  # token type ids, for layouts with segments
    owners: list[int]  # the example each row is of: one row per example, or its windows in order
    truncated: int = 0  # examples that lost tokens
    windowed: int = 0  # examples read as several windows


def _room(layout: Layout, max_len: int, pair: bool) -> int:
    """The tokens of text a row of `max_len` holds beside the layout's specials; ConfigError when none."""
    room = max_len - layout.specials(pair)
    if room < (2 if pair else 1):
        raise ConfigError(f"data.max_len: {max_len} leaves no room for text beside the layout's "
                          f"{layout.specials(pair)} special tokens")
    return room


def encode_examples(texts: list[str], pairs: list[str] | None, tokenizer: TfkitTokenizer, layout: Layout,
                    max_len: int, truncation: str = "head") -> Encoded:
    """The texts (and second texts) laid out and cut to `max_len` tokens each."""
    if truncation not in TRUNCATIONS:
        raise ConfigError(f"data.truncation: got {truncation!r}, expected one of {', '.join(TRUNCATIONS)}")
    room = _room(layout, max_len, pairs is not None)
    firsts = tokenizer.encode_batch(texts)
    seconds = tokenizer.encode_batch(pairs) if pairs is not None else [None] * len(firsts)
    out = Encoded([], [] if layout.segments else None, list(range(len(firsts))))
    for a, b in zip(firsts, seconds):
        if b is None:
            out.rows.append([*layout.prefix, *cut(a, room, truncation), *layout.suffix])
            out.truncated += len(a) > room
            continue
        keep_a, keep_b = pair_room(len(a), len(b), room)
        first = [*layout.prefix, *cut(a, keep_a, truncation), *layout.middle]
        second = [*cut(b, keep_b, truncation), *layout.suffix]
        out.rows.append(first + second)
        out.truncated += len(a) + len(b) > room
        if out.segments is not None:
            out.segments.append([0] * len(first) + [1] * len(second))
    return out


def window_starts(length: int, room: int, stride: int) -> list[int]:
    """Where the windows of `room` tokens over a text of `length` tokens start: every `stride` tokens, the
    last one ending at the text's end, so every token is in a window and none is padding."""
    if length <= room:
        return [0]
    return [*range(0, length - room, stride), length - room]


def encode_windows(texts: list[str], tokenizer: TfkitTokenizer, layout: Layout, max_len: int,
                   stride: int) -> Encoded:
    """Each text laid out as sliding windows of up to `max_len` tokens, `stride` text tokens apart: a long
    text is read whole, as several rows whose logits `models.heads.pool_windows` averages."""
    room = _room(layout, max_len, pair=False)
    if not 1 <= stride <= room:
        raise ConfigError(f"data.stride: got {stride}, expected 1 to {room} (the text tokens of a window)")
    out = Encoded([], None, [])
    for k, ids in enumerate(tokenizer.encode_batch(texts)):
        starts = window_starts(len(ids), room, stride)
        out.rows += [[*layout.prefix, *ids[s:s + room], *layout.suffix] for s in starts]
        out.owners += [k] * len(starts)
        out.windowed += len(starts) > 1
    return out


class TaskDataset(PureDataset):
    """Laid-out rows and their targets; batches of `labels` (B,) and either `input_ids`, `attention_mask`
    (B, max_len) with `token_type_ids` for layouts with segments, or, `packed`, the keys of
    `task_packing.packed_batch` (input_ids (R, max_len) holding the B rows back to back). A window has its
    text's target; `owners` (R,) says which example each row is of, for pooling the windows' logits."""

    def __init__(self, encoded: Encoded, targets: list, max_len: int, pad_id: int, seed: int, regression: bool,
                 packed: bool = False):
        self.encoded, self.max_len, self.pad_id, self.seed, self.packed = encoded, max_len, pad_id, seed, packed
        self.owners = torch.tensor(encoded.owners, dtype=torch.long)  # (R,)
        targets = torch.tensor(targets, dtype=torch.float32 if regression else torch.long)  # (N,)
        self.labels = targets[self.owners]  # (R,)
        self.num_examples = len(encoded.rows)

    def _rows(self, idx: np.ndarray, keys: list) -> dict[str, torch.Tensor]:
        rows = [self.encoded.rows[k] for k in idx]
        segments = None if self.encoded.segments is None else [self.encoded.segments[k] for k in idx]
        labels = self.labels[torch.as_tensor(idx)]  # (B,)
        if self.packed:
            return {**packed_batch(rows, segments, self.max_len, self.pad_id), "labels": labels}
        ids, mask = pad_rows(rows, self.max_len, self.pad_id)  # (B, T) each
        batch = {"input_ids": ids, "attention_mask": mask, "labels": labels}
        if segments is not None:
            batch["token_type_ids"] = pad_rows(segments, self.max_len, 0)[0]
        return batch


def task_dataset(examples: Examples, tokenizer: TfkitTokenizer, arch: str, *, max_len: int, seed: int,
                 regression: bool, truncation: str = "head", stride: int | None = None,
                 type_vocab_size: int = 2, packed: bool = False) -> TaskDataset:
    """One split of a fine-tuning run as a dataset of family `arch`'s layout: each text cut to `max_len`
    (`truncation`), or, with a `stride`, read as sliding windows (single texts only); batches `packed`
    where the family can read packed rows (PACKABLE), padded otherwise."""
    pair = examples.pairs is not None
    layout = layout_for(arch, tokenizer, pair, type_vocab_size)
    pad_id = _need(tokenizer.pad_id, "padding token", tokenizer, arch)
    if stride is None:
        encoded = encode_examples(examples.texts, examples.pairs, tokenizer, layout, max_len, truncation)
    elif pair:
        raise ConfigError("data.stride: sliding windows read single texts; a text pair is cut (data.truncation)")
    else:
        encoded = encode_windows(examples.texts, tokenizer, layout, max_len, stride)
    return TaskDataset(encoded, examples.targets, max_len, pad_id, seed, regression, packed and arch in PACKABLE)
