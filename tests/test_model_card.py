"""The README.md model card of `export-hf` folders (and `a.README.md` beside an export-gguf `a.gguf`):
huggingface_hub's card parser reads it, and every fact in it is one the run recorded (metrics.jsonl,
start.log, recipe.yaml, config.json), while a checkpoint without a run gets a card without them rather than guesses."""

import hashlib
import json
import re

import pytest
from typer.testing import CliRunner

from tfkit.checkpoints.run_record import read_metrics
from tfkit.checkpoints.weights import save_model
from tfkit.cli.main import app
from tfkit.models import ModelConfig, build_model
from tfkit.trainer.recipe import load_recipe
from tfkit.trainer.run import pretrain

huggingface_hub = pytest.importorskip("huggingface_hub")  # the test extra installs it (with transformers)

LLAMA = {"arch": "gpt", "d_model": 32, "n_layers": 1, "n_heads": 4, "n_kv_heads": 2, "max_seq_len": 32,
         "positions": "rope", "norm": "rmsnorm", "activation": "swiglu", "bias": False}


@pytest.fixture(scope="module")
def run_dir(english_text, tmp_path_factory):
    """A real 6-step run of a tiny Llama-layout model, validated at its last step."""
    root = tmp_path_factory.mktemp("card")
    (root / "train.txt").write_text(english_text[:40_000], encoding="utf-8")
    recipe = {
        "name": "card-test", "model": LLAMA, "tokenizer": {"kind": "bpe", "vocab_size": 300},
        "data": {"train": str(root / "train.txt"), "valid": None, "seq_len": 32},
        "train": {"max_steps": 6, "batch_size": 4, "log_every": 2, "eval_every": 3, "save_every": 100,
                  "device": "cpu", "seed": 7},
        "eval": {"batches": 1, "sample_prompt": None},
        "log": {"progress": False, "plot": False, "tensorboard": False},
    }
    (root / "r.yaml").write_text(json.dumps(recipe))
    pretrain(load_recipe(str(root / "r.yaml")), run_dir=root / "run")
    return root / "run"


def export(run_dir, out, *extra):
    result = CliRunner().invoke(app, ["export-hf", str(run_dir), "--out", str(out), *extra])
    assert result.exit_code == 0, result.output
    return (out / "README.md").read_text(encoding="utf-8")


def test_the_card_parses_and_states_what_the_run_recorded(run_dir, tmp_path):
    text = export(run_dir, tmp_path / "hf", "--license", "apache-2.0")
    card = huggingface_hub.ModelCard(text)
    data = card.data.to_dict()
    assert data["library_name"] == "transformers" and data["license"] == "apache-2.0"
    assert "tfkit" in data["tags"] and "llama" in data["tags"]
    train = str(run_dir.parent / "train.txt")
    assert data["datasets"] == [train]
    rows = read_metrics(run_dir / "metrics.jsonl")
    final = [r for r in rows if r["step"] == 6 and "val_loss" in r][-1]
    tokens = [r for r in rows if r["step"] == 6 and "tokens" in r and "loss" in r][-1]["tokens"]
    results = {r.metric_type: r for r in card.data.eval_results}
    assert results["loss"].metric_value == round(final["val_loss"], 4)
    assert results["perplexity"].metric_value == round(final["val_ppl"], 2)
    assert results["accuracy"].metric_value == round(final["val_accuracy"], 4)
    assert results["loss"].task_type == "text-generation" and "held out" in results["loss"].dataset_name
    start = (run_dir / "start.log").read_text()
    corpus_tokens = int(re.search(r"data: ([\d,]+) training tokens", start)[1].replace(",", ""))
    recipe_sha = hashlib.sha256((run_dir / "recipe.yaml").read_bytes()).hexdigest()
    params = build_model(ModelConfig(**{**LLAMA, "vocab_size": 300})).num_params()
    for fact in (f"Corpus: `{train}`, {corpus_tokens:,} tokens; {tokens / corpus_tokens:.3g} epochs seen",
                 f"`{recipe_sha[:16]}`), seed 7", "Steps: 6", f"Tokens: {tokens:,} by step 6", "Precision: fp32",
                 "Hardware: cpu, 1 CPU thread", f"Parameters: {params:,}", "4 query heads / 2 key-value heads (GQA)",
                 "byte-level BPE, 300 tokens", f"loss {final['val_loss']:.4f} nats / token",
                 "AutoModelForCausalLM.from_pretrained"):
        assert fact in text, fact


def test_without_a_license_the_card_names_none_and_the_export_force_replaces_it(run_dir, tmp_path):
    export(run_dir, tmp_path / "hf", "--license", "mit")
    text = export(run_dir, tmp_path / "hf", "--force")  # an export with its README.md is still an export
    assert "license" not in huggingface_hub.ModelCard(text).data.to_dict()


def test_a_checkpoint_without_a_run_gets_no_invented_facts(tmp_path):
    cfg = ModelConfig(**{**LLAMA, "vocab_size": 300})
    save_model(build_model(cfg), tmp_path / "bare")
    text = export(tmp_path / "bare", tmp_path / "hf")
    data = huggingface_hub.ModelCard(text).data.to_dict()
    assert "datasets" not in data and "model-index" not in data and "license" not in data
    for absent in ("## Training", "## Evaluation", "## Tokenizer", "Steps:", "seed", "Corpus"):
        assert absent not in text
    assert f"Parameters: {build_model(cfg).num_params():,}" in text


def test_a_converted_checkpoint_says_what_it_went_through(run_dir, tmp_path):
    result = CliRunner().invoke(app, ["convert-mqa-to-gqa", str(run_dir), "--kv-heads", "1", "--out",
                                      str(tmp_path / "mqa")])
    assert result.exit_code == 0, result.output
    text = export(tmp_path / "mqa", tmp_path / "hf")
    assert "Regrouped from 2 to 1 key/value heads (method `mean`)" in text and "(MQA)" in text
    assert "## Training (of the model it was converted from)" in text and "Steps: 6\n" in text
    assert "seed 7" in text and "## Evaluation" not in text  # the source's validation is not this model's
    assert huggingface_hub.ModelCard(text).data.to_dict()["datasets"] == [str(run_dir.parent / "train.txt")]


def test_an_uptrained_run_says_where_its_weights_started_and_their_steps(run_dir, tmp_path):
    source = run_dir / "checkpoints" / "step-6"
    recipe = json.loads((run_dir.parent / "r.yaml").read_text())
    recipe["train"] = {**recipe["train"], "max_steps": 2, "eval_every": 2, "init_from": str(source)}
    (tmp_path / "up.yaml").write_text(json.dumps(recipe))
    pretrain(load_recipe(str(tmp_path / "up.yaml")), run_dir=tmp_path / "up")
    text = export(tmp_path / "up", tmp_path / "hf")
    assert "Steps: 2 (after 6 steps of the weights it started from)" in text
    assert f"Trained on (uptrained) from the weights of `{source}`" in text
