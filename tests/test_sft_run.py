"""A chat fine-tuning run (`data.format: chat`) grows the model by the chat tokens once, records the grown
vocabulary in its recipe.yaml, and resumes bit-exactly from its own checkpoint."""

import json
import shutil

from typer.testing import CliRunner

from tfkit.cli.main import app
from tfkit.layout import RECIPE_FILE
from tfkit.trainer.recipe import load_recipe

from test_run_start_block import TINY
from test_sft_learning import QUIET, _sets, reverse_task, write_chats


def _losses(run) -> list[float]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [row["loss"] for row in rows if "loss" in row and "val_loss" not in row]


def test_a_chat_run_resumes_exactly_with_its_grown_vocabulary(english_file, tmp_path):
    pretrained = tmp_path / "pre"
    done = CliRunner().invoke(app, ["pretrain", "gpt-tiny", "--run-dir", str(pretrained),
                                    *_sets(f"data.train={english_file}", *TINY, *QUIET, "model.max_seq_len=64")])
    assert done.exit_code == 0, done.output
    write_chats(tmp_path / "chat.jsonl", reverse_task(300, seed=0))
    run = tmp_path / "sft"
    sets = _sets(f"train.init_from={pretrained}", f"data.train={tmp_path / 'chat.jsonl'}", "data.seq_len=32",
                 "train.max_steps=4", "train.save_every=2", "train.keep_last=2", "train.log_every=1", "train.batch_size=4", *QUIET)
    done = CliRunner().invoke(app, ["pretrain", "sft-chat", "--run-dir", str(run), *sets])
    assert done.exit_code == 0, done.output
    assert "tokenizer: 4 chat tokens added, vocab 404" in done.output
    assert load_recipe(str(run / RECIPE_FILE)).model.vocab_size == 404
    straight = _losses(run)
    shutil.rmtree(run / "checkpoints" / "step-4")
    (run / "metrics.jsonl").write_text("".join(line + "\n" for line in
                                               (run / "metrics.jsonl").read_text().splitlines()[:3]))
    again = CliRunner().invoke(app, ["pretrain", str(run / RECIPE_FILE), "--resume", "auto", "--run-dir", str(run)])
    assert again.exit_code == 0, again.output
    assert "chat tokens added" not in again.output  # the checkpoint's tokenizer has them
    assert _losses(run)[-2:] == straight[-2:] and len(straight) == 4
