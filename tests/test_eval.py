"""Checkpoint evaluation: hand-checked bits per byte, the uniform-model perplexity, identical MLM masks,
sliding windows, seq2seq pairs and byte coverage (the command line is in test_eval_cli.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from tfkit.checkpoints.hf_tokenizer import import_tokenizer
from tfkit.errors import ConfigError, DataError
from tfkit.evaluation.evaluate import sliding_windows
from tfkit.tokenization import load_tokenizer
from tfkit.tokenization.corpus import CorpusWarning
from tfkit.tokenization.shards import TokenShards
from tfkit.tokenization.token_bytes import token_byte_lengths

from helpers import eval_score as score
from helpers import make_checkpoint


@pytest.fixture(scope="module")
def text(english_text: str) -> str:
    """60 kB of English: the text `eval_tokenizers` are trained on."""
    return english_text[:60_000]


def test_bits_per_byte_is_nll_over_ln2_over_the_scored_bytes(eval_tokenizers, tmp_path: Path) -> None:
    data = tmp_path / "tiny.txt"
    data.write_text("To be, or not to be: that is the question. " * 12, encoding="utf-8")
    ckpt = make_checkpoint(tmp_path / "ckpt", eval_tokenizers["bpe"], init_std=0.3)
    got = score(ckpt, data, tmp_path, batch_size=2, seq_len=16)

    # By hand: the stream is `text EOS`, every whole block of 17 tokens overlapping by one.
    tok = load_tokenizer(eval_tokenizers["bpe"])
    stream = tok.encode(data.read_text()) + [tok.eos_id]
    n_blocks = (len(stream) - 1) // 16  # the last batch of 2 may hold one
    blocks = torch.tensor([stream[k * 16 : k * 16 + 17] for k in range(n_blocks)])
    from tfkit.checkpoints.weights import load_model

    model, _ = load_model(ckpt)
    with torch.no_grad():
        logits = model(blocks[:, :-1])
    nll = F.cross_entropy(logits.flatten(0, 1), blocks[:, 1:].flatten(), reduction="sum").item()
    labels = blocks[:, 1:].flatten().tolist()
    n_bytes = sum(len(tok.decode([t]).encode("utf-8")) for t in labels if t != tok.eos_id)  # ASCII text
    assert got["tokens"] == len(labels) and got["bytes"] == n_bytes
    assert got["loss"] == pytest.approx(nll / len(labels), rel=1e-5)
    assert got["bits_per_byte"] == pytest.approx(nll / math.log(2) / n_bytes, rel=1e-5)
    assert got["perplexity"] == pytest.approx(math.exp(nll / len(labels)), rel=1e-5)


def test_uniform_model_has_perplexity_vocab_size(eval_tokenizers, valid_file: Path, tmp_path: Path) -> None:
    ckpt = make_checkpoint(tmp_path / "uniform", eval_tokenizers["bpe"], zero_embeddings=True)
    got = score(ckpt, valid_file, tmp_path, batch_size=4, seq_len=32)
    vocab = load_tokenizer(eval_tokenizers["bpe"]).vocab_size
    assert got["perplexity"] == pytest.approx(vocab, rel=1e-4)
    assert got["bits_per_byte"] == pytest.approx(got["tokens"] * math.log2(vocab) / got["bytes"], rel=1e-4)
    assert got["kv_cache_bytes_per_token"] == 2 * 2 * 4 * 8 * 2  # K,V x layers x kv heads x head dim x bf16, as convert
    assert got["dtype"] == "fp32"  # what the bytes and the forward passes used
    assert got["params"] > 0 and got["tokens_per_sec"] > 0 and got["step"] == 5


def test_byte_table_bpe_is_exact_and_specials_are_free(eval_tokenizers) -> None:
    tok = load_tokenizer(eval_tokenizers["bpe"])
    table = token_byte_lengths(tok)
    sample = "Speak, speak! ünïcödé"
    assert table[tok.encode(sample)].sum() == len(sample.encode("utf-8"))
    assert all(table[i] == 0 for i in tok.special_ids)


def llama_style_tokenizer(folder: Path, text: str) -> Path:
    """A small SentencePiece-style BPE laid out as HF Llama/Mistral ship it (tokenizer.json with byte
    fallback, `<0x00>`..`<0xFF>` in the vocabulary, Metaspace "▁"), imported the way `import-hf` does.
    Trained without newlines or non-ASCII, so those only encode as byte tokens."""
    base = Tokenizer(models.BPE())
    base.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first")
    base.train_from_iterator([text.replace("\n", " ")], trainers.BpeTrainer(vocab_size=300, show_progress=False))
    trained = json.loads(base.to_str())["model"]
    specials = ["<unk>", "<s>", "</s>"]
    vocab = {t: i for i, t in enumerate(specials + [f"<0x{b:02X}>" for b in range(256)])}
    vocab.update({t: len(vocab) + i for i, t in enumerate(sorted(trained["vocab"], key=trained["vocab"].get))})
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in trained["merges"]]
    tok = Tokenizer(models.BPE(vocab, merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.add_special_tokens(specials)
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=False)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    src, dst = folder / "hf", folder / "tfkit"
    src.mkdir()
    dst.mkdir()
    tok.save(str(src / "tokenizer.json"))
    config = {"tokenizer_class": "LlamaTokenizerFast", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
    (src / "tokenizer_config.json").write_text(json.dumps(config))
    import_tokenizer(src, dst)
    return dst


def test_byte_table_sentencepiece_bpe_counts_byte_tokens_once_and_the_marker_as_a_space(text: str,
                                                                                         tmp_path: Path) -> None:
    """Llama-style byte fallback: `<0x0A>` is one byte and "▁the" is " the" (4 bytes), so the table adds up to
    the text's UTF-8 bytes plus the one space Metaspace prepends to the first word."""
    tok = load_tokenizer(llama_style_tokenizer(tmp_path, text))
    table = token_byte_lengths(tok)
    sample = text[:2000] + "Speak, speak! ünïcödé ☃\n\nAll:\n"
    ids = tok.encode(sample)
    assert tok.decode(ids) == sample and tok.token_to_id("<0x0A>") in ids  # byte fallback really used
    assert table[tok.token_to_id("<0x0A>")] == 1 and table[tok.token_to_id("\u2581the")] == 4
    assert table[ids].sum() == len(sample.encode("utf-8")) + 1
    assert all(table[i] == 0 for i in tok.special_ids)


def test_mlm_checkpoints_are_scored_on_the_same_masks(eval_tokenizers, valid_file: Path, tmp_path: Path) -> None:
    a = make_checkpoint(tmp_path / "bert-a", eval_tokenizers["wordpiece"], seed=1, arch="bert")
    b = make_checkpoint(tmp_path / "bert-b", eval_tokenizers["wordpiece"], seed=2, arch="bert", n_kv_heads=1)
    ra, rb = (score(c, valid_file, tmp_path, batch_size=4, seq_len=32, max_batches=3) for c in (a, b))
    assert ra["data_fingerprint"] == rb["data_fingerprint"] and ra["tokens"] == rb["tokens"]
    assert ra["loss"] != rb["loss"]  # different weights, same targets
    assert ra["kv_cache_bytes_per_token"] is None  # an encoder keeps no KV cache
    other_seed = score(a, valid_file, tmp_path, batch_size=4, seq_len=32, max_batches=3, seed=1)
    assert other_seed["data_fingerprint"] != ra["data_fingerprint"]


def test_sliding_windows_score_every_token_once_with_context() -> None:
    tokens = np.array([5, 6, 7, 8, 9, 10, 11, 0, 12, 13, 0, 14, 15, 16, 17, 18, 19, 20, 21, 22, 0])
    shards = TokenShards(tokens, np.array([0, 8, 11, 21]), 30, 0, {})
    seq_len, stride = 4, 2
    scored: list[int] = []
    for d, (window, skip, lead) in enumerate(sliding_windows(shards, seq_len, stride)):
        assert lead == (len(scored) in (0, 8, 11))  # a document's first window opens with the separator
        assert len(window) <= seq_len + 1
        scored += window[1 + skip:].tolist()
        if skip:
            assert skip + 1 >= seq_len - stride  # each newly scored token sees >= seq_len - stride context
    assert scored == tokens.tolist()  # every token, each document's separator included, exactly once


def test_stride_scores_each_document_token_once(eval_tokenizers, valid_file: Path, tmp_path: Path) -> None:
    data = tmp_path / "short.txt"
    data.write_text(valid_file.read_text(encoding="utf-8")[:2000], encoding="utf-8")
    ckpt = make_checkpoint(tmp_path / "gpt", eval_tokenizers["bpe"], positions="rope")
    full = score(ckpt, data, tmp_path, batch_size=4, seq_len=32, stride=32)
    overlap = score(ckpt, data, tmp_path, batch_size=4, seq_len=32, stride=8)
    n_tokens = len(load_tokenizer(eval_tokenizers["bpe"]).encode(data.read_text())) + 1  # + the final EOS
    assert full["tokens"] == overlap["tokens"] == n_tokens
    assert full["bytes"] == overlap["bytes"]
    assert overlap["loss"] != full["loss"]


def test_seq2seq_pairs_score_every_target_token_and_eos(eval_tokenizers, tmp_path: Path) -> None:
    pairs = [("hear me speak", "speak, speak"), ("first citizen", "all of us"), ("to be", "or not to be"),
             ("the question", "that is it")] * 2
    data = tmp_path / "pairs.tsv"
    data.write_text("".join(f"{s}\t{t}\n" for s, t in pairs), encoding="utf-8")
    ckpt = make_checkpoint(tmp_path / "t", eval_tokenizers["bpe"], arch="transformer", n_kv_heads=2)
    got = score(ckpt, data, tmp_path, batch_size=4, seq_len=16, device="auto")
    tok = load_tokenizer(eval_tokenizers["bpe"])
    assert got["objective"] == "seq2seq" and math.isfinite(got["loss"])
    assert got["tokens"] == sum(len(tok.encode(t)) + 1 for _, t in pairs)  # each target + its EOS
    assert got["bytes"] == sum(len(t.encode("utf-8")) for _, t in pairs)  # EOS stands for no text


def test_seq2seq_pairs_are_read_with_the_checkpoints_fields_and_cuts_are_reported(eval_tokenizers, tmp_path: Path) -> None:
    """A model trained on {"en": ..., "fr": ...} records is scored on the same keys (recorded in its
    config.json), and pairs longer than seq_len are cut with a warning, not silently."""
    pairs = [("hear me speak", "speak, speak"), ("first citizen", "all of us"), ("to be", "or not to be"),
             ("the question", "that is it")] * 2
    tsv, enfr = tmp_path / "pairs.tsv", tmp_path / "pairs.jsonl"
    tsv.write_text("".join(f"{s}\t{t}\n" for s, t in pairs), encoding="utf-8")
    enfr.write_text("".join(json.dumps({"en": s, "fr": t}) + "\n" for s, t in pairs), encoding="utf-8")
    ckpt = make_checkpoint(tmp_path / "t", eval_tokenizers["bpe"], arch="transformer")
    config = json.loads((ckpt / "config.json").read_text())
    (ckpt / "config.json").write_text(json.dumps({**config, "pair_fields": ["en", "fr"]}))
    expected = score(ckpt, tsv, tmp_path, batch_size=4, seq_len=16)
    got = score(ckpt, enfr, tmp_path, batch_size=4, seq_len=16)
    assert (got["tokens"], got["loss"]) == (expected["tokens"], pytest.approx(expected["loss"], rel=1e-6))
    with pytest.warns(CorpusWarning, match=r"pairs.tsv: seq_len 4 cuts 8 sources and 8 targets \(of 8 pairs\)"):
        score(ckpt, tsv, tmp_path, batch_size=4, seq_len=4)


def test_bad_options_name_the_parameter(eval_tokenizers, valid_file: Path, tmp_path: Path) -> None:
    """The library names its parameters; `tfkit eval` spells them as flags (tests/test_eval_cli.py)."""
    bert = make_checkpoint(tmp_path / "bert", eval_tokenizers["wordpiece"], arch="bert")
    with pytest.raises(ConfigError, match="^stride "):
        score(bert, valid_file, tmp_path, stride=8)
    with pytest.raises(ConfigError, match="^seq_len must be in 1..64"):
        score(bert, valid_file, tmp_path, seq_len=65)
    with pytest.raises(ConfigError, match="^dtype: got 'int8'"):
        score(bert, valid_file, tmp_path, dtype="int8")
    tiny = tmp_path / "tiny.txt"
    tiny.write_text("The quick brown fox jumps over the lazy dog.\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"tiny.txt: the text gives no rows at seq_len 64; use a smaller seq_len"):
        score(bert, tiny, tmp_path, batch_size=8)
    assert score(bert, tiny, tmp_path, batch_size=8, seq_len=8)["tokens"] > 0  # what the message suggests works


@pytest.mark.parametrize("arch, kind", [("gpt", "bpe"), ("bert", "wordpiece")])
def test_the_whole_corpus_is_scored_whatever_the_batch_size(eval_tokenizers, valid_file: Path, tmp_path: Path,
                                                            arch, kind) -> None:
    """The last partial batch counts, and MLM masks are keyed by example, so --batch-size changes only
    the speed: the same tokens, the same loss."""
    ckpt = make_checkpoint(tmp_path / arch, eval_tokenizers[kind], arch=arch)
    rows = [score(ckpt, valid_file, tmp_path, batch_size=b, seq_len=32) for b in (1, 3, 8)]
    assert len({r["tokens"] for r in rows}) == 1
    assert all(r["loss"] == pytest.approx(rows[0]["loss"], rel=1e-5) for r in rows)


def test_byte_coverage_is_one_for_byte_level_bpe_and_below_for_wordpiece(eval_tokenizers, tmp_path: Path) -> None:
    """WordPiece drops newlines and indentation: its bits per byte leave those bytes unpredicted, and
    byte_coverage says how much of the text its tokens stand for."""
    data = tmp_path / "indented.txt"
    data.write_text("def f(x):\n    return x  # twice\n\n\n    if x:\n        pass\n" * 40, encoding="utf-8")
    bpe = score(make_checkpoint(tmp_path / "bpe", eval_tokenizers["bpe"]), data, tmp_path)
    wordpiece = score(make_checkpoint(tmp_path / "wp", eval_tokenizers["wordpiece"]), data, tmp_path)
    assert bpe["byte_coverage"] == pytest.approx(1.0)
    assert wordpiece["byte_coverage"] < 0.8
