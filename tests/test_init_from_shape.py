"""A run started from a checkpoint (train.init_from) takes its model shape from it, unless `--set model.KEY`
says otherwise, and `tfkit import-hf` prints the command that continues pretraining the imported model."""

import shlex

from typer.testing import CliRunner

from tfkit.cli.main import app
from tfkit.layout import RECIPE_FILE
from tfkit.trainer.recipe import load_recipe

from helpers import TINY, hf_folder

QUICK = [s for s in TINY if not s.startswith(("data.seq_len", "tokenizer."))]  # the import's tokenizer is kept


def _sets(*items: str) -> list[str]:
    return [a for s in items for a in ("--set", s)]


def test_an_imported_model_continues_pretraining_with_the_printed_command(english_file, tmp_path):
    imported = CliRunner().invoke(app, ["import-hf", str(hf_folder(tmp_path / "hf", "gpt2", tokenizer=True)),
                                        "--out", str(tmp_path / "ckpt")])
    assert imported.exit_code == 0, imported.output
    (line,) = [line for line in imported.stderr.splitlines() if line.startswith("continue pretraining it with: ")]
    command = shlex.split(line.removeprefix("continue pretraining it with: "))
    assert command[:3] == ["tfkit", "pretrain", "gpt-tiny"] and f"train.init_from={tmp_path / 'ckpt'}" in command
    run = tmp_path / "run"
    done = CliRunner().invoke(app, [*command[1:], "--run-dir", str(run), *_sets(f"data.train={english_file}", *QUICK)])
    assert done.exit_code == 0, done.output
    model = load_recipe(str(run / RECIPE_FILE)).model  # recipe.yaml says what trained: the checkpoint's shape
    assert (model.d_model, model.n_layers, model.max_seq_len) == (64, 2, 64)
    assert f"model: the shape of {tmp_path / 'ckpt'}, not the recipe's: " in (run / "start.log").read_text()


def test_a_model_key_given_explicitly_must_match_the_checkpoint(english_file, tmp_path):
    CliRunner().invoke(app, ["import-hf", str(hf_folder(tmp_path / "hf", "gpt2", tokenizer=True)),
                             "--out", str(tmp_path / "ckpt")])
    refused = CliRunner().invoke(app, ["pretrain", "gpt-tiny", "--run-dir", str(tmp_path / "run"),
                                       *_sets(f"train.init_from={tmp_path / 'ckpt'}", "model.d_model=32",
                                              "data.seq_len=32", f"data.train={english_file}", *QUICK)])
    assert refused.exit_code == 2, refused.output
    assert "model.d_model is 32 but the checkpoint has 64" in refused.output
    assert "model.n_layers" not in refused.output  # a key the user did not give follows the checkpoint
