"""`tfkit eval CKPT --set model.KEY=VALUE`: a checkpoint scored under another setting that keeps its weights.

The reference for each allowed override is the model built with that setting from the start and given the
checkpoint's tensors; a key that would add, drop or reshape a tensor is refused in one line, exit code 2.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from tfkit.checkpoints.weights import load_model, save_model
from tfkit.cli.main import app
from tfkit.errors import ConfigError
from tfkit.evaluation.evaluate import EvalRequest, evaluate
from tfkit.evaluation.model_overrides import with_model_overrides
from tfkit.models import ModelConfig, build_model
from tfkit.tokenization import TokenizerSpec, load_tokenizer, train_tokenizer

TEXT = ("A small corpus for a small model: the quick brown fox jumps over the lazy dog, and five wizards box "
        "nightly while the jay quickly vexes them. ") * 60


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> tuple[Path, Path]:
    """A random tiny GPT (rope, so positions can switch scheme without weights) with its tokenizer."""
    root = tmp_path_factory.mktemp("ckpt")
    train_tokenizer(TokenizerSpec(kind="bpe", vocab_size=300), [TEXT], root / "tok", show_progress=False)
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=load_tokenizer(root / "tok").vocab_size, d_model=32, n_layers=2, n_heads=4,
                      max_seq_len=64, positions="rope", init_std=0.2)
    save_model(build_model(cfg), root / "model")
    for file in (root / "tok").iterdir():
        shutil.copy(file, root / "model" / file.name)
    data = root / "valid.txt"
    data.write_text(TEXT[:3000], encoding="utf-8")
    return root / "model", data


def score(checkpoint, data, overrides=None) -> dict:
    return evaluate(checkpoint, str(data), EvalRequest(batch_size=4, seq_len=32, max_batches=2, show_progress=False,
                                                       cache_dir=data.parent / "cache", overrides=tuple(overrides or ())))


@pytest.mark.parametrize("overrides", [["model.attention=naive"], ["model.attn_scale=none"],
                                       ["model.attn_scale=0.25", "model.attention=naive"], ["model.positions=none"]])
def test_an_override_computes_what_the_model_built_with_it_computes(checkpoint, overrides):
    folder, _ = checkpoint
    model, cfg = load_model(folder)
    changed, new_cfg = with_model_overrides(model, cfg, overrides)
    values = dict(item.removeprefix("model.").split("=") for item in overrides)
    reference = build_model(ModelConfig.from_dict({**cfg.to_dict(), **{
        k: (float(v) if v[0].isdigit() else v) for k, v in values.items()}})).eval()
    reference.load_state_dict(model.state_dict())
    assert all(str(getattr(new_cfg, k)) == v for k, v in values.items())
    ids = torch.randint(0, cfg.vocab_size, (2, 20), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(changed(ids), reference(ids))
        assert changed.embed.tok.weight.data_ptr() == model.embed.tok.weight.data_ptr()  # the same tensors


def test_eval_scores_under_the_override_and_records_it(checkpoint):
    folder, data = checkpoint
    plain, naive, unscaled = (score(folder, data, o) for o in (None, ["model.attention=naive"],
                                                                 ["model.attn_scale=none"]))
    assert plain["set"] == [] and naive["set"] == ["model.attention=naive"]
    assert naive["data_fingerprint"] == plain["data_fingerprint"]
    assert math.isclose(naive["loss"], plain["loss"], rel_tol=1e-5)  # the same function, another path
    assert abs(unscaled["loss"] - plain["loss"]) > 1e-3  # another function of the same weights


@pytest.mark.parametrize("item, named", [
    ("model.n_layers=3", "--set model.n_layers=3: model.n_layers=3 changes the model's weights (it needs blocks.2."),
    ("model.positions=learned", "model.positions=learned changes the model's weights (it needs embed.pos.weight"),
    ("model.norm=batchnorm", "model.norm=batchnorm changes the model's weights"),
    ("model.d_model=64", "model.d_model=64 changes the model's weights"),
    ("model.attn_scale=-2", "model.attn_scale: got -2.0, expected sqrt_d, none or a positive finite number"),
    ("model.atention=naive", "model.atention is not a model key"),
    ("train.max_steps=3", "expected model.KEY=VALUE"),
])
def test_a_key_that_changes_the_weights_or_a_bad_value_is_refused_by_name(checkpoint, item, named):
    folder, data = checkpoint
    with pytest.raises(ConfigError) as err:
        score(folder, data, [item])
    assert named.replace("--set ", "overrides ") in str(err.value)  # the library names its parameter
    result = CliRunner().invoke(app, ["eval", str(folder), "--data", str(data), "--seq-len", "32",
                                      "--max-batches", "1", "--set", item])
    assert result.exit_code == 2 and named in result.stderr and "Traceback" not in result.output
    assert len(result.stderr.strip().splitlines()) <= 3  # one message (a terminal may wrap it)


def test_the_cli_takes_repeated_overrides_and_writes_them_to_json(checkpoint, tmp_path):
    folder, data = checkpoint
    out = tmp_path / "results.json"
    result = CliRunner().invoke(app, ["eval", str(folder), "--data", str(data), "--seq-len", "32", "--max-batches",
                                      "1", "--set", "model.attention=naive", "--set", "model.attn_scale=0.5",
                                      "--json", str(out)])
    assert result.exit_code == 0, result.output
    (row,) = json.loads(out.read_text())
    assert row["set"] == ["model.attention=naive", "model.attn_scale=0.5"]


def test_a_rope_model_is_scored_past_its_trained_length_under_rope_scaling(checkpoint):
    folder, data = checkpoint
    longer = ["model.max_seq_len=256", "model.rope_scaling=yarn", "model.rope_factor=4"]
    args = ["eval", str(folder), "--data", str(data), "--seq-len", "256", "--max-batches", "1", "--batch-size", "1"]
    result = CliRunner().invoke(app, args + [a for o in longer for a in ("--set", o)])
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output
