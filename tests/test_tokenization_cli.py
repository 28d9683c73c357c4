"""`train-tokenizer` through Typer's CliRunner on a throwaway app (cli/main.py registers it for real)."""

import json

import pytest
import typer
from typer.testing import CliRunner

from tfkit.cli.tokenizer import train_tokenizer
from tfkit.errors import DataError
from tfkit.tokenization.train import load_tokenizer

app = typer.Typer()
app.command()(train_tokenizer)


@pytest.fixture
def corpus(english_text, tmp_path):
    """150 kB of English prose as a text file."""
    path = tmp_path / "english.txt"
    path.write_text(english_text[:150_000], encoding="utf-8")
    return path


def test_cli_trains_and_writes_every_file(corpus, tmp_path):
    out = tmp_path / "tok"
    result = CliRunner().invoke(app, [str(corpus), "--out", str(out), "--kind", "wordpiece", "--vocab-size", "600",
                                      "--lowercase", "--special-token", "[USER]", "--heldout-chars", "5000", "-q"])
    assert result.exit_code == 0, result.output
    assert {p.name for p in out.iterdir()} == {
        "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer_report.json"
    }
    report = json.loads((out / "tokenizer_report.json").read_text())
    assert 2500 < report["heldout_bytes"] <= 5000  # blocks of whole lines sampled from all through the corpus
    assert report["heldout_bytes"] + report["training_chars"] == 150_000
    assert "bytes / token" in result.output and "wordpiece tokenizer" in result.output
    tok = load_tokenizer(out)
    assert tok.vocab_size == 600 and tok.token_to_id("[USER]") == 5
    assert tok.encode("HEAR") == tok.encode("hear")


def test_cli_errors_are_tfkit_errors(tmp_path):
    result = CliRunner().invoke(app, [str(tmp_path / "missing.txt"), "--out", str(tmp_path / "tok")])
    assert result.exit_code != 0 and isinstance(result.exception, DataError)
    assert "missing.txt: no such file" in str(result.exception)
    assert not (tmp_path / "tok").exists()


def test_help_comes_from_the_docstring():
    result = CliRunner().invoke(app, ["--help"])
    assert result.exit_code == 0 and "Train a tokenizer on CORPUS" in result.output


@pytest.mark.parametrize("flag, kept", [("--strip-accents", False), ("--keep-accents", True)])
def test_cli_strip_accents_option_reaches_the_normalizer(tmp_path, flag, kept):
    corpus = tmp_path / "cafe.txt"
    corpus.write_text("café résumé naïve cafe resume naive\n" * 200)
    out = tmp_path / "tok"
    result = CliRunner().invoke(app, [str(corpus), "--out", str(out), "--kind", "wordpiece", "--vocab-size", "120",
                                      "--lowercase", flag, "--heldout-chars", "0", "-q"])
    assert result.exit_code == 0, result.output
    normalized = load_tokenizer(out).tokenizer.normalizer.normalize_str("Café")
    assert normalized == ("café" if kept else "cafe")


def test_a_folder_corpus_lists_the_files_it_read(english_text, tmp_path):
    """Which files a folder corpus trained on is in the report (printed and tokenizer_report.json), in
    reading order; hidden files are not read, so not listed."""
    folder = tmp_path / "corpus"
    (folder / "sub").mkdir(parents=True)
    (folder / "b.txt").write_text(english_text[:20_000])
    (folder / "sub" / "a.md").write_text(english_text[20_000:40_000])
    (folder / ".notes.txt").write_text("hidden")
    out = tmp_path / "tok"
    result = CliRunner().invoke(app, [str(folder), "--out", str(out), "--vocab-size", "300", "-q"])
    assert result.exit_code == 0, result.output
    assert json.loads((out / "tokenizer_report.json").read_text())["corpus_files"] == ["b.txt", "sub/a.md"]
    assert "2 files: b.txt, sub/a.md" in result.output
    single = CliRunner().invoke(app, [str(folder / "b.txt"), "--out", str(tmp_path / "one"), "--vocab-size", "300", "-q"])
    assert "corpus_files" not in json.loads((tmp_path / "one" / "tokenizer_report.json").read_text())
    assert single.exit_code == 0
