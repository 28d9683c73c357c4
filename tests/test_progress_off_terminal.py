"""Off a terminal (CI, `> log.txt`, nohup) a run writes plain lines, never progress-bar frames."""

from typer.testing import CliRunner

from tfkit.cli.main import app


def test_a_logged_run_has_one_plain_line_per_row_and_no_carriage_returns(english_file, tmp_path):
    sets = [f"data.train={english_file}", "data.valid=null", "train.max_steps=4", "train.batch_size=4",
            "data.seq_len=32", "train.log_every=2", "train.eval_every=1000", "train.save_every=1000",
            "eval.batches=1", "tokenizer.vocab_size=400", "tokenizer.max_train_mb=0.1", "log.progress=true",
            "log.plot=false", "train.device=cpu", "eval.sample_prompt=null"]
    result = CliRunner().invoke(app, ["pretrain", "gpt-tiny", "--run-dir", str(tmp_path / "run"),
                                      *[a for s in sets for a in ("--set", s)]])
    assert result.exit_code == 0, result.output
    assert "\r" not in result.stdout and "\r" not in result.stderr
    rows = [line for line in result.stdout.splitlines() if line.startswith("step ") and " loss " in line]
    assert [row.split()[1] for row in rows] == ["2/4", "4/4"]


def test_long_values_are_never_wrapped_off_a_terminal(tmp_path):
    """`tfkit recipes show NAME > my.yaml` must write YAML that loads, whatever the width of a value."""
    import yaml

    long_path = str(tmp_path / ("a-very-long-folder-name-" * 6) / "corpus.txt")  # far past 80 columns
    result = CliRunner().invoke(app, ["recipes", "show", "gpt-tiny", "--set", f"data.train={long_path}"])
    assert result.exit_code == 0, result.output
    assert any(long_path in line for line in result.stdout.splitlines())
    assert yaml.safe_load(result.stdout)["data"]["train"] == long_path


def test_the_run_says_what_it_trains_and_validates_on_without_progress_output(english_file, tmp_path):
    sets = [f"data.train={english_file}", "data.valid=null", "data.valid_fraction=0.1", "train.max_steps=2",
            "train.batch_size=4", "data.seq_len=32", "tokenizer.vocab_size=400", "tokenizer.max_train_mb=0.1",
            "log.progress=false", "log.plot=false", "eval.sample_prompt=null", "eval.batches=1", "train.threads=1"]
    result = CliRunner().invoke(app, ["pretrain", "gpt-tiny", "--run-dir", str(tmp_path / "run"),
                                      *[a for s in sets for a in ("--set", s)]])
    assert result.exit_code == 0, result.output
    data = next(line for line in result.stdout.splitlines() if line.startswith("data: "))
    assert f"training tokens from {english_file}" in data and "epochs in 2 steps" in data
    assert f"validation tokens from 10% of {english_file}, held out in chunks spread through it" in data
    assert "(1 CPU thread)" in result.stdout


def test_a_tokenizer_trained_off_a_terminal_prints_no_empty_lines(english_text, tmp_path):
    """tokenizers' own bars write to the process's stdout from Rust (which CliRunner does not capture):
    off a terminal they drew nothing but left an empty line per phase above the report. A phase is a phase
    whatever the corpus: 20 kB of it shows them."""
    import subprocess
    import sys

    corpus = tmp_path / "corpus.txt"
    corpus.write_text(english_text[:20_000], encoding="utf-8")
    done = subprocess.run([sys.executable, "-m", "tfkit", "train-tokenizer", str(corpus), "--vocab-size",
                           "300", "--out", str(tmp_path / "tok")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "bpe tokenizer" in done.stdout
    for stream in (done.stdout, done.stderr):
        assert not [n for n, line in enumerate(stream.splitlines()) if not line.strip()], stream[:300]


def test_long_work_off_a_terminal_is_a_plain_line_every_30_seconds_with_the_time_left(capsys):
    from tfkit.progress import Progress

    now = [0.0]
    progress = Progress("validation", 40, "batches", clock=lambda: now[0])  # pytest's stderr is no terminal
    for _ in range(12):
        now[0] += 2.0
        progress.update()  # 24 s: no line yet
    assert capsys.readouterr().err == ""
    for _ in range(4):
        now[0] += 2.0
        progress.update()
    progress.close()
    assert capsys.readouterr().err.splitlines() == ["validation: 15/40 batches, 30 s, about 50 s left"]
    silent = Progress("validation", 40, "batches", enabled=False, clock=lambda: now[0] + 100)
    silent.update()
    assert capsys.readouterr().err == ""
