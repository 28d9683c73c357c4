"""Tokenizer training: the three kinds, exact special ids, HF compatibility, parity and bad input."""

import hashlib
import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from tfkit.errors import ConfigError, DataError
from tfkit.tokenization.train import TokenizerSpec, check_vocab_fits, load_tokenizer, train_tokenizer

# Every word is two letters and occurs a distinct (prime) number of times: no two pairs ever tie, so even
# WordPiece/Unigram training (hash-map order in tokenizers) learns the same vocabulary on every run.
TIE_FREE = [" ".join([w] * n)
            for w, n in zip(["ab", "cd", "ef", "gh", "ij", "kl", "mn", "op"], [2, 3, 5, 7, 11, 13, 17, 19])]
TINY = ["The quick brown fox jumps over the lazy dog.", "A lazy dog sleeps; the fox runs away!"] * 20


@pytest.fixture(scope="module")
def english(english_text):
    """200 kB of English to train on and 20 kB held out (disjoint: the head and the tail of the text)."""
    return english_text[:200_000], english_text[-20_000:]


@pytest.fixture(scope="module")
def trained(english, tmp_path_factory):
    """One folder per kind, trained once for the whole module; unigram on the first quarter of the text (its
    trainer takes ten times BPE's time, and the tests read its layout, not its statistics)."""
    train, held = english
    out = {}
    for kind in ("bpe", "wordpiece", "unigram"):
        folder = tmp_path_factory.mktemp(kind)
        text = train[:50_000] if kind == "unigram" else train
        report = train_tokenizer(TokenizerSpec(kind=kind, vocab_size=800), [text], folder, heldout=[held],
                                 show_progress=False)
        out[kind] = (folder, report)
    return out


def test_bpe_round_trips_exactly_with_gpt2_specials(trained):
    tok = load_tokenizer(trained["bpe"][0])
    text = "First Citizen:\nBefore we proceed any further, hear me speak. ünïcödé 😀\t tabs"
    assert tok.decode(tok.encode(text)) == text  # byte-level: nothing is ever unknown
    assert (tok.eos_id, tok.bos_id, tok.pad_id) == (0, 0, 1)
    assert (tok.unk_id, tok.mask_id, tok.cls_id, tok.sep_id) == (None, None, None, None)
    assert tok.special_ids == [0, 1] and tok.vocab_size == 800 and tok.kind == "bpe"
    assert tok.encode("hi", add_special_tokens=True) == tok.encode("hi")  # GPT-2 adds nothing


def test_wordpiece_round_trips_modulo_spacing_and_has_bert_layout(trained):
    tok = load_tokenizer(trained["wordpiece"][0])
    assert [tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id] == [0, 1, 2, 3, 4]
    assert tok.bos_id is None and tok.eos_id is None
    text = "Before we proceed any further, hear me speak."
    assert tok.decode(tok.encode(text)) == text  # the WordPiece decoder re-attaches punctuation
    assert tok.decode(tok.encode("Hear ME,  speak")) == "Hear ME, speak"  # cased by default; spacing lost
    enc = tok.tokenizer.encode("a", "b")
    a, b = tok.token_to_id("a"), tok.token_to_id("b")
    assert enc.tokens == ["[CLS]", "a", "[SEP]", "b", "[SEP]"]
    assert enc.ids == [2, a, 3, b, 3] and enc.type_ids == [0, 0, 0, 1, 1]


def test_unigram_round_trips_and_has_xlmr_layout(trained):
    tok = load_tokenizer(trained["unigram"][0])
    assert [tok.pad_id, tok.unk_id, tok.bos_id, tok.eos_id, tok.mask_id] == [0, 1, 2, 3, 4]
    assert (tok.cls_id, tok.sep_id) == (2, 3)
    text = "Before we proceed any further, hear me speak."
    assert tok.decode(tok.encode(text)) == text
    assert tok.encode(text, add_special_tokens=True) == [2] + tok.encode(text) + [3]


@pytest.mark.parametrize("kind, pad, mask", [("bpe", 1, None), ("wordpiece", 0, 4), ("unigram", 0, 4)])
def test_transformers_loads_the_folder_with_the_right_specials(trained, kind, pad, mask):
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    folder = trained[kind][0]
    auto = AutoTokenizer.from_pretrained(str(folder))
    assert (auto.pad_token_id, auto.mask_token_id) == (pad, mask)
    tok = load_tokenizer(folder)
    assert (auto.cls_token_id, auto.sep_token_id, auto.unk_token_id) == (tok.cls_id, tok.sep_id, tok.unk_id)
    assert (auto.bos_token_id, auto.eos_token_id) == (tok.bos_id, tok.eos_id)
    fast = PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"))
    text = "hear me speak"
    assert fast(text).input_ids == auto(text).input_ids == tok.encode(text, add_special_tokens=True)


def test_report_is_saved_and_plausible(trained):
    folder, report = trained["bpe"]
    saved = json.loads((folder / "tokenizer_report.json").read_text())
    assert saved["vocab_size"] == report["vocab_size"] == 800
    assert 1.5 < saved["bytes_per_token"] < 5 and 1 < saved["tokens_per_word"] < 4
    assert saved["unk_rate"] == 0 and saved["heldout_bytes"] == 20_000
    assert len(saved["top_merges"]) == 10 and saved["training_seconds"] >= 0
    assert trained["wordpiece"][1]["unk_rate"] < 0.05
    assert len(trained["unigram"][1]["top_pieces"]) == 10
    tok = load_tokenizer(folder)
    assert tok.fingerprint() == hashlib.sha256((folder / "tokenizer.json").read_bytes()).hexdigest()


def _raw_pipeline(kind: str, vocab_size: int, corpus: list[str]) -> Tokenizer:
    """The same pipelines written out by hand with `tokenizers` (the reference for parity)."""
    if kind == "bpe":
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                      special_tokens=["<|endoftext|>", "<|pad|>"],
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    elif kind == "wordpiece":
        tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        tok.normalizer = normalizers.BertNormalizer(lowercase=True)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                            special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
    else:
        tok = Tokenizer(models.Unigram())
        tok.normalizer = normalizers.NFKC()
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        trainer = trainers.UnigramTrainer(vocab_size=vocab_size, unk_token="<unk>", show_progress=False,
                                          special_tokens=["<pad>", "<unk>", "<s>", "</s>", "<mask>"])
    tok.train_from_iterator(corpus, trainer)
    return tok


@pytest.mark.parametrize("kind, vocab", [("bpe", 300), ("wordpiece", 40), ("unigram", 60)])
def test_same_vocabulary_as_the_raw_tokenizers_pipeline(tmp_path, kind, vocab):
    """Same tokens (and the same ids for bpe). tokenizers numbers WordPiece/Unigram pieces in hash-map
    order and WordPiece breaks ties between equal pair counts by it, so wordpiece is trained on a
    tie-free corpus; for wordpiece and unigram the token sets are compared."""
    corpus = TIE_FREE if kind == "wordpiece" else TINY
    spec = TokenizerSpec(kind=kind, vocab_size=vocab, lowercase=kind == "wordpiece")
    train_tokenizer(spec, corpus, tmp_path / "t", show_progress=False)
    ours, raw = load_tokenizer(tmp_path / "t").tokenizer, _raw_pipeline(kind, vocab, corpus)
    assert set(ours.get_vocab()) == set(raw.get_vocab()) and ours.get_vocab_size() <= vocab
    if kind == "bpe":
        assert ours.get_vocab() == raw.get_vocab()
    sentence = "the lazy fox jumps over the quick dog ab cd op"
    assert ours.encode(sentence, add_special_tokens=False).tokens == raw.encode(sentence).tokens
    specials = len(spec.all_special_tokens())
    assert [ours.id_to_token(i) for i in range(specials)] == spec.all_special_tokens()


def test_bpe_training_is_reproducible_byte_for_byte(english, tmp_path):
    spec = TokenizerSpec(kind="bpe", vocab_size=600)
    for name in ("a", "b"):
        train_tokenizer(spec, [english[0]], tmp_path / name, show_progress=False)
    assert (tmp_path / "a" / "tokenizer.json").read_bytes() == (tmp_path / "b" / "tokenizer.json").read_bytes()


def test_extra_special_tokens_follow_the_built_in_ones(tmp_path):
    spec = TokenizerSpec(kind="bpe", vocab_size=300, special_tokens=["<|mask|>", "<|user|>"])
    train_tokenizer(spec, TINY, tmp_path / "t", show_progress=False)
    tok = load_tokenizer(tmp_path / "t")
    assert tok.special_ids == [0, 1, 2, 3] and tok.mask_id == 2
    assert tok.encode("hi <|user|>")[-1] == 3
    config = json.loads((tmp_path / "t" / "tokenizer_config.json").read_text())
    assert config["mask_token"] == "<|mask|>" and config["additional_special_tokens"] == ["<|user|>"]


def test_spec_problems_name_every_key():
    spec = TokenizerSpec(kind="bpe", vocab_size=100, min_frequency=-1, limit_alphabet=50, special_tokens=["<|pad|>"])
    problems = spec.problems()
    assert [p.split(":")[0] for p in problems] == [
        "tokenizer.vocab_size", "tokenizer.min_frequency", "tokenizer.limit_alphabet", "tokenizer.special_tokens"
    ]
    assert "at least 259 (256 bytes + 3 special tokens)" in problems[0]
    assert TokenizerSpec(kind="sentencepiece").problems(prefix="x")[0].startswith("x.kind: got 'sentencepiece'")
    with pytest.raises(ConfigError, match="tokenizer.vocab_size"):
        train_tokenizer(TokenizerSpec(vocab_size=10), TINY, "/nonexistent/never-written", show_progress=False)


@pytest.mark.parametrize("kind", ["wordpiece", "unigram"])
def test_vocab_smaller_than_the_alphabet_is_a_config_error(tmp_path, kind):
    with pytest.raises(ConfigError, match=r"tokenizer\.vocab_size: got 20, smaller than the alphabet.* at least"):
        train_tokenizer(TokenizerSpec(kind=kind, vocab_size=20), TINY, tmp_path / "t", show_progress=False)
    assert not (tmp_path / "t").exists()


def test_empty_corpus_is_a_data_error(tmp_path):
    with pytest.raises(DataError, match="empty"):
        train_tokenizer(TokenizerSpec(vocab_size=300), ["", "  "], tmp_path / "t", show_progress=False)
    assert not (tmp_path / "t").exists()


def test_never_overwrites_a_different_tokenizer_without_force(tmp_path):
    out = tmp_path / "t"
    train_tokenizer(TokenizerSpec(vocab_size=300), TINY, out, show_progress=False)
    before = (out / "tokenizer.json").read_bytes()
    (out / "notes.txt").write_text("mine")
    train_tokenizer(TokenizerSpec(vocab_size=300), TINY, out, show_progress=False)  # same tokenizer: fine
    assert (out / "notes.txt").exists() and (out / "tokenizer.json").read_bytes() == before
    with pytest.raises(DataError, match=r"holds a different tokenizer; use force"):
        train_tokenizer(TokenizerSpec(vocab_size=280), TINY, out, show_progress=False)
    assert (out / "tokenizer.json").read_bytes() == before
    train_tokenizer(TokenizerSpec(vocab_size=280), TINY, out, show_progress=False, force=True)
    assert load_tokenizer(out).vocab_size == 280
    assert (out / "notes.txt").read_text() == "mine"  # --force replaces the tokenizer's files, nothing else
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t"]  # no temp folders left behind
    assert not [p for p in out.iterdir() if p.name.startswith(".")]
    other = tmp_path / "other"
    other.mkdir()
    (other / "model.safetensors").write_text("weights")
    with pytest.raises(DataError, match=r"other: folder is not empty and holds no tokenizer"):
        train_tokenizer(TokenizerSpec(vocab_size=300), TINY, other, show_progress=False)
    train_tokenizer(TokenizerSpec(vocab_size=300), TINY, other, show_progress=False, force=True)
    assert (other / "model.safetensors").read_text() == "weights" and load_tokenizer(other).vocab_size == 300


def test_out_may_be_the_current_folder(tmp_path, monkeypatch):
    """`--out .`: the files land in the working folder itself (which is never removed or renamed)."""
    monkeypatch.chdir(tmp_path)
    train_tokenizer(TokenizerSpec(vocab_size=300), TINY, Path("."), show_progress=False)
    assert load_tokenizer(tmp_path).vocab_size == 300
    assert sorted(p.name for p in tmp_path.iterdir()) == ["special_tokens_map.json", "tokenizer.json",
                                                          "tokenizer_config.json", "tokenizer_report.json"]
    train_tokenizer(TokenizerSpec(vocab_size=300), TINY, Path("."), show_progress=False)  # the same again: fine
    with pytest.raises(DataError, match=r"holds a different tokenizer"):
        train_tokenizer(TokenizerSpec(vocab_size=280), TINY, Path("."), show_progress=False)


def test_load_errors_name_the_path(tmp_path):
    with pytest.raises(DataError, match=r"tokenizer .*nothere: file not found"):
        load_tokenizer(tmp_path / "nothere")
    bad = tmp_path / "tokenizer.json"
    bad.write_text('{"not": "a tokenizer"}')
    with pytest.raises(DataError, match=rf"{bad}: not a valid tokenizer\.json"):
        load_tokenizer(tmp_path)


def test_check_vocab_fits(tmp_path):
    train_tokenizer(TokenizerSpec(vocab_size=300), TINY, tmp_path / "t", show_progress=False)
    tok = load_tokenizer(tmp_path / "t")
    check_vocab_fits(tok, 300)
    with pytest.raises(ConfigError, match=r"model\.vocab_size: got 299.*has 300 tokens"):
        check_vocab_fits(tok, 299)


def test_save_copies_an_identical_tokenizer(tmp_path):
    train_tokenizer(TokenizerSpec(kind="wordpiece", vocab_size=80), TINY, tmp_path / "t", show_progress=False)
    tok = load_tokenizer(tmp_path / "t")
    tok.save(tmp_path / "ckpt")
    copy = load_tokenizer(tmp_path / "ckpt")
    assert copy.fingerprint() == tok.fingerprint() and copy.mask_id == 4 and copy.kind == "wordpiece"


def test_the_tokenizer_folder_gets_the_permissions_of_a_plain_mkdir(tmp_path):
    import os
    import stat

    previous = os.umask(0o022)
    try:
        train_tokenizer(TokenizerSpec(kind="bpe", vocab_size=300), ["some text to train on " * 50], tmp_path / "tok",
                        show_progress=False)
    finally:
        os.umask(previous)
    assert stat.S_IMODE((tmp_path / "tok").stat().st_mode) == 0o755  # not mkdtemp's 0700
    assert stat.S_IMODE((tmp_path / "tok" / "tokenizer.json").stat().st_mode) == 0o644
