"""What a run trains and validates on: a user's corpus is validated on itself, and the start-of-run block
(corpora, tokenizer, tokens, epochs, model, device, threads, precision) is kept in the run folder."""

from pathlib import Path

from typer.testing import CliRunner

from tfkit.cli.main import app
from tfkit.trainer.recipe import load_recipe

from helpers import TINY

def test_a_users_corpus_is_validated_on_itself_not_on_the_builtin_split(english_file, tmp_path):
    assert load_recipe("gpt-tiny", [f"data.train={english_file}"]).data.valid is None
    chosen = load_recipe("gpt-tiny", [f"data.train={english_file}", "data.valid=stdlib:docs:valid"])
    assert chosen.data.valid == "stdlib:docs:valid"  # asked for by --set: kept
    assert load_recipe("gpt-tiny").data.valid == "stdlib:docs:valid"  # the split of its own corpus
    assert load_recipe("gpt-tiny", ["data.train=stdlib:docs"]).data.valid == "stdlib:docs:valid"
    assert load_recipe("gpt2-small", ["data.train=stdlib:docs:train"]).data.valid is None  # a code split
    own = tmp_path / "mine.yaml"
    own.write_text(f"data:\n  train: {english_file}\n  valid: stdlib:docs:valid\n")
    assert load_recipe(str(own)).data.valid is None
    mine_valid = tmp_path / "valid.txt"
    assert load_recipe("gpt-tiny", [f"data.train={english_file}", f"data.valid={mine_valid}"]).data.valid == str(
        mine_valid)


def test_the_start_block_is_kept_in_the_run_folder_and_a_resume_adds_its_own(english_file, tmp_path):
    run = tmp_path / "run"
    args = ["pretrain", "gpt-tiny", "--run-dir", str(run), "--set", f"data.train={english_file}"]
    first = CliRunner().invoke(app, [*args, *[a for s in TINY for a in ("--set", s)]])
    assert first.exit_code == 0, first.output
    log = (run / "start.log").read_text()
    shown = [line for line in first.stdout.splitlines() if line.startswith(("data: ", "gpt-tiny: ", "tokenizer: "))]
    assert len(shown) == 3 and all(line in log for line in shown)  # what the user saw, word for word
    assert f"validation tokens from 5% of {english_file}, held out in chunks spread through it" in log
    assert f"training tokens from {english_file}" in log and "epochs in 2 steps" in log
    assert "fp32 on cpu (1 CPU thread)" in log and log.startswith("# ") and "started" in log.splitlines()[0]
    again = CliRunner().invoke(app, [*args, "--resume", "auto",
                                     *[a for s in TINY + ["train.max_steps=3"] for a in ("--set", s)]])
    assert again.exit_code == 0, again.output
    blocks = Path(run / "start.log").read_text().split("\n\n# ")
    assert len(blocks) == 2 and "resumed at step 2" in blocks[1].splitlines()[0]
    assert "resuming" in blocks[1]


def test_a_folder_corpus_names_the_files_it_read_in_the_start_block(english_text, tmp_path):
    folder = tmp_path / "corpus"
    (folder / "part").mkdir(parents=True)
    (folder / "one.txt").write_text(english_text[:60_000])
    (folder / "part" / "two.txt").write_text(english_text[60_000:120_000])
    run = tmp_path / "run"
    result = CliRunner().invoke(app, ["pretrain", "gpt-tiny", "--run-dir", str(run), "--set", f"data.train={folder}",
                                      *[a for s in TINY for a in ("--set", s)]])
    assert result.exit_code == 0, result.output
    assert "data.train: 2 files: one.txt, part/two.txt" in (run / "start.log").read_text()
