"""`tfkit eval` on the command line: one printed row per checkpoint and the same numbers in --json-out, the
output file checked before any scoring and replaced whole (never another file, never half on a full disk),
and the options that pick the data and the context named when they are wrong."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from tfkit.cli.main import app
from tfkit.errors import ConfigError, TfkitError

from helpers import eval_score as score
from helpers import make_checkpoint


def cli_app() -> tuple[typer.Typer, list[str]]:
    return app, ["eval"]


def test_cli_prints_one_row_per_checkpoint_and_the_same_json(eval_tokenizers, valid_file: Path, tmp_path: Path,
                                                             monkeypatch) -> None:
    monkeypatch.setenv("TFKIT_CACHE", str(tmp_path / "cache"))
    mha = make_checkpoint(tmp_path / "run-mha" / "checkpoints" / "step-5", eval_tokenizers["bpe"])
    mqa = make_checkpoint(tmp_path / "mqa", eval_tokenizers["bpe"], seed=3, n_kv_heads=1)
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


def test_json_out_is_checked_before_anything_is_scored(eval_tokenizers, valid_file: Path, tmp_path: Path,
                                                        monkeypatch) -> None:
    import tfkit.evaluation.evaluate as evaluate_module

    def must_not_run(*args, **kwargs):
        raise AssertionError("evaluated although --json could never be written")

    monkeypatch.setattr(evaluate_module, "evaluate", must_not_run)
    ckpt = make_checkpoint(tmp_path / "gpt", eval_tokenizers["bpe"])
    afile = tmp_path / "afile"
    afile.write_text("mine")
    app, prefix = cli_app()
    for target, needle in ((tmp_path, "is a folder, expected a file path"),
                           (afile / "results.json", f"{afile} is a file, not a folder")):
        result = CliRunner().invoke(app, [*prefix, str(ckpt), "--data", str(valid_file), "--json", str(target)])
        assert result.exit_code == 2, result.output
        assert f"--json {target}" in result.stderr and needle in result.stderr
    assert afile.read_text() == "mine"


def test_seq_len_zero_is_an_error_not_the_default(eval_tokenizers, valid_file: Path, tmp_path: Path) -> None:
    ckpt = make_checkpoint(tmp_path / "gpt", eval_tokenizers["bpe"])
    with pytest.raises(ConfigError, match=r"^seq_len must be in 1\.\.64"):
        score(ckpt, valid_file, tmp_path, seq_len=0)
    app, prefix = cli_app()
    for bad in ("0", "-3", "65"):
        result = CliRunner().invoke(app, [*prefix, str(ckpt), "--data", str(valid_file), "--seq-len", bad])
        assert result.exit_code == 2, result.output
        assert f"--seq-len must be in 1..64 (the smallest max_seq_len of the checkpoints), got {bad}" in result.stderr


def test_text_field_names_the_jsonl_key(eval_tokenizers, valid_file: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("TFKIT_CACHE", str(tmp_path / "cache"))
    docs = valid_file.read_text(encoding="utf-8").split("\n\n")
    as_text, as_body = tmp_path / "text.jsonl", tmp_path / "body.jsonl"
    as_text.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs), encoding="utf-8")
    as_body.write_text("".join(json.dumps({"id": i, "body": d}) + "\n" for i, d in enumerate(docs)), encoding="utf-8")
    ckpt = make_checkpoint(tmp_path / "gpt", eval_tokenizers["bpe"])
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


def test_default_context_is_the_length_the_checkpoints_trained_at(eval_tokenizers, valid_file: Path, tmp_path: Path,
                                                                  monkeypatch) -> None:
    """Positions past the training length were never trained, so the default scores at train_seq_len
    (the smallest when checkpoints differ); checkpoints that do not record it use max_seq_len."""
    monkeypatch.setenv("TFKIT_CACHE", str(tmp_path / "cache"))
    at_24 = make_checkpoint(tmp_path / "a", eval_tokenizers["bpe"], train_seq_len=24)
    at_32 = make_checkpoint(tmp_path / "b", eval_tokenizers["bpe"], train_seq_len=32)
    unknown = make_checkpoint(tmp_path / "c", eval_tokenizers["bpe"])
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


def test_json_out_replaces_earlier_results_but_no_other_file(eval_tokenizers, valid_file: Path, tmp_path: Path,
                                                              monkeypatch) -> None:
    """Rerunning a comparison rewrites its results file; `--json` naming the corpus or a checkpoint's
    config.json is refused before anything is scored, and the file is left as it was."""
    monkeypatch.setenv("TFKIT_CACHE", str(tmp_path / "cache"))
    ckpt = make_checkpoint(tmp_path / "gpt", eval_tokenizers["bpe"])
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


def test_a_full_disk_while_writing_json_keeps_the_earlier_results_whole(eval_tokenizers, valid_file: Path,
                                                                        tmp_path: Path, monkeypatch) -> None:
    """The results file is replaced atomically: a write that fails half way (a full disk) leaves the
    earlier results as they were, not truncated, and no temporary file beside them."""
    monkeypatch.setenv("TFKIT_CACHE", str(tmp_path / "cache"))
    ckpt = make_checkpoint(tmp_path / "gpt", eval_tokenizers["bpe"])
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
    from tfkit.cli.json_rows import json_safe

    row = json_safe({"checkpoint": "c", "loss": float("nan"), "perplexity": float("inf"), "tokens": 5})
    assert json.loads(json.dumps(row)) == {"checkpoint": "c", "loss": None, "perplexity": None, "tokens": 5}


def test_rows_of_different_objectives_carry_a_note_and_kv_bytes_do_not_depend_on_dtype(
        eval_tokenizers, valid_file: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("TFKIT_CACHE", str(tmp_path / "cache"))
    gpt = make_checkpoint(tmp_path / "gpt", eval_tokenizers["bpe"])
    bert = make_checkpoint(tmp_path / "bert", eval_tokenizers["wordpiece"], arch="bert")
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


@pytest.mark.parametrize("mode", ["corpus", "task"])
def test_every_checkpoint_is_resolved_before_anything_is_scored(eval_tokenizers, valid_file: Path, tmp_path: Path,
                                                                monkeypatch, mode) -> None:
    """A bad third path is refused before the first two are scored, for a corpus and for a task file."""
    import tfkit.evaluation.evaluate as evaluate_module
    import tfkit.evaluation.task_scores as task_module

    def must_not_run(*args, **kwargs):
        raise AssertionError("scored a checkpoint although a later argument is not one")

    monkeypatch.setattr(evaluate_module, "evaluate", must_not_run)
    monkeypatch.setattr(task_module, "score_task", must_not_run)
    ckpt = make_checkpoint(tmp_path / "gpt", eval_tokenizers["bpe"])
    task = tmp_path / "task.jsonl"
    task.write_text(json.dumps({"context": "The cat", "choices": [" sat", " flew"], "gold": 0}) + "\n")
    what = ["--data", str(valid_file)] if mode == "corpus" else ["--task", str(task)]
    app, prefix = cli_app()
    result = CliRunner().invoke(app, [*prefix, str(ckpt), str(ckpt), str(tmp_path / "typo"), *what,
                                      "--json", str(tmp_path / "rows.json")])
    assert result.exit_code == 2, result.output
    assert result.stderr.strip().splitlines() == [f"error: {tmp_path / 'typo'}: no such checkpoint or run folder"]
    assert not (tmp_path / "rows.json").exists()
