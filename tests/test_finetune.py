"""`tfkit finetune`: a fine-tuning run is a run (trainer/task.py). A tiny BERT fine-tuned on stdlib:topics
scores well above chance, its checkpoint loads back as a classifier with its labels, a resume is bit-exact,
it starts from a pretrained run of another family, and bad input is one line, exit code 2."""

import json
import math
from collections import Counter
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from tfkit.checkpoints.run_record import read_metrics
from tfkit.checkpoints.weights import load_classifier
from tfkit.cli.main import app
from tfkit.models.heads import SequenceClassifier
from tfkit.tokenization.labelled import load_labelled
from tfkit.tokenization.train import TokenizerSpec, train_tokenizer
from tfkit.trainer.recipe import load_recipe
from tfkit.trainer.run_folder import resume_command

STEPS = 80


def write_recipe(folder: Path, tokenizer: Path | None, **sections) -> Path:
    """A random-init (the control) tiny BERT classifier of stdlib:topics, small enough for CI."""
    recipe = {
        "model": {"arch": "bert", "d_model": 64, "n_layers": 2, "n_heads": 4, "max_seq_len": 64, "dropout": 0.1,
                  "norm_placement": "pre"},
        "tokenizer": {"path": str(tokenizer) if tokenizer else None},
        "data": {"train": "stdlib:topics:train", "valid": "stdlib:topics:valid", "seq_len": 64},
        "objective": {"name": "classify"},
        "task": {"metric": "accuracy", "pooling": "mean"},
        "optim": {"lr": 3e-3, "weight_decay": 0.01},
        "schedule": {"name": "linear", "warmup_steps": 12},
        "train": {"max_steps": STEPS, "batch_size": 32, "log_every": 10, "eval_every": 40, "save_every": 40,
                  "keep_last": 10, "device": "cpu", "precision": "fp32", "keep_best": True},
        "log": {"progress": False, "plot": False, "tensorboard": False},
    }
    for section, values in sections.items():
        recipe[section] = {**recipe.get(section, {}), **values}
    path = folder / "finetune.yaml"
    path.write_text(json.dumps(recipe))  # JSON is YAML
    return path


def run(*args: str):
    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tok") / "tokenizer"
    texts = load_labelled("stdlib:topics:train", "stdlib:topics:valid").train.texts
    train_tokenizer(TokenizerSpec(kind="wordpiece", vocab_size=1000, lowercase=True), texts, out,
                    show_progress=False)
    return out


@pytest.fixture(scope="module")
def finetuned(tokenizer, tmp_path_factory):
    folder = tmp_path_factory.mktemp("finetune")
    recipe = write_recipe(folder, tokenizer)
    result = run("finetune", recipe, "--run-dir", folder / "run")
    assert result.exit_code == 0, result.output
    return recipe, folder / "run"


def test_a_tiny_bert_learns_stdlib_topics_well_above_chance(finetuned):
    _, run_dir = finetuned
    rows = [r for r in read_metrics(run_dir / "metrics.jsonl") if "val_loss" in r]
    assert [r["step"] for r in rows] == [0, 40, STEPS]
    assert all({"val_accuracy", "val_macro_f1", "val_matthews", "val_examples"} <= set(r) for r in rows)
    valid = load_labelled("stdlib:topics:train", "stdlib:topics:valid").valid
    majority = max(Counter(valid.targets).values()) / len(valid)  # always answering the largest class
    print("val accuracy", [round(r["val_accuracy"], 3) for r in rows], "majority", round(majority, 3))
    assert rows[-1]["val_examples"] == len(valid)
    assert rows[-1]["val_accuracy"] > majority + 0.15 and rows[-1]["val_matthews"] > 0.2
    start = (run_dir / "start.log").read_text()
    assert "classification, 10 classes" in start
    assert "global batch 32 examples (packed back to back into rows of at most 64 tokens;" in start  # not tokens
    assert "weight decay: 0.01 on 13 weight matrices (" in start and "; 0 on 28 norms, biases and embeddings (" in start
    (warning,) = [line for line in start.splitlines() if "cannot be exported" in line]  # said before it trains
    assert warning.startswith("warning: this classifier cannot be exported by `tfkit export-hf`: ")


def test_the_checkpoint_is_a_classifier_with_its_labels(finetuned):
    _, run_dir = finetuned
    config = json.loads((run_dir / "checkpoints" / f"step-{STEPS}" / "config.json").read_text())
    assert config["objective"] == "classify" and config["head"]["id2label"]["4"] == "json"
    assert config["head"]["label2id"]["xml"] == 9 and config["head"]["num_labels"] == 10
    assert config["task"]["metric"] == "accuracy" and config["task"]["truncation"] == "head"
    model, _ = load_classifier(run_dir)
    assert isinstance(model, SequenceClassifier) and model.head_config.labels[0] == "asyncio"
    rows = [r for r in read_metrics(run_dir / "metrics.jsonl") if "val_accuracy" in r and r["step"] > 0]
    best = max(rows, key=lambda r: r["val_accuracy"])
    kept = json.loads((run_dir / "best" / "config.json").read_text())
    assert kept["step"] == best["step"] and math.isclose(-kept["val_loss"], best["val_accuracy"])
    assert "task" in (run_dir / "recipe.yaml").read_text()
    one_line_exit_2(run("generate", run_dir, "-p", "x"), "a classifier made by `tfkit finetune`")
    # export-hf takes classifiers (tests/test_hf_classifier.py); this pre-LN, mean-pooled BERT has no HF class
    one_line_exit_2(run("export-hf", run_dir, "--out", run_dir.parent / "hf"), "model.norm_placement=pre has no "
                    "HuggingFace equivalent")


def test_a_resumed_fine_tuning_run_is_bit_exact(finetuned, tmp_path):
    recipe, ref = finetuned
    result = run("finetune", recipe, "--run-dir", tmp_path / "resumed", "--resume", ref / "checkpoints" / "step-40")
    assert result.exit_code == 0, result.output
    def numbers(folder):
        return {(r["step"], k): v for r in read_metrics(folder / "metrics.jsonl") for k, v in r.items()
                if r["step"] > 40 and k.startswith(("loss", "val_", "accuracy", "lr"))}
    assert numbers(ref) and numbers(tmp_path / "resumed") == numbers(ref)
    a = load_file(str(ref / "checkpoints" / f"step-{STEPS}" / "model.safetensors"))
    b = load_file(str(tmp_path / "resumed" / "checkpoints" / f"step-{STEPS}" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_it_starts_from_a_pretrained_gpt_run(english_file, tmp_path):
    """Any family: a GPT pretrained here lends its body (weights and tokenizer) to a classifier."""
    sets = ["data.train=" + str(english_file), "data.valid=null", "train.max_steps=2", "train.batch_size=4",
            "data.seq_len=32", "eval.batches=1", "tokenizer.vocab_size=400", "tokenizer.max_train_mb=0.1",
            "log.progress=false", "log.plot=false", "log.tensorboard=false", "eval.sample_prompt=null",
            "model.d_model=32", "model.n_layers=1", "model.n_heads=2"]
    pre = run("pretrain", "gpt-tiny", "--run-dir", tmp_path / "gpt", *[a for s in sets for a in ("--set", s)])
    assert pre.exit_code == 0, pre.output
    labelled = tmp_path / "pairs.csv"
    labelled.write_text("text,other,label\n" + "".join(f"word {i},thing {i % 3},{i % 2}\n" for i in range(40)))
    recipe = write_recipe(tmp_path, None, model={"arch": "gpt"},
                          data={"train": str(labelled), "valid": None, "valid_fraction": 0.2, "seq_len": 32},
                          task={"text_pair": "other"},
                          train={"init_from": str(tmp_path / "gpt"), "max_steps": 2, "batch_size": 4,
                                 "eval_every": 1})
    result = run("finetune", recipe, "--run-dir", tmp_path / "ft")
    assert result.exit_code == 0, result.output
    assert "validating the untrained model first on 8 examples (the baseline every curve starts from)" in result.output
    start = (tmp_path / "ft" / "start.log").read_text()
    assert "held out for validation" in start and "stratified by label" in start
    assert ("warning: this classifier cannot be exported by `tfkit export-hf`: head.pooling=mean has no HuggingFace "
            "equivalent: GPT2ForSequenceClassification pools the last token that is not pad_token_id; fine-tune "
            "with task.pooling: last to export") in start  # the recipe's mean pooling
    model, cfg = load_classifier(tmp_path / "ft")
    assert isinstance(model, SequenceClassifier) and cfg.arch == "gpt" and model.head_config.labels == ("0", "1")
    body = load_file(str(tmp_path / "ft" / "checkpoints" / "step-2" / "model.safetensors"))
    assert any(k.startswith("body.") for k in body) and "classifier.weight" in body


def one_line_exit_2(result, *fragments):
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()  # what the run said before it met the problem, then the error
    assert "Traceback" not in result.output and [line for line in lines if "error" in line] == lines[-1:], lines
    for fragment in fragments:
        assert fragment in result.output, result.output


@pytest.mark.parametrize("rows, sets, fragments", [
    ("text,label\na,x\nb,y\n", ["task.label=topic"], ["no column 'topic'", "task.label", "set task.label to the one to read"]),
    ("text,label\na,x\nb,x\nc,x\n", [], ["every label is 'x'", "at least two classes"]),
    ("text,label\na,1.5\nb,zero\n", ["objective.name=regress", "task.metric=pearson"],
     ["'zero'", "expected a finite number"]),
])
def test_bad_labelled_data_is_one_line(rows, sets, fragments, tokenizer, tmp_path):
    data = tmp_path / "data.csv"
    data.write_text(rows)
    recipe = write_recipe(tmp_path, tokenizer, data={"train": str(data), "valid": str(data)})
    result = run("finetune", recipe, "--run-dir", tmp_path / "run", *[a for s in sets for a in ("--set", s)])
    one_line_exit_2(result, *fragments)
    assert not (tmp_path / "run").exists()


def test_an_unseen_validation_label_is_named(tokenizer, tmp_path):
    (tmp_path / "t.csv").write_text("text,label\na,x\nb,y\n")
    (tmp_path / "v.csv").write_text("text,label\nc,x\nd,z\n")
    recipe = write_recipe(tmp_path, tokenizer, data={"train": str(tmp_path / "t.csv"), "valid": str(tmp_path / "v.csv")})
    one_line_exit_2(run("finetune", recipe, "--run-dir", tmp_path / "run"), "v.csv:3", "'z'", "never occurs")


def test_a_head_the_family_cannot_have_and_a_tokenizer_without_the_layout_tokens(tokenizer, tmp_path):
    recipe = write_recipe(tmp_path, tokenizer, task={"pooling": "last"})
    one_line_exit_2(run("finetune", recipe, "--run-dir", tmp_path / "a"), "task.pooling", "bert models")
    bpe = tmp_path / "bpe"
    train_tokenizer(TokenizerSpec(kind="bpe", vocab_size=300), ["some text here"] * 50, bpe, show_progress=False)
    recipe = write_recipe(tmp_path, bpe)
    one_line_exit_2(run("finetune", recipe, "--run-dir", tmp_path / "b"), "[CLS]", "bert input layout")


def test_recipe_problems_and_the_wrong_command_are_one_line(tmp_path):
    recipe = write_recipe(tmp_path, None)  # random init without a tokenizer
    one_line_exit_2(run("finetune", recipe), "tokenizer.path", "random weights")
    one_line_exit_2(run("finetune", "bert-tiny"), "fine-tuning needs classify or regress")
    one_line_exit_2(run("pretrain", "finetune-classify", "--set", "train.init_from=null",
                        "--set", f"tokenizer.path={tmp_path}"), "tfkit finetune")


def test_eval_scores_a_classifier_on_labelled_rows_as_its_validation_did(finetuned, tmp_path):
    _, run_dir = finetuned
    result = run("eval", run_dir, "--data", "stdlib:topics:valid", "--json", tmp_path / "r.json")
    assert result.exit_code == 0, result.output
    assert "accuracy" in result.stdout and "matthews" in result.stdout
    row = json.loads((tmp_path / "r.json").read_text())[0]
    assert row["checkpoint"] == str(run_dir / "best") and row["task"] == "classification"
    best = json.loads((run_dir / "best" / "config.json").read_text())
    logged = next(r for r in read_metrics(run_dir / "metrics.jsonl") if r["step"] == best["step"] and "val_loss" in r)
    for key in ("accuracy", "macro_f1", "matthews"):
        assert math.isclose(row[key], logged[f"val_{key}"], abs_tol=1e-6), key
    assert row["examples"] == logged["val_examples"]
    task = tmp_path / "task.jsonl"  # a language-model task file names no labels: refused, not a traceback
    task.write_text('{"context": "a", "choices": ["b", "c"], "gold": 0}\n')
    one_line_exit_2(run("eval", run_dir, "--task", task), "--task", "--data")


def test_predict_streams_one_row_per_input_and_never_overwrites_without_force(finetuned, tmp_path):
    _, run_dir = finetuned
    out = tmp_path / "preds.jsonl"
    result = run("predict", run_dir, "--data", "stdlib:topics:valid", "--out", out, "--batch-size", "16")
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    valid = load_labelled("stdlib:topics:train", "stdlib:topics:valid")
    assert len(rows) == len(valid.valid)
    for r in rows:
        probs = {k[2:]: v for k, v in r.items() if k.startswith("p_")}
        assert set(probs) == set(valid.labels) and math.isclose(sum(probs.values()), 1.0, rel_tol=1e-5)
        assert r["label"] == max(probs, key=probs.get)
    right = sum(r["label"] == valid.labels[t] for r, t in zip(rows, valid.valid.targets))
    evaluated = run("eval", run_dir, "--data", "stdlib:topics:valid", "--json", tmp_path / "r.json")
    assert evaluated.exit_code == 0
    assert math.isclose(right / len(rows), json.loads((tmp_path / "r.json").read_text())[0]["accuracy"])
    before = out.read_bytes()
    again = run("predict", run_dir, "--data", "stdlib:topics:valid", "--out", out)
    one_line_exit_2(again, "--out", "--force")
    assert out.read_bytes() == before  # nothing the user had is lost
    csv_out = tmp_path / "preds.csv"
    assert run("predict", run_dir, "--data", "stdlib:topics:valid", "--out", csv_out).exit_code == 0
    assert csv_out.read_text().splitlines()[0].startswith("row,label,p_asyncio,")
    assert run("predict", run_dir, "--data", "stdlib:topics:valid", "--out", out, "--force").exit_code == 0


def test_labelled_eval_and_predict_refuse_what_they_cannot_score(finetuned, english_file, tmp_path):
    _, run_dir = finetuned
    data = tmp_path / "d.csv"
    data.write_text("text,label\nimport a module,importlib\nparse a date,datetime\n")
    one_line_exit_2(run("eval", run_dir, "--data", data), "d.csv:3", "'datetime'", "not a class")
    one_line_exit_2(run("predict", run_dir, "--data", data, "--out", tmp_path / "p.txt"), ".jsonl or .csv")
    lm = tmp_path / "lm"
    sets = ["data.train=" + str(english_file), "data.valid=null", "train.max_steps=1", "train.batch_size=2",
            "data.seq_len=16", "eval.batches=1", "tokenizer.vocab_size=300", "tokenizer.max_train_mb=0.05",
            "log.progress=false", "log.plot=false", "log.tensorboard=false", "eval.sample_prompt=null",
            "model.d_model=16", "model.n_layers=1", "model.n_heads=2"]
    assert run("pretrain", "gpt-tiny", "--run-dir", lm, *[a for s in sets for a in ("--set", s)]).exit_code == 0
    one_line_exit_2(run("eval", lm, run_dir, "--data", data), "language model", "not a classifier")


def test_regression_with_sliding_windows_trains_scores_and_predicts(tokenizer, tmp_path):
    """STS-B-like float targets: Pearson / Spearman in metrics.jsonl, a head of one output, windows pooled."""
    data = tmp_path / "sts.jsonl"
    data.write_text("".join(json.dumps({"text": "word " * (5 + i % 40), "score": (i % 40) / 8}) + "\n"
                            for i in range(80)))
    recipe = write_recipe(tmp_path, tokenizer, objective={"name": "regress"},
                          data={"train": str(data), "valid": None, "valid_fraction": 0.25, "seq_len": 16},
                          task={"label": "score", "metric": "auto", "stride": 7},
                          train={"max_steps": 4, "batch_size": 8, "eval_every": 2})
    result = run("finetune", recipe, "--run-dir", tmp_path / "run")
    assert result.exit_code == 0, result.output
    rows = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if "val_loss" in r]
    assert [r["step"] for r in rows] == [0, 2, 4] and all({"val_pearson", "val_spearman"} <= set(r) for r in rows)
    assert rows[-1]["val_examples"] == 20  # examples, not windows
    start = (tmp_path / "run" / "start.log").read_text()
    assert "a seeded sample" in start and "read as sliding windows" in start
    config = json.loads((tmp_path / "run" / "checkpoints" / "step-4" / "config.json").read_text())
    assert config["head"]["task"] == "regression" and config["head"]["num_labels"] == 1
    out = tmp_path / "p.jsonl"
    assert run("predict", tmp_path / "run", "--data", data, "--out", out).exit_code == 0
    preds = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(preds) == 80 and all(isinstance(p["prediction"], float) for p in preds)


def test_the_resume_hint_of_a_fine_tuning_run_names_finetune(finetuned):
    """What an interrupted run prints must be a command that continues it: `tfkit pretrain` refuses a
    fine-tuning recipe."""
    _, run_dir = finetuned
    assert resume_command(run_dir).startswith(f"tfkit finetune {run_dir / 'recipe.yaml'} --resume auto")
    one_line_exit_2(run("pretrain", run_dir / "recipe.yaml", "--resume", "auto", "--run-dir", run_dir),
                    "tfkit finetune")


def test_epochs_set_the_steps_and_max_train_samples_cuts_the_training_rows(tokenizer, tmp_path):
    """HF's num_train_epochs and max_train_samples: 320 of stdlib:topics' rows at batch 32 are 10 updates an
    epoch, so half an epoch is 5 steps, whatever train.max_steps says; recipe.yaml records the 5."""
    recipe = write_recipe(tmp_path, tokenizer, data={"max_train_samples": 320},
                          train={"epochs": 0.5, "max_steps": 999, "eval_every": 1000, "save_every": 1000})
    result = run("finetune", recipe, "--run-dir", tmp_path / "run")
    assert result.exit_code == 0, result.output
    start = (tmp_path / "run" / "start.log").read_text()
    assert "data: data.max_train_samples=320: training on the first 320 of " in start
    assert "train.epochs=0.5: 5 steps (10 an epoch: 320 examples at train.batch_size=32), in place of " \
           "train.max_steps" in start
    assert load_recipe(str(tmp_path / "run" / "recipe.yaml")).train.max_steps == 5
    assert [r["step"] for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if "loss" in r][-1] == 5
