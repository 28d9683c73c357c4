"""The bundled llama-tiny recipe is the GQA model that leaves tfkit: pretrained a few steps and exported,
it loads in transformers as a Llama with grouped K/V and computes tfkit's logits."""

from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from tfkit.checkpoints.weights import load_model
from tfkit.cli.main import app

transformers = pytest.importorskip("transformers")

FEW_STEPS = ["train.max_steps=3", "train.batch_size=4", "data.seq_len=32", "schedule.warmup_steps=1",
             "train.log_every=1", "eval.batches=1", "eval.sample_prompt=null", "tokenizer.vocab_size=400",
             "train.device=cpu", "train.precision=fp32", "log.progress=false", "log.plot=false",
             "log.tensorboard=false"]


def test_llama_tiny_pretrains_and_exports_with_gqa_and_the_same_logits(english_file: Path, tmp_path: Path):
    run, hf_dir = tmp_path / "run", tmp_path / "hf"
    sets = [arg for s in [*FEW_STEPS, f"data.train={english_file}"] for arg in ("--set", s)]
    result = CliRunner().invoke(app, ["pretrain", "llama-tiny", "--run-dir", str(run), *sets])
    assert result.exit_code == 0, result.output
    result = CliRunner().invoke(app, ["export-hf", str(run), "--out", str(hf_dir)])
    assert result.exit_code == 0, result.output

    ours, cfg = load_model(run)
    assert (cfg.n_heads, cfg.kv_heads) == (4, 2)  # grouped K/V, as the recipe says
    hf, info = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    assert type(hf).__name__ == "LlamaForCausalLM" and hf.config.num_key_value_heads == 2
    ids = torch.randint(0, cfg.vocab_size, (2, 24), generator=torch.Generator().manual_seed(0))  # (B, T)
    with torch.no_grad():
        torch.testing.assert_close(hf.eval()(ids).logits, ours.eval()(ids), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("recipe", ["gpt-tiny", "bert-tiny"])
def test_grouped_kv_that_cannot_export_says_what_does(recipe: str):
    """The refusal names two ways out, and each one exports: the checkpoint regrouped to MHA, and (for a
    decoder only: no HF encoder groups K/V) a model trained with the recipe keys it prints."""
    from tfkit.checkpoints.hf_state import export_family
    from tfkit.errors import ConfigError
    from tfkit.trainer.recipe import load_recipe

    cfg = load_recipe(recipe, ["model.n_kv_heads=2"]).model.config(400)
    with pytest.raises(ConfigError) as err:
        export_family(cfg)
    message = str(err.value)
    assert f"convert-mqa-to-gqa CHECKPOINT --kv-heads {cfg.n_heads} " in message
    assert export_family(load_recipe(recipe).model.config(400))  # the same model with MHA exports
    llama = message.partition("train one with ")[2].partition(" (the llama-tiny recipe)")[0]
    sets = llama.split()  # model.positions=rope model.norm=rmsnorm ...
    if recipe == "bert-tiny":
        assert not sets and "Llama" not in message, message
    else:
        assert export_family(load_recipe(recipe, ["model.n_kv_heads=2", *sets]).model.config(400)) == "llama"
