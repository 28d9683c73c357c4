"""Token shards: layout (EOS between documents), caching, dtype choice, atomicity, splits."""

import functools
import json

import numpy as np
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

import tfkit.tokenization.shards as shards_module
from tfkit.tokenization.corpus import iter_pieces
from tfkit.tokenization.shards import prepare_tokens, token_dtype
from tfkit.tokenization.train import TokenizerSpec, load_tokenizer, train_tokenizer


@pytest.fixture(scope="module")
def text(english_text):
    return english_text[:200_000]


@pytest.fixture(scope="module")
def bpe(text, tmp_path_factory):
    folder = tmp_path_factory.mktemp("bpe")
    train_tokenizer(TokenizerSpec(kind="bpe", vocab_size=600), [text], folder, show_progress=False)
    return load_tokenizer(folder)


@pytest.fixture
def docs_corpus(text, tmp_path):
    """The slice as a JSONL corpus: one document per paragraph (blank-line separated)."""
    docs = [d for d in text.split("\n\n") if d.strip()][:300]
    path = tmp_path / "paragraphs.jsonl"
    path.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    return path, docs


def test_documents_are_separated_by_eos_and_indexed(bpe, docs_corpus, tmp_path):
    path, docs = docs_corpus
    shards = prepare_tokens(str(path), bpe, tmp_path / "cache", show_progress=False)
    assert shards.num_documents == len(docs) and shards.doc_starts[-1] == shards.num_tokens
    assert shards.separator_id == bpe.eos_id == 0 and shards.dtype == np.uint16
    eos_positions = np.flatnonzero(np.asarray(shards.tokens) == bpe.eos_id)
    np.testing.assert_array_equal(eos_positions, shards.doc_starts[1:] - 1)  # exactly one EOS after each doc
    for d in (0, 7, len(docs) - 1):
        ids = shards.tokens[shards.doc_starts[d] : shards.doc_starts[d + 1] - 1]
        assert bpe.decode(ids.tolist()) == docs[d]
    assert shards.meta["num_tokens"] == shards.num_tokens and shards.meta["mb_per_s"] > 0


def test_pieces_of_one_big_file_stay_one_document(bpe, text, tmp_path, monkeypatch):
    monkeypatch.setattr(shards_module, "iter_pieces", functools.partial(iter_pieces, chunk_bytes=10_000))
    (tmp_path / "big.txt").write_text(text[:60_000])
    (tmp_path / "small.txt").write_text("A second file.\n")
    shards = prepare_tokens(str(tmp_path / "*.txt"), bpe, tmp_path / "cache", show_progress=False)
    assert shards.num_documents == 2  # six pieces of big.txt, then small.txt
    assert int((np.asarray(shards.tokens) == bpe.eos_id).sum()) == 2
    assert bpe.decode(shards.tokens[: shards.doc_starts[1] - 1].tolist()) == text[:60_000]


def test_a_long_text_encoded_in_parts_gives_the_tokens_of_encoding_it_whole(bpe, text, tmp_path):
    """Long texts are encoded in ~2K-character parts (faster per character, and spread over every core),
    cut where byte-level BPE's pre-tokens are the same either way: the tokens of the text encoded whole."""
    assert len(shards_module._sub_pieces(text)) > 50
    (tmp_path / "long.txt").write_text(text)
    shards = prepare_tokens(str(tmp_path / "long.txt"), bpe, tmp_path / "cache", show_progress=False)
    assert shards.tokens.tolist() == bpe.encode(text) + [bpe.eos_id]


def test_batch_size_does_not_change_the_tokens(bpe, docs_corpus, text, tmp_path, monkeypatch):
    """Batches are read ahead by a thread and document starts kept across them: many small batches give
    the tokens and document starts of one big batch."""
    path, _ = docs_corpus
    (tmp_path / "more").mkdir()
    (tmp_path / "more" / "a.jsonl").write_bytes(path.read_bytes())
    (tmp_path / "more" / "b.txt").write_text(text[:150_000])
    whole = prepare_tokens(str(tmp_path / "more"), bpe, tmp_path / "one", show_progress=False)
    monkeypatch.setattr(shards_module, "BATCH_CHARS", 3000)
    small = prepare_tokens(str(tmp_path / "more"), bpe, tmp_path / "many", show_progress=False)
    np.testing.assert_array_equal(small.doc_starts, whole.doc_starts)
    np.testing.assert_array_equal(small.tokens, whole.tokens)


def test_second_call_reuses_the_cache(bpe, docs_corpus, tmp_path, monkeypatch):
    path, _ = docs_corpus
    first = prepare_tokens(str(path), bpe, tmp_path / "cache", show_progress=False)
    folder = next((tmp_path / "cache").iterdir())
    mtime = (folder / "tokens.bin").stat().st_mtime_ns
    monkeypatch.setattr(type(bpe), "encode_batch", lambda *a, **k: pytest.fail("tokenized again"))
    second = prepare_tokens(str(path), bpe, tmp_path / "cache", show_progress=False)
    assert (first.from_cache, second.from_cache) == (False, True)
    assert (folder / "tokens.bin").stat().st_mtime_ns == mtime
    np.testing.assert_array_equal(first.tokens, second.tokens)
    monkeypatch.undo()
    path.write_text(path.read_text() + json.dumps({"text": "one more"}) + "\n")  # corpus changed: new key
    third = prepare_tokens(str(path), bpe, tmp_path / "cache", show_progress=False)
    assert not third.from_cache and third.num_documents == first.num_documents + 1
    assert len(list((tmp_path / "cache").iterdir())) == 2


def test_killed_run_leaves_no_loadable_cache(bpe, docs_corpus, tmp_path, monkeypatch):
    path, _ = docs_corpus
    monkeypatch.setattr(shards_module, "BATCH_CHARS", 1000)
    calls = []

    def dying(self, texts, add_special_tokens=False):
        calls.append(1)
        if len(calls) > 2:
            raise KeyboardInterrupt
        return [e.ids for e in self.tokenizer.encode_batch(texts, add_special_tokens=False)]

    monkeypatch.setattr(type(bpe), "encode_batch", dying)
    with pytest.raises(KeyboardInterrupt):
        prepare_tokens(str(path), bpe, tmp_path / "cache", show_progress=False)
    assert list((tmp_path / "cache").iterdir()) == []
    monkeypatch.undo()
    assert not prepare_tokens(str(path), bpe, tmp_path / "cache", show_progress=False).from_cache


def test_a_damaged_cache_folder_is_rebuilt(bpe, docs_corpus, tmp_path):
    """A cache folder without meta.json (not published by tfkit, which publishes whole folders) is replaced."""
    path, _ = docs_corpus
    good = np.array(prepare_tokens(str(path), bpe, tmp_path / "cache", show_progress=False).tokens)  # a copy
    folder = next((tmp_path / "cache").iterdir())
    (folder / "meta.json").unlink()
    (folder / "tokens.bin").write_bytes(b"junk")
    again = prepare_tokens(str(path), bpe, tmp_path / "cache", show_progress=False)
    assert not again.from_cache
    np.testing.assert_array_equal(again.tokens, good)
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [folder.name]


def test_dtype_is_uint16_while_ids_fit_then_uint32(tmp_path):
    assert token_dtype(600) == np.uint16 and token_dtype(65_536) == np.uint16
    assert token_dtype(65_537) == np.uint32
    vocab = {f"w{i}": i for i in range(70_000)}
    raw = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    raw.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    raw.add_special_tokens(["<eos>"])
    folder = tmp_path / "big_vocab"
    folder.mkdir()
    raw.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<eos>"}))
    tok = load_tokenizer(folder)
    (tmp_path / "c.txt").write_text("w1 w65535 w69999")
    shards = prepare_tokens(str(tmp_path / "c.txt"), tok, tmp_path / "cache", show_progress=False)
    assert shards.dtype == np.uint32 and tok.kind == "wordlevel"
    assert shards.tokens.tolist() == [1, 65_535, 69_999, 70_000]


def test_split_holds_out_chunks_spread_through_the_corpus(bpe, docs_corpus, tmp_path):
    path, _ = docs_corpus
    shards = prepare_tokens(str(path), bpe, tmp_path / "cache", show_progress=False)
    train, valid = shards.split(0.1)
    assert train.num_tokens + valid.num_tokens == shards.num_tokens
    assert abs(valid.num_tokens / shards.num_tokens - 0.1) < 0.05
    every = np.asarray(shards.tokens, np.int64)
    held = np.zeros(shards.num_tokens, bool)
    for lo, hi in valid.tokens.ranges:
        held[lo:hi] = True
    assert np.array_equal(np.asarray(valid.tokens, np.int64), every[held])  # disjoint, together the whole
    assert np.array_equal(np.asarray(train.tokens, np.int64), every[~held])
    assert held[: shards.num_tokens // 2].any() and held[shards.num_tokens // 2 :].any()  # spread, not a tail
    for part in (train, valid):  # documents inside each part, boundaries where the parts' chunks start
        assert part.doc_starts[0] == 0 and part.doc_starts[-1] == part.num_tokens
        assert np.all(np.diff(part.doc_starts) > 0)