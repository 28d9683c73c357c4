"""Same corpus, same spec: the same tokenizer.json, and so the same model from the same recipe and seed.

tokenizers trains WordPiece and Unigram in hash-map order (huggingface/tokenizers#1794), which differs
between trainings even within one process, so training three times here fails without the workaround.
"""

import hashlib
import json

import pytest
from typer.testing import CliRunner

from tfkit.checkpoints.run_record import read_metrics
from tfkit.cli.main import app
from tfkit.tokenization.train import TokenizerSpec, load_tokenizer, train_tokenizer


def sha(path) -> str:
    return hashlib.sha256((path / "tokenizer.json").read_bytes()).hexdigest()


@pytest.mark.parametrize("kind", ["bpe", "wordpiece", "unigram"])
def test_the_same_corpus_trains_a_byte_identical_tokenizer(kind, english_text, tmp_path):
    spec = TokenizerSpec(kind=kind, vocab_size=1500)
    digests = set()
    for i in range(3):  # 60 kB is enough: without the workaround wordpiece and unigram give 3 different files
        train_tokenizer(spec, [english_text[:60_000]], tmp_path / str(i), show_progress=False)
        digests.add(sha(tmp_path / str(i)))
    assert len(digests) == 1


def test_wordpiece_with_a_limited_alphabet_is_deterministic_and_keeps_the_most_frequent_characters(
        english_text, tmp_path):
    spec = TokenizerSpec(kind="wordpiece", vocab_size=800, limit_alphabet=30)
    for i in range(2):
        train_tokenizer(spec, [english_text[:200_000]], tmp_path / str(i), show_progress=False)
    assert sha(tmp_path / "0") == sha(tmp_path / "1")
    vocab = load_tokenizer(tmp_path / "0").tokenizer.get_vocab()
    assert "e" in vocab and "##e" in vocab  # the commonest letter, alone and continuing
    singles = {t for t in vocab if len(t) == 1}
    assert len(singles) <= 30


def test_pinned_continuing_pieces_stay_ordinary_vocabulary(english_text, tmp_path):
    """`##e` is a word piece, not a special token: text containing `##e` is split like any other text."""
    train_tokenizer(TokenizerSpec(kind="wordpiece", vocab_size=800), [english_text[:200_000]], tmp_path,
                    show_progress=False)
    data = json.loads((tmp_path / "tokenizer.json").read_text())
    assert [t["content"] for t in data["added_tokens"]] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok = load_tokenizer(tmp_path)
    assert "##e" not in tok.tokenizer.encode("a##e").tokens


def test_wordpiece_from_a_one_shot_iterator_is_refused(tmp_path):
    with pytest.raises(TypeError, match="twice"):
        train_tokenizer(TokenizerSpec(kind="wordpiece", vocab_size=100), iter(["some text"] * 10), tmp_path,
                        show_progress=False)


def test_two_fresh_bert_runs_with_one_seed_write_identical_losses(english_file, tmp_path):
    """Each run trains its own WordPiece tokenizer and token shards: the runs agree only if those do."""
    losses = []
    for name in ("a", "b"):
        sets = [f"data.train={english_file}", "data.valid=null", "train.max_steps=6", "train.batch_size=4",
                "data.seq_len=32", "train.log_every=1", "train.eval_every=1000", "train.save_every=1000",
                "eval.batches=1", "tokenizer.vocab_size=600", "tokenizer.max_train_mb=0.2", "log.progress=false",
                "log.plot=false", "train.device=cpu", f"data.cache_dir={tmp_path / name / 'cache'}"]
        args = ["pretrain", "bert-tiny", "--run-dir", str(tmp_path / name)]
        result = CliRunner().invoke(app, args + [a for s in sets for a in ("--set", s)])
        assert result.exit_code == 0, result.output
        losses.append([r["loss"] for r in read_metrics(tmp_path / name / "metrics.jsonl") if "loss" in r])
    assert len(losses[0]) == 6 and losses[0] == losses[1]
