"""Bad command-line values: sizes, counts and choices out of range for every command, including values
the libraries below would abort on (a vocabulary of 1e11). One line naming the option, exit code 2."""

from __future__ import annotations

import pytest
from fault_helpers import assert_one_line_error, changes, cli, snapshot

CKPT = "{RUN}/checkpoints/step-4"
CASES = {
    "tokenizer vocab huge": (["train-tokenizer", "{TXT}", "--out", "{T}/tok", "--vocab-size", "99999999999", "-q"],
                             "vocab_size"),
    "tokenizer vocab zero": (["train-tokenizer", "{TXT}", "--out", "{T}/tok", "--vocab-size", "0", "-q"], "vocab"),
    "tokenizer vocab negative": (["train-tokenizer", "{TXT}", "--out", "{T}/tok", "--vocab-size", "-3", "-q"], "vocab"),
    "tokenizer kind": (["train-tokenizer", "{TXT}", "--out", "{T}/tok", "--kind", "morse", "-q"], "morse"),
    "eval batch size zero": (["eval", CKPT, "--data", "{TXT}", "--batch-size", "0"], "--batch-size"),
    "eval seq len zero": (["eval", CKPT, "--data", "{TXT}", "--seq-len", "0"], "--seq-len"),
    "eval seq len too long": (["eval", CKPT, "--data", "{TXT}", "--seq-len", "100000"], "--seq-len"),
    "eval stride zero": (["eval", CKPT, "--data", "{TXT}", "--stride", "0"], "--stride"),
    "eval dtype": (["eval", CKPT, "--data", "{TXT}", "--dtype", "fp8"], "fp8"),
    "convert kv heads indivisible": (["convert-mqa-to-gqa", CKPT, "--kv-heads", "3", "--out", "{T}/o"], "3"),
    "convert kv heads zero": (["convert-mqa-to-gqa", CKPT, "--kv-heads", "0", "--out", "{T}/o"], "kv"),
    "convert method": (["convert-mqa-to-gqa", CKPT, "--kv-heads", "2", "--method", "vote", "--out", "{T}/o"], "vote"),
    "convert device": (["convert-mqa-to-gqa", CKPT, "--kv-heads", "2", "--out", "{T}/o", "--device", "tpu"],
                       "--device: got 'tpu'"),
    "eval device": (["eval", CKPT, "--data", "{TXT}", "--device", "tpu"], "--device: got 'tpu'"),
    "generate device": (["generate", CKPT, "--prompt", "hi", "--device", "cuda:x"], "--device: got 'cuda:x'"),
    "generate dtype auto": (["generate", CKPT, "--prompt", "hi", "--dtype", "auto"], "--dtype: got 'auto'"),
    "generate temperature negative": (["generate", CKPT, "--prompt", "hi", "--temperature", "-1"], "temperature"),
    "generate top-p above one": (["generate", CKPT, "--prompt", "hi", "--top-p", "2"], "top-p"),
    "generate top-k zero": (["generate", CKPT, "--prompt", "hi", "--top-k", "0"], "top-k"),
    "generate no prompt": (["generate", CKPT], "prompt"),
    "pretrain resume empty": (["pretrain", "{RECIPE}", "--run-dir", "{T}/run", "--resume", ""], "--resume"),
    "pretrain set seed huge": (["pretrain", "{RECIPE}", "--run-dir", "{T}/run", "--set",
                                "train.seed=1180591620717411303424"], "train.seed"),
    "pretrain set d_model huge": (["pretrain", "{RECIPE}", "--run-dir", "{T}/run", "--set", "model.d_model=131072"],
                                  "model.d_model=131072"),
    "pretrain set vocab huge": (["pretrain", "{RECIPE}", "--run-dir", "{T}/run", "--set",
                                 "model.vocab_size=3000000000"], "model.vocab_size=3000000000"),
}


@pytest.mark.parametrize("case", sorted(CASES), ids=[f"arg-{c.replace(' ', '-')}" for c in sorted(CASES)])
def test_a_bad_option_value_is_one_line(case, tiny_run, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TFKIT_CACHE", str(tmp_path / ".cache"))
    (tmp_path / "text.txt").write_text("Plain text to read. " * 300)
    args, expected = CASES[case]
    values = {"{RUN}": str(tiny_run[1]), "{RECIPE}": str(tiny_run[0]), "{TXT}": str(tmp_path / "text.txt"),
              "{T}": str(tmp_path)}
    for key, value in values.items():
        args = [a.replace(key, value) for a in args]
    before, run = snapshot(tmp_path), snapshot(tiny_run[1])
    assert_one_line_error(cli(args), expected)
    assert not changes(before, snapshot(tmp_path)), changes(before, snapshot(tmp_path))
    assert snapshot(tiny_run[1]) == run
