"""Checkpoint evaluation: hand-checked bits per byte, the uniform-model perplexity, identical MLM masks,
sliding windows, and `tfkit eval` printing the same numbers it writes to JSON."""

from __future__ import annotations

import errno
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import typer
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from typer.testing import CliRunner

from tfkit.cli.main import app
from tfkit.tokenization.corpus import CorpusWarning
from tfkit.errors import ConfigError, DataError, TfkitError
from tfkit.models import ModelConfig, build_model, save_model
from tfkit.models.hf_tokenizer import import_tokenizer
from tfkit.tokenization import TokenizerSpec, load_tokenizer, train_tokenizer
from tfkit.tokenization.shards import TokenShards
from tfkit.evaluation.evaluate import evaluate, sliding_windows
from tfkit.tokenization.token_bytes import token_byte_lengths


@pytest.fixture(scope="module")
def text(english_text: str) -> str:
    """60 kB of English the tokenizers are trained on."""
    return english_text[:60_000]


@pytest.fixture(scope="module")
def tokenizers(text: str, tmp_path_factory) -> dict[str, Path]:
    out = {}
    for kind in ("bpe", "wordpiece"):
        folder = tmp_path_factory.mktemp(kind)
        train_tokenizer(TokenizerSpec(kind=kind, vocab_size=300), [text], folder, show_progress=False)
        out[kind] = folder
    return out


@pytest.fixture(scope="module")
def valid_file(english_text: str, tmp_path_factory) -> Path:
    """6 kB of English the tokenizers never saw, as a held-out text file."""
    path = tmp_path_factory.mktemp("data") / "valid.txt"
    path.write_text(english_text[-6_000:], encoding="utf-8")
    return path


def make_checkpoint(folder: Path, tokenizer_dir: Path, seed: int = 0, zero_embeddings: bool = False,
                    train_seq_len: int | None = None, **model) -> Path:
    tok = load_tokenizer(tokenizer_dir)
    torch.manual_seed(seed)
    cfg = dict(vocab_size=tok.vocab_size, d_model=32, n_layers=2, n_heads=4, max_seq_len=64)
    net = build_model(ModelConfig(**{**cfg, **model}))
    if zero_embeddings:  # tied output head = 0: every logit is 0, the next-token distribution is uniform
        with torch.no_grad():
            net.embed.tok.weight.zero_()
    save_model(net, folder, extra={"step": 5} if train_seq_len is None else {"step": 5, "train_seq_len": train_seq_len})
    tok.save(folder)
    return folder


def score(path: Path, data: Path, tmp_path: Path, **kw) -> dict:
    return evaluate(path, str(data), cache_dir=tmp_path / "cache", show_progress=False, **kw)


def test_bits_per_byte_is_nll_over_ln2_over_the_scored_bytes(tokenizers, tmp_path: Path) -> None:
    data = tmp_path / "tiny.txt"
    data.write_text("To be, or not to be: that is the question. " * 12, encoding="utf-8")
    ckpt = make_checkpoint(tmp_path / "ckpt", tokenizers["bpe"], init_std=0.3)
    got = score(ckpt, data, tmp_path, batch_size=2, seq_len=16)

    # By hand: the stream is `text EOS`, every whole block of 17 tokens overlapping by one.
    tok = load_tokenizer(tokenizers["bpe"])
    stream = tok.encode(data.read_text()) + [tok.eos_id]
    n_blocks = (len(stream) - 1) // 16  # the last batch of 2 may hold one
    blocks = torch.tensor([stream[k * 16 : k * 16 + 17] for k in range(n_blocks)])
    from tfkit.models import load_model

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


def test_uniform_model_has_perplexity_vocab_size(tokenizers, valid_file: Path, tmp_path: Path) -> None:
    ckpt = make_checkpoint(tmp_path / "uniform", tokenizers["bpe"], zero_embeddings=True)
    got = score(ckpt, valid_file, tmp_path, batch_size=4, seq_len=32)
    vocab = load_tokenizer(tokenizers["bpe"]).vocab_size
    assert got["perplexity"] == pytest.approx(vocab, rel=1e-4)
    assert got["bits_per_byte"] == pytest.approx(got["tokens"] * math.log2(vocab) / got["bytes"], rel=1e-4)
    assert got["kv_cache_bytes_per_token"] == 2 * 2 * 4 * 8 * 2  # K,V x layers x kv heads x head dim x bf16, as convert
    assert got["dtype"] == "fp32"  # what the bytes and the forward passes used
    assert got["params"] > 0 and got["tokens_per_sec"] > 0 and got["step"] == 5


def test_byte_table_bpe_is_exact_and_specials_are_free(tokenizers) -> None:
    tok = load_tokenizer(tokenizers["bpe"])
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


def test_mlm_checkpoints_are_scored_on_the_same_masks(tokenizers, valid_file: Path, tmp_path: Path) -> None:
    a = make_checkpoint(tmp_path / "bert-a", tokenizers["wordpiece"], seed=1, arch="bert")
    b = make_checkpoint(tmp_path / "bert-b", tokenizers["wordpiece"], seed=2, arch="bert", n_kv_heads=1)
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
    for d, (window, skip) in enumerate(sliding_windows(shards, seq_len, stride)):
        assert len(window) <= seq_len + 1
        scored += window[1 + skip:].tolist()
        if skip:
            assert skip + 1 >= seq_len - stride  # each newly scored token sees >= seq_len - stride context
    assert scored == tokens.tolist()  # every token, each document's separator included, exactly once


def test_stride_scores_each_document_token_once(tokenizers, valid_file: Path, tmp_path: Path) -> None:
    data = tmp_path / "short.txt"
    data.write_text(valid_file.read_text(encoding="utf-8")[:2000], encoding="utf-8")
    ckpt = make_checkpoint(tmp_path / "gpt", tokenizers["bpe"], positions="rope")
    full = score(ckpt, data, tmp_path, batch_size=4, seq_len=32, stride=32)
    overlap = score(ckpt, data, tmp_path, batch_size=4, seq_len=32, stride=8)
    n_tokens = len(load_tokenizer(tokenizers["bpe"]).encode(data.read_text())) + 1  # + the final EOS
    assert full["tokens"] == overlap["tokens"] == n_tokens
    assert full["bytes"] == overlap["bytes"]
    assert overlap["loss"] != full["loss"]


def test_seq2seq_pairs_score_every_target_token_and_eos(tokenizers, tmp_path: Path) -> None:
    pairs = [("hear me speak", "speak, speak"), ("first citizen", "all of us"), ("to be", "or not to be"),
             ("the question", "that is it")] * 2
    data = tmp_path / "pairs.tsv"
    data.write_text("".join(f"{s}\t{t}\n" for s, t in pairs), encoding="utf-8")
    ckpt = make_checkpoint(tmp_path / "t", tokenizers["bpe"], arch="transformer", n_kv_heads=2)
    got = score(ckpt, data, tmp_path, batch_size=4, seq_len=16, device="auto")
    tok = load_tokenizer(tokenizers["bpe"])
    assert got["objective"] == "seq2seq" and math.isfinite(got["loss"])
    assert got["tokens"] == sum(len(tok.encode(t)) + 1 for _, t in pairs)  # each target + its EOS
    assert got["bytes"] == sum(len(t.encode("utf-8")) for _, t in pairs)  # EOS stands for no text


def test_seq2seq_pairs_are_read_with_the_checkpoints_fields_and_cuts_are_reported(tokenizers, tmp_path: Path) -> None:
    """A model trained on {"en": ..., "fr": ...} records is scored on the same keys (recorded in its
    config.json), and pairs longer than seq_len are cut with a warning, not silently."""
    pairs = [("hear me speak", "speak, speak"), ("first citizen", "all of us"), ("to be", "or not to be"),
             ("the question", "that is it")] * 2
    tsv, enfr = tmp_path / "pairs.tsv", tmp_path / "pairs.jsonl"
    tsv.write_text("".join(f"{s}\t{t}\n" for s, t in pairs), encoding="utf-8")
    enfr.write_text("".join(json.dumps({"en": s, "fr": t}) + "\n" for s, t in pairs), encoding="utf-8")
    ckpt = make_checkpoint(tmp_path / "t", tokenizers["bpe"], arch="transformer")
    config = json.loads((ckpt / "config.json").read_text())
    (ckpt / "config.json").write_text(json.dumps({**config, "pair_fields": ["en", "fr"]}))
    expected = score(ckpt, tsv, tmp_path, batch_size=4, seq_len=16)
    got = score(ckpt, enfr, tmp_path, batch_size=4, seq_len=16)
    assert (got["tokens"], got["loss"]) == (expected["tokens"], pytest.approx(expected["loss"], rel=1e-6))
    with pytest.warns(CorpusWarning, match=r"pairs.tsv: seq_len 4 cuts 8 sources and 8 targets \(of 8 pairs\)"):
        score(ckpt, tsv, tmp_path, batch_size=4, seq_len=4)


def test_bad_options_name_the_parameter(tokenizers, valid_file: Path, tmp_path: Path) -> None:
    """The library names its parameters; `tfkit eval` spells them as flags (the CLI tests below)."""
    bert = make_checkpoint(tmp_path / "bert", tokenizers["wordpiece"], arch="bert")
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
def test_the_whole_corpus_is_scored_whatever_the_batch_size(tokenizers, valid_file: Path, tmp_path: Path,
                                                            arch, kind) -> None:
    """The last partial batch counts, and MLM masks are keyed by example, so --batch-size changes only
    the speed: the same tokens, the same loss."""
    ckpt = make_checkpoint(tmp_path / arch, tokenizers[kind], arch=arch)
    rows = [score(ckpt, valid_file, tmp_path, batch_size=b, seq_len=32) for b in (1, 3, 8)]
    assert len({r["tokens"] for r in rows}) == 1
    assert all(r["loss"] == pytest.approx(rows[0]["loss"], rel=1e-5) for r in rows)


def cli_app() -> tuple[typer.Typer, list[str]]:
    return app, ["eval"]


def test_cli_prints_one_row_per_checkpoint_and_the_same_json(tokenizers, valid_file: Path, tmp_path: Path,
                                                             monkeypatch) -> None:
    monkeypatch.setenv("TFKIT_CACHE", str(tmp_path / "cache"))
    mha = make_checkpoint(tmp_path / "run-mha" / "checkpoints" / "step-5", tokenizers["bpe"])
    mqa = make_checkpoint(tmp_path / "mqa", tokenizers["bpe"], seed=3, n_kv_heads=1)
    app, prefix = cli_app()
    out = tmp_path / "results.json"
    args = [*prefix, str(mha.parents[1]), str(mqa), "--data", str(valid_file), "--json", str(out),
            "--batch-size", "4", "--max-tokens", "600", "--device", "cpu"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    rows = json.loads(out.read_text())
    assert [r["checkpoint"] for r in rows] == [str(mha), str(mqa)]
    for key in ("checkpoint", "loss", "perplexity", "bits_per_byte", "token_accuracy", "params",
                "kv_cache_bytes_per_token", "tokens_per_sec"):
        assert all(key in r for r in rows)
    assert rows[0]["kv_cache_bytes_per_token"] == 4 * rows[1]["kv_cache_bytes_per_token"]
    table_lines = [line for line in result.stdout.splitlines() if "gpt" in line]
    assert len(table_lines) == 2
    progress = [line for line in result.stderr.splitlines() if line.startswith("[")]  # off a terminal too
    assert [line.split()[0] for line in progress] == ["[1/2]", "[2/2]"]
    assert f"loss {rows[0]['loss']:.4f}" in progress[0] and str(mqa) in progress[1]
    for line, r in zip(table_lines, rows):
        for shown in (f"{r['loss']:.4f}", f"{r['perplexity']:.2f}", f"{r['bits_per_byte']:.4f}", f"{r['params']:,}"):
            assert shown in line

    bad = CliRunner().invoke(app, [*prefix, str(mqa), "--data", str(valid_file), "--stride", "999"])
    if isinstance(bad.exception, TfkitError):
        assert "--stride" in str(bad.exception)
    else:
        assert bad.exit_code == 2 and "--stride" in bad.stderr


def test_json_out_is_checked_before_anything_is_scored(tokenizers, valid_file: Path, tmp_path: Path,
                                                        monkeypatch) -> None:
    import tfkit.evaluation.evaluate as evaluate_module

    def must_not_run(*args, **kwargs):
        raise AssertionError("evaluated although --json could never be written")

    monkeypatch.setattr(evaluate_module, "evaluate", must_not_run)
    ckpt = make_checkpoint(tmp_path / "gpt", tokenizers["bpe"])
    afile = tmp_path / "afile"
    afile.write_text("mine")
    app, prefix = cli_app()
    for target, needle in ((tmp_path, "is a folder, expected a file path"),
                           (afile / "results.json", f"{afile} is a file, not a folder")):
        result = CliRunner().invoke(app, [*prefix, str(ckpt), "--data", str(valid_file), "--json", str(target)])
        assert result.exit_code == 2, result.output
        assert f"--json {target}" in result.stderr and needle in result.stderr
    assert afile.read_text() == "mine"


def test_seq_len_zero_is_an_error_not_the_default(tokenizers, valid_file: Path, tmp_path: Path) -> None:
    ckpt = make_checkpoint(tmp_path / "gpt", tokenizers["bpe"])
    with pytest.raises(ConfigError, match=r"^seq_len must be in 1\.\.64"):
        score(ckpt, valid_file, tmp_path, seq_len=0)
    app, prefix = cli_app()
    for bad in ("0", "-3", "65"):
        result = CliRunner().invoke(app, [*prefix, str(ckpt), "--data", str(valid_file), "--seq-len", bad])
        assert result.exit_code == 2, result.output
        assert f"--seq-len must be in 1..64 (the smallest max_seq_len of the checkpoints), got {bad}" in result.stderr


def test_text_field_names_the_jsonl_key(tokenizers, valid_file: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("TFKIT_CACHE", str(tmp_path / "cache"))
    docs = valid_file.read_text(encoding="utf-8").split("\n\n")
    as_text, as_body = tmp_path / "text.jsonl", tmp_path / "body.jsonl"
    as_text.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs), encoding="utf-8")
    as_body.write_text("".join(json.dumps({"id": i, "body": d}) + "\n" for i, d in enumerate(docs)), encoding="utf-8")
    ckpt = make_checkpoint(tmp_path / "gpt", tokenizers["bpe"])
    expected = score(ckpt, as_text, tmp_path, batch_size=4, seq_len=32)
    got = score(ckpt, as_body, tmp_path, batch_size=4, seq_len=32, text_field="body")
    assert (got["tokens"], got["data_fingerprint"]) == (expected["tokens"], expected["data_fingerprint"])
    assert got["loss"] == pytest.approx(expected["loss"], rel=1e-6)

    app, prefix = cli_app()
    args = [*prefix, str(ckpt), "--data", str(as_body), "--batch-size", "4", "--seq-len", "32", "--device", "cpu"]
    missing = CliRunner().invoke(app, args)
    assert missing.exit_code == 2 and "body.jsonl:1: no 'text' field" in missing.stderr
    assert "--text-field" in missing.stderr
    result = CliRunner().invoke(app, [*args, "--text-field", "body", "--json", str(tmp_path / "out" / "r.json")])
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "out" / "r.json").read_text())[0]["tokens"] == expected["tokens"]


def test_default_context_is_the_length_the_checkpoints_trained_at(tokenizers, valid_file: Path, tmp_path: Path,
                                                                  monkeypatch) -> None:
    """Positions past the training length were never trained, so the default scores at train_seq_len
    (the smallest when checkpoints differ); checkpoints that do not record it use max_seq_len."""
    monkeypatch.setenv("TFKIT_CACHE", str(tmp_path / "cache"))
    at_24 = make_checkpoint(tmp_path / "a", tokenizers["bpe"], train_seq_len=24)
    at_32 = make_checkpoint(tmp_path / "b", tokenizers["bpe"], train_seq_len=32)
    unknown = make_checkpoint(tmp_path / "c", tokenizers["bpe"])
    assert score(unknown, valid_file, tmp_path, max_batches=1)["seq_len"] == 64
    assert score(at_32, valid_file, tmp_path, max_batches=1)["seq_len"] == 32
    app, prefix = cli_app()
    out = tmp_path / "rows.json"
    result = CliRunner().invoke(app, [*prefix, str(at_32), str(at_24), str(unknown), "--data", str(valid_file),
                                      "--max-batches", "1", "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert [r["seq_len"] for r in json.loads(out.read_text())] == [24, 24, 24]
    assert "scoring at seq_len 24, the length the checkpoints trained at (--seq-len takes up to 64)" in result.stderr
    result = CliRunner().invoke(app, [*prefix, str(unknown), "--data", str(valid_file), "--max-batches", "1",
                                      "--json", str(out)])
    assert result.exit_code == 0 and json.loads(out.read_text())[0]["seq_len"] == 64
    assert "scoring at" not in result.stderr


def test_json_out_replaces_earlier_results_but_no_other_file(tokenizers, valid_file: Path, tmp_path: Path,
                                                              monkeypatch) -> None:
    """Rerunning a comparison rewrites its results file; `--json` naming the corpus or a checkpoint's
    config.json is refused before anything is scored, and the file is left as it was."""
    monkeypatch.setenv("TFKIT_CACHE", str(tmp_path / "cache"))
    ckpt = make_checkpoint(tmp_path / "gpt", tokenizers["bpe"])
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(valid_file.read_text(encoding="utf-8"), encoding="utf-8")
    app, prefix = cli_app()
    base = [*prefix, str(ckpt), "--data", str(corpus), "--max-batches", "1", "--json"]
    out = tmp_path / "results.json"
    for _ in range(2):  # the second run replaces the first run's results
        result = CliRunner().invoke(app, [*base, str(out)])
        assert result.exit_code == 0, result.output
    for precious in (corpus, ckpt / "config.json"):
        before = precious.read_bytes()
        result = CliRunner().invoke(app, [*base, str(precious)])
        assert result.exit_code == 2, result.output
        assert f"--json {precious}: the file exists and does not hold earlier `tfkit eval` results" in result.stderr
        assert precious.read_bytes() == before


def test_a_full_disk_while_writing_json_keeps_the_earlier_results_whole(tokenizers, valid_file: Path,
                                                                        tmp_path: Path, monkeypatch) -> None:
    """The results file is replaced atomically: a write that fails half way (a full disk) leaves the
    earlier results as they were, not truncated, and no temporary file beside them."""
    monkeypatch.setenv("TFKIT_CACHE", str(tmp_path / "cache"))
    ckpt = make_checkpoint(tmp_path / "gpt", tokenizers["bpe"])
    app, prefix = cli_app()
    out = tmp_path / "results.json"
    args = [*prefix, str(ckpt), "--data", str(valid_file), "--max-batches", "1", "--json", str(out)]
    assert CliRunner().invoke(app, args).exit_code == 0
    before = out.read_bytes()
    for method in ("write_bytes", "write_text"):  # however the file is written, half of it reaches the disk
        write = getattr(Path, method)

        def disk_full(path: Path, data, *args, write=write, **kwargs) -> int:
            if path.parent != tmp_path:
                return write(path, data, *args, **kwargs)
            write(path, data[:10], *args, **kwargs)
            raise OSError(errno.ENOSPC, "No space left on device", str(path))

        monkeypatch.setattr(Path, method, disk_full)
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and "No space left on device" in result.stderr, result.output
    assert out.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "gpt", "results.json"]


def test_json_out_writes_a_diverged_loss_as_null() -> None:
    from tfkit.cli.evaluate import json_safe

    row = json_safe({"checkpoint": "c", "loss": float("nan"), "perplexity": float("inf"), "tokens": 5})
    assert json.loads(json.dumps(row)) == {"checkpoint": "c", "loss": None, "perplexity": None, "tokens": 5}


def test_rows_of_different_objectives_carry_a_note_and_kv_bytes_do_not_depend_on_dtype(
        tokenizers, valid_file: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("TFKIT_CACHE", str(tmp_path / "cache"))
    gpt = make_checkpoint(tmp_path / "gpt", tokenizers["bpe"])
    bert = make_checkpoint(tmp_path / "bert", tokenizers["wordpiece"], arch="bert")
    app, prefix = cli_app()
    common = ["--data", str(valid_file), "--max-batches", "1", "--device", "cpu"]
    mixed = CliRunner().invoke(app, [*prefix, str(gpt), str(bert), *common])
    assert mixed.exit_code == 0, mixed.output
    assert "note: these rows score different objectives (clm, mlm" in mixed.stderr
    same = CliRunner().invoke(app, [*prefix, str(gpt), *common])
    assert "different objectives" not in same.stderr
    kv = {dtype: score(gpt, valid_file, tmp_path, max_batches=1, dtype=dtype)["kv_cache_bytes_per_token"]
          for dtype in ("fp32", "bf16")}
    assert kv["fp32"] == kv["bf16"] > 0  # one meaning: bytes at bf16, as convert-mqa-to-gqa reports them


def test_byte_coverage_is_one_for_byte_level_bpe_and_below_for_wordpiece(tokenizers, tmp_path: Path) -> None:
    """WordPiece drops newlines and indentation: its bits per byte leave those bytes unpredicted, and
    byte_coverage says how much of the text its tokens stand for."""
    data = tmp_path / "indented.txt"
    data.write_text("def f(x):\n    return x  # twice\n\n\n    if x:\n        pass\n" * 40, encoding="utf-8")
    bpe = score(make_checkpoint(tmp_path / "bpe", tokenizers["bpe"]), data, tmp_path)
    wordpiece = score(make_checkpoint(tmp_path / "wp", tokenizers["wordpiece"]), data, tmp_path)
    assert bpe["byte_coverage"] == pytest.approx(1.0)
    assert wordpiece["byte_coverage"] < 0.8
