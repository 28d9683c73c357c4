"""`tfkit eval` as the user watches it: progress while a checkpoint is scored (a line now and then off a
terminal, with the time left), and scoring in the precision the checkpoint trained in (`--dtype auto`)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from tfkit.checkpoints.weights import save_model
from tfkit.cli.main import app
from tfkit.evaluation.evaluate import EvalRequest, evaluate
from tfkit.evaluation.scoring_progress import ScoringProgress
from tfkit.models import ModelConfig, build_model
from tfkit.tokenization import load_tokenizer


@pytest.fixture(scope="module")
def tokenizer_dir(eval_tokenizers: dict[str, Path]) -> Path:
    return eval_tokenizers["bpe"]  # the evaluation tests' byte-level BPE (conftest.py), trained once per session


@pytest.fixture(scope="module")
def text_file(english_text: str, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("data") / "valid.txt"
    path.write_text(english_text[-8_000:], encoding="utf-8")
    return path


def checkpoint(folder: Path, tokenizer_dir: Path, **extra) -> Path:
    tok = load_tokenizer(tokenizer_dir)
    torch.manual_seed(0)
    model = build_model(ModelConfig(vocab_size=tok.vocab_size, d_model=32, n_layers=2, n_heads=4, max_seq_len=64))
    save_model(model, folder, step=5, train_seq_len=32, **extra)
    tok.save(folder)
    return folder


def eval_rows(tmp_path: Path, *args) -> list[dict]:
    out = tmp_path / "rows.json"
    result = CliRunner().invoke(app, ["eval", *map(str, args), "--json", str(out)])
    assert result.exit_code == 0, result.output
    return json.loads(out.read_text())


def test_off_a_terminal_scoring_prints_progress_lines_with_the_time_left(tokenizer_dir, text_file, tmp_path,
                                                                         monkeypatch) -> None:
    monkeypatch.setattr("tfkit.evaluation.scoring_progress.LINE_EVERY_S", 0.0)  # a line after every batch
    monkeypatch.setenv("TFKIT_CACHE", str(tmp_path / "cache"))
    ckpt = checkpoint(tmp_path / "step-5", tokenizer_dir)
    result = CliRunner().invoke(app, ["eval", str(ckpt), "--data", str(text_file), "--batch-size", "2"])
    assert result.exit_code == 0, result.output
    lines = [line for line in result.stderr.splitlines() if line.startswith("eval step-5: ")]
    assert len(lines) >= 2, result.stderr
    pattern = r"eval step-5: (\d+)/(\d+) batches, [\d,]+ tokens, \d+ s, about [\d.]+ (s|min) left"
    assert all(re.fullmatch(pattern, line) for line in lines), lines
    done = [int(re.match(pattern, line).group(1)) for line in lines]
    assert done == list(range(1, len(lines) + 1))
    assert "\r" not in result.stderr  # no bar frames in a log


def test_the_time_left_follows_the_share_done() -> None:
    batches = ScoringProgress("step-5", total_batches=4, max_tokens=None, enabled=False)
    batches.update(100)
    assert batches.line(10.0) == "eval step-5: 1/4 batches, 100 tokens, 10 s, about 30 s left"
    tokens = ScoringProgress("step-5", total_batches=None, max_tokens=1000, enabled=False)
    tokens.update(100)
    assert tokens.line(60.0) == "eval step-5: 1 batches, 100 tokens, 60 s, about 9.0 min left"
    unknown = ScoringProgress("step-5", total_batches=None, max_tokens=None, enabled=False)
    unknown.update(100)
    assert unknown.line(5.0) == "eval step-5: 1 batches, 100 tokens, 5 s"


def test_eval_scores_in_the_precision_the_checkpoint_trained_in(tokenizer_dir, text_file, tmp_path,
                                                                 monkeypatch) -> None:
    monkeypatch.setenv("TFKIT_CACHE", str(tmp_path / "cache"))
    bf16 = checkpoint(tmp_path / "bf16" / "step-5", tokenizer_dir, precision="bf16")
    unknown = checkpoint(tmp_path / "import" / "step-5", tokenizer_dir)  # an import: no precision recorded
    older = checkpoint(tmp_path / "older" / "checkpoints" / "step-5", tokenizer_dir)  # from before `auto`:
    (tmp_path / "older" / "recipe.yaml").write_text("train:\n  precision: bf16\n")  # its run's recipe says
    data = ["--data", text_file, "--max-batches", "2"]
    auto_rows = eval_rows(tmp_path, bf16, unknown, older, *data)
    assert [r["dtype"] for r in auto_rows] == ["bf16", "fp32", "bf16"]
    library = evaluate(bf16, str(text_file), EvalRequest(max_batches=2, dtype="bf16", cache_dir=tmp_path / "cache",
                                                         show_progress=False))
    assert auto_rows[0]["loss"] == library["loss"]
    assert [r["dtype"] for r in eval_rows(tmp_path, bf16, *data, "--dtype", "fp32")] == ["fp32"]
