"""The model card of a fine-tuned checkpoint: `tfkit finetune` writes README.md into the final checkpoint and
best/, in HF's card layout (parsed by huggingface_hub), every fact read from what the run recorded, and a
random-init control's card names no base model."""

import json
from pathlib import Path

import pytest
import yaml
from test_finetune import run, write_recipe

from tfkit.checkpoints.run_record import read_metrics
from tfkit.tokenization.train import TokenizerSpec, train_tokenizer

huggingface_hub = pytest.importorskip("huggingface_hub")  # the test extra installs it (with transformers)

PRETRAIN = ["data.valid=null", "train.max_steps=3", "train.batch_size=4", "data.seq_len=32", "eval.batches=1",
            "tokenizer.vocab_size=300", "tokenizer.max_train_mb=0.05", "log.progress=false", "log.plot=false",
            "log.tensorboard=false", "model.d_model=32", "model.n_layers=1", "model.n_heads=2"]


def finetune(tmp_path: Path, init_from: Path | None, tokenizer: Path | None) -> Path:
    labelled = tmp_path / "labelled.csv"
    labelled.write_text("text,label\n" + "".join(f"word {i} thing,{('yes', 'no', 'maybe')[i % 3]}\n"
                                                  for i in range(60)))
    recipe = write_recipe(tmp_path, tokenizer, data={"train": str(labelled), "valid": None, "valid_fraction": 0.25,
                                                     "seq_len": 32},
                          train={"init_from": str(init_from) if init_from else None, "max_steps": 4,
                                 "batch_size": 4, "eval_every": 2, "save_every": 2})
    result = run("finetune", recipe, "--run-dir", tmp_path / "ft")
    assert result.exit_code == 0, result.output
    return tmp_path / "ft"


def card_of(folder: Path):
    return huggingface_hub.ModelCard((folder / "README.md").read_text(encoding="utf-8"))


def test_the_final_and_best_checkpoints_carry_a_card_of_recorded_facts(english_file, tmp_path):
    sets = [f"data.train={english_file}", *PRETRAIN]
    pre = run("pretrain", "bert-tiny", "--run-dir", tmp_path / "bert", *[a for s in sets for a in ("--set", s)])
    assert pre.exit_code == 0, pre.output
    run_dir = finetune(tmp_path, tmp_path / "bert", None)
    rows = {r["step"]: r for r in read_metrics(run_dir / "metrics.jsonl") if "val_loss" in r}
    recipe = yaml.safe_load((run_dir / "recipe.yaml").read_text())
    for folder in (run_dir / "checkpoints" / "step-4", run_dir / "best"):
        config = json.loads((folder / "config.json").read_text())
        card = card_of(folder)
        data = card.data.to_dict()
        assert data["pipeline_tag"] == "text-classification" and "tfkit" in data["tags"]
        assert data["datasets"] == [str(tmp_path / "labelled.csv")] and "license" not in data
        assert data["model-index"][0]["name"] == run_dir.name  # the run, not the recipe it was made with
        result = data["model-index"][0]["results"][0]
        scores = {m["type"]: m["value"] for m in result["metrics"]}
        row = rows[config["step"]]
        assert scores == {"accuracy": round(row["val_accuracy"], 4), "f1": round(row["val_macro_f1"], 4),
                          "matthews_correlation": round(row["val_matthews"], 4)}
        assert result["task"]["type"] == "text-classification" and result["dataset"]["split"] == "validation"
        text = card.text
        assert text.lstrip().startswith(f"# {run_dir.name}\n")
        labels = ", ".join(f"`{config['head']['id2label'][str(i)]}`" for i in range(3))
        assert f"3 classes: {labels}" in text
        assert f"fine-tuned from the weights of `{tmp_path / 'bert'}" in text
        assert f"Pretrained on `{english_file}`" in text and "- Steps: 3" in text  # the starting run's record
        assert "45 examples" in text and "15 examples" in text and "held out for validation" in text
        for section, key in (("optim", "lr"), ("optim", "weight_decay"), ("train", "batch_size")):
            assert f"{section}.{key} {recipe[section][key]}" in text
        assert f"- Steps: {config['step']}" in text and "- Precision: fp32" in text and "- Hardware: cpu" in text
        assert f"Validation at step {config['step']}" in text
        assert "tfkit predict" in text and "tfkit eval" in text
    assert not (run_dir / "checkpoints" / "step-2" / "README.md").exists()  # only what the run publishes
    resumed = run("finetune", run_dir / "recipe.yaml", "--run-dir", tmp_path / "resumed",
                  "--resume", run_dir / "checkpoints" / "step-2")
    assert resumed.exit_code == 0, resumed.output
    text = card_of(tmp_path / "resumed" / "checkpoints" / "step-4").text  # its start.log has only the resume's block
    assert "fine-tuned from the weights of" in text and "random weights" not in text


def test_a_random_init_control_names_no_base_model(tmp_path):
    tokenizer = tmp_path / "tokenizer"
    train_tokenizer(TokenizerSpec(kind="wordpiece", vocab_size=200, lowercase=True),
                    [f"word {i} thing yes no maybe" for i in range(100)], tokenizer, show_progress=False)
    run_dir = finetune(tmp_path, None, tokenizer)
    text = card_of(run_dir / "best").text
    assert "trained from random weights" in text
    for invented in ("fine-tuned from", "Starting checkpoint", "Pretrained on"):
        assert invented not in text
