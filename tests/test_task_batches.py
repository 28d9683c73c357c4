"""Fine-tuning inputs (tokenization/task_batches.py): each family's layout, truncation from the head, the
tail or both, checked against HF tokenizers' own post-processor and `longest_first` truncation, and
batches a task head reads."""

import re

import pytest
import torch
from tokenizers import Tokenizer

from tfkit.errors import ConfigError
from tfkit.models import ModelConfig, build_model
from tfkit.models.heads import HeadConfig, SequenceClassifier, head_loss, pool_windows
from tfkit.tokenization.labelled import Examples, load_labelled
from tfkit.tokenization.task_batches import (Layout, cut, encode_examples, encode_windows, layout_for, pair_room,
                                            task_dataset, window_starts)
from tfkit.tokenization.train import TokenizerSpec, load_tokenizer, train_tokenizer

FIRSTS = ["the event loop runs callbacks", "a message has headers and a payload " * 6, "json"]
SECONDS = ["handlers format log records " * 5, "short", "a request to a server and its response"]


@pytest.fixture(scope="module")
def tokenizers(english_text, tmp_path_factory):
    root = tmp_path_factory.mktemp("tokenizers")
    out = {}
    for kind in ("wordpiece", "bpe", "unigram"):
        train_tokenizer(TokenizerSpec(kind=kind, vocab_size=400), [english_text[:60_000]], root / kind,
                        show_progress=False)
        out[kind] = load_tokenizer(root / kind)
    return out


def hf_encoding(tok, max_len, direction, first, second=None):
    """The tokenizer's own `[CLS] a [SEP] b [SEP]` with HF's longest_first truncation (a copy: the loaded
    tokenizer stays as it is)."""
    copy = Tokenizer.from_str(tok.tokenizer.to_str())
    copy.enable_truncation(max_length=max_len, strategy="longest_first", direction=direction)
    return copy.encode(first, second) if second is not None else copy.encode(first)


@pytest.mark.parametrize("max_len", [8, 13, 24, 64])
@pytest.mark.parametrize("truncation, direction", [("head", "right"), ("tail", "left")])
def test_bert_layout_and_truncation_equal_the_tokenizers_own(tokenizers, max_len, truncation, direction):
    tok = tokenizers["wordpiece"]
    pairs = encode_examples(FIRSTS, SECONDS, tok, layout_for("bert", tok, pairs=True), max_len, truncation)
    singles = encode_examples(FIRSTS, None, tok, layout_for("bert", tok, pairs=False), max_len, truncation)
    assert singles.segments is None
    for i, (first, second) in enumerate(zip(FIRSTS, SECONDS)):
        expected = hf_encoding(tok, max_len, direction, first, second)
        assert pairs.rows[i] == expected.ids and pairs.segments[i] == expected.type_ids
        assert singles.rows[i] == hf_encoding(tok, max_len, direction, first).ids
    lengths = [(len(tok.encode(a)), len(tok.encode(b))) for a, b in zip(FIRSTS, SECONDS)]
    assert pairs.truncated == sum(a + b > max_len - 3 for a, b in lengths)
    assert singles.truncated == sum(a > max_len - 2 for a, _ in lengths)


@pytest.mark.parametrize("kind", ["csv", "tsv"])
def test_a_cell_past_the_csv_modules_limit_is_read_then_truncated_as_documented(kind, tokenizers, tmp_path):
    """A 200,000-character text (the csv module refuses cells over 131,072 by default) is read whole and cut
    to the row, as the README says long texts are."""
    sep = "," if kind == "csv" else "\t"
    long = "the event loop runs callbacks " * 6_700  # 201,000 characters
    path = tmp_path / f"long.{kind}"
    path.write_text(f"text{sep}label\n{long}{sep}1\nshort{sep}0\n")
    data = load_labelled(str(path), str(path))
    assert data.train.texts == [long, "short"]
    tok = tokenizers["wordpiece"]
    for truncation, kept in (("head", long), ("tail", long[-200:])):
        encoded = encode_examples(data.train.texts, None, tok, layout_for("bert", tok, pairs=False), 16, truncation)
        assert len(encoded.rows[0]) == 16 and encoded.truncated == 1
        head = tok.encode(kept)[:14] if truncation == "head" else tok.encode(kept)[-14:]
        assert encoded.rows[0][1:-1] == head


def test_head_and_tail_keeps_the_first_128_and_last_382_of_510():
    ids = list(range(1000))
    assert cut(ids, 510, "head+tail") == list(range(128)) + list(range(618, 1000))
    assert cut(ids, 10, "head") == list(range(10)) and cut(ids, 10, "tail") == list(range(990, 1000))
    assert cut(ids[:5], 10, "head+tail") == ids[:5]


def test_a_pair_is_cut_longest_first():
    assert pair_room(3, 100, 50) == (3, 47)  # the shorter fits in half the room: all of it stays
    assert pair_room(100, 100, 51) == (25, 26)
    assert pair_room(80, 30, 51) == (26, 25)  # the longer takes the odd token
    assert pair_room(10, 10, 30) == (10, 10)


def test_gpt_and_encoder_layouts_use_the_separator_they_were_pretrained_with(tokenizers):
    bpe, unigram = tokenizers["bpe"], tokenizers["unigram"]
    eos = bpe.eos_id
    a, b = bpe.encode(FIRSTS[0]), bpe.encode(SECONDS[1])
    gpt = encode_examples([FIRSTS[0]], [SECONDS[1]], bpe, layout_for("gpt", bpe, pairs=True), 64)
    assert gpt.rows == [[eos, *a, eos, *b, eos]] and gpt.segments is None  # `doc EOS doc EOS`, as packed
    encoder = encode_examples([FIRSTS[0]], None, bpe, layout_for("transformer", bpe, pairs=False), 64)
    assert encoder.rows == [[*a, eos]]  # seq2seq sources are `source EOS`
    llama_style = layout_for("gpt", unigram, pairs=False)  # documents start with <s>, end with </s>
    assert llama_style == Layout((unigram.bos_id,), (unigram.eos_id,), (unigram.eos_id,), segments=False)


@pytest.mark.parametrize("arch, kind, options, message", [
    ("bert", "bpe", {}, "kind bpe has no [CLS] token, which the bert input layout needs"),
    ("bert", "wordpiece", {"type_vocab_size": 1}, "model.type_vocab_size: 1, but a text pair needs segment ids"),
    ("lstm", "bpe", {}, "model.arch: got 'lstm'"),
])
def test_a_layout_the_tokenizer_or_model_cannot_give_is_refused(tokenizers, arch, kind, options, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        layout_for(arch, tokenizers[kind], pairs=True, **options)


@pytest.mark.parametrize("max_len, truncation, message", [
    (4, "head", "data.max_len: 4 leaves no room for text beside the layout's 3 special tokens"),
    (32, "middle", "data.truncation: got 'middle', expected one of head, tail, head+tail"),
])
def test_impossible_lengths_and_truncations_are_refused(tokenizers, max_len, truncation, message):
    tok = tokenizers["wordpiece"]
    with pytest.raises(ConfigError, match=re.escape(message)):
        encode_examples(FIRSTS, SECONDS, tok, layout_for("bert", tok, pairs=True), max_len, truncation)


def test_batches_are_fixed_shape_pure_functions_that_a_head_trains_on(tokenizers):
    tok = tokenizers["wordpiece"]
    examples = Examples("test", FIRSTS * 4, SECONDS * 4, [0, 1, 2] * 4)
    data = task_dataset(examples, tok, "bert", max_len=24, seed=5, regression=False)
    batch = data.batch(3, batch_size=4)
    assert {k: tuple(v.shape) for k, v in batch.items()} == {
        "input_ids": (4, 24), "attention_mask": (4, 24), "token_type_ids": (4, 24), "labels": (4,)}
    assert all(torch.equal(batch[k], data.batch(3, batch_size=4)[k]) for k in batch)
    assert batch["labels"].dtype == torch.long and batch["attention_mask"].dtype == torch.bool
    assert (batch["input_ids"][~batch["attention_mask"]] == tok.pad_id).all()
    every = list(data.every_example(5))
    assert torch.equal(torch.cat([b["labels"] for b in every]), torch.tensor([0, 1, 2] * 4))
    cfg = ModelConfig(arch="bert", vocab_size=tok.vocab_size, d_model=32, n_layers=1, n_heads=2, max_seq_len=24)
    model = SequenceClassifier(build_model(cfg), HeadConfig(labels=("a", "b", "c")))
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    head_loss(model(**inputs), batch["labels"], "classification").backward()
    assert model.classifier.weight.grad is not None and model.body.embed.tok.weight.grad is not None


def test_regression_targets_batch_as_floats(tokenizers):
    examples = Examples("test", FIRSTS, None, [0.5, 4.0, 2.2])
    data = task_dataset(examples, tokenizers["bpe"], "gpt", max_len=16, seed=0, regression=True)
    batch = next(data.every_example(3))
    assert batch["labels"].dtype == torch.float32 and "token_type_ids" not in batch
    bpe = tokenizers["bpe"]
    assert data.encoded.truncated == sum(len(bpe.encode(text)) > 16 - 2 for text in FIRSTS) > 0


@pytest.mark.parametrize("length, room, stride, starts", [
    (10, 4, 3, [0, 3, 6]), (10, 4, 2, [0, 2, 4, 6]), (10, 4, 4, [0, 4, 6]), (4, 4, 1, [0]), (2, 4, 1, [0]),
])
def test_windows_cover_every_token_and_end_at_the_texts_end(length, room, stride, starts):
    assert window_starts(length, room, stride) == starts
    covered = {t for s in starts for t in range(s, min(s + room, length))}
    assert covered == set(range(length)) and starts[-1] + room >= length


def test_a_long_text_is_read_whole_as_windows_with_its_target(tokenizers):
    tok = tokenizers["wordpiece"]
    layout = layout_for("bert", tok, pairs=False)
    ids = tok.encode(FIRSTS[1])
    windows = encode_windows(FIRSTS, tok, layout, max_len=12, stride=6)
    mine = [row for row, owner in zip(windows.rows, windows.owners) if owner == 1]
    assert [row[1:-1] for row in mine] == [ids[s:s + 10] for s in window_starts(len(ids), 10, 6)]
    assert all(row[0] == tok.cls_id and row[-1] == tok.sep_id and len(row) <= 12 for row in windows.rows)
    assert windows.owners == sorted(windows.owners) and windows.truncated == 0
    assert windows.windowed == sum(len(tok.encode(text)) > 10 for text in FIRSTS) > 0
    data = task_dataset(Examples("test", FIRSTS, None, [2, 0, 1]), tok, "bert", max_len=12, seed=0,
                        regression=False, stride=6)
    assert torch.equal(data.labels, torch.tensor([2, 0, 1])[data.owners])


def test_window_logits_are_averaged_per_text():
    logits = torch.tensor([[1.0, 0.0], [3.0, 2.0], [5.0, 5.0], [0.0, 1.0]])
    pooled = pool_windows(logits, torch.tensor([0, 0, 0, 2]), num_examples=3)
    torch.testing.assert_close(pooled, torch.tensor([[3.0, 7 / 3], [0.0, 0.0], [0.0, 1.0]]))


@pytest.mark.parametrize("pairs, stride, message", [
    (None, 0, "data.stride: got 0, expected 1 to 10 (the text tokens of a window)"),
    (None, 11, "data.stride: got 11, expected 1 to 10"),
    (SECONDS, 4, "data.stride: sliding windows read single texts; a text pair is cut (data.truncation)"),
])
def test_impossible_windows_are_refused(tokenizers, pairs, stride, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        task_dataset(Examples("test", FIRSTS, pairs, [0, 1, 0]), tokenizers["wordpiece"], "bert", max_len=12,
                     seed=0, regression=False, stride=stride)
