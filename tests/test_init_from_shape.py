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
    assert f"model: as {tmp_path / 'ckpt'}, not the recipe's: " in (run / "start.log").read_text()


def test_a_model_key_given_explicitly_must_match_the_checkpoint(english_file, tmp_path):
    CliRunner().invoke(app, ["import-hf", str(hf_folder(tmp_path / "hf", "gpt2", tokenizer=True)),
                             "--out", str(tmp_path / "ckpt")])
    refused = CliRunner().invoke(app, ["pretrain", "gpt-tiny", "--run-dir", str(tmp_path / "run"),
                                       *_sets(f"train.init_from={tmp_path / 'ckpt'}", "model.d_model=32",
                                              "data.seq_len=32", f"data.train={english_file}", *QUICK)])
    assert refused.exit_code == 2, refused.output
    assert "model.d_model is 32 but the checkpoint has 64" in refused.output
    assert "model.n_layers" not in refused.output  # a key the user did not give follows the checkpoint


def _labels(path):
    rows = ["text,label"] + [f"{'waves and salt' if i % 2 else 'grass and stone'} {i},{'sea' if i % 2 else 'hill'}"
                             for i in range(24)]
    path.write_text("\n".join(rows) + "\n")
    return path


FINETUNE = ["data.valid=null", "data.seq_len=32", "train.max_steps=1", "train.batch_size=4", "train.eval_every=1",
            "train.save_every=1", "eval.batches=1", "train.precision=fp32", "log.tensorboard=false",
            "log.plot=false"]


def test_a_fine_tune_of_an_imported_bert_keeps_its_dropouts_unless_the_recipe_writes_them(tmp_path,
                                                                                           eval_tokenizers):
    """HF's BertConfig has 0.1 attention dropout; the bundled finetune-classify writes model.dropout only, so
    attention dropout is the checkpoint's (it was the recipe's 0.0), and a --set wins and is named."""
    hf = hf_folder(tmp_path / "hf", "bert")
    for file in eval_tokenizers["wordpiece"].glob("*.json"):  # a WordPiece tokenizer of 300 tokens, [CLS] and all
        (hf / file.name).write_bytes(file.read_bytes())
    imported = CliRunner().invoke(app, ["import-hf", str(hf), "--out", str(tmp_path / "ckpt")])
    assert imported.exit_code == 0, imported.output
    common = [f"train.init_from={tmp_path / 'ckpt'}", f"data.train={_labels(tmp_path / 'rows.csv')}", *FINETUNE]
    kept = CliRunner().invoke(app, ["finetune", "finetune-classify", "--run-dir", str(tmp_path / "kept"),
                                    *_sets(*common)])
    assert kept.exit_code == 0, kept.output
    model = load_recipe(str(tmp_path / "kept" / RECIPE_FILE)).model
    assert (model.dropout, model.attn_dropout) == (0.1, 0.1)
    card = (tmp_path / "kept" / "checkpoints" / "step-1" / "README.md").read_text()  # names what was imported
    assert f"fine-tuned from the weights of `{tmp_path / 'ckpt'}` (the HuggingFace BertModel `{hf.resolve()}`)" in card
    mine = CliRunner().invoke(app, ["finetune", "finetune-classify", "--run-dir", str(tmp_path / "mine"),
                                    *_sets(*common, "model.attn_dropout=0.0")])
    assert mine.exit_code == 0, mine.output
    assert load_recipe(str(tmp_path / "mine" / RECIPE_FILE)).model.attn_dropout == 0.0
    assert "model: the recipe's, not the checkpoint's: attn_dropout 0.0 (the checkpoint has 0.1)" in \
        (tmp_path / "mine" / "start.log").read_text()


def test_a_run_from_a_tfkit_checkpoint_keeps_its_dropouts_unless_the_recipe_writes_them(tmp_path):
    """gpt-tiny writes model.dropout (0.0) and not attn_dropout: the first is the recipe's, the second the
    checkpoint's."""
    from tfkit.checkpoints.weights import save_model
    from tfkit.models import build_model
    from tfkit.trainer.source import source_model

    from helpers import tiny_cfg

    save_model(build_model(tiny_cfg("gpt", dropout=0.2, attn_dropout=0.3)), tmp_path / "ckpt")
    lines = []
    out = type("Out", (), {"print": lambda self, text, **kw: lines.append(text)})()
    recipe = load_recipe("gpt-tiny", ["data.seq_len=16", f"train.init_from={tmp_path / 'ckpt'}"])
    model = source_model(recipe, tmp_path / "ckpt", out).model
    assert (model.dropout, model.attn_dropout) == (0.0, 0.3)
    assert lines[-1] == "model: the recipe's, not the checkpoint's: dropout 0.0 (the checkpoint has 0.2)"
