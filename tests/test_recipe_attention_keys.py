"""The packing and attention keys of recipes: combinations no path can honour are refused at validation,
one line naming the key, exit code 2."""

import pytest
from typer.testing import CliRunner

from tfkit.cli.main import app
from tfkit.errors import ConfigError
from tfkit.trainer.recipe import load_recipe

REFUSED = [
    ("transformer-tiny", ["data.document_mask=true"], "data.document_mask: seq2seq rows are single pairs"),
    ("gpt-tiny", ["data.reset_positions=true"], "data.reset_positions: needs data.document_mask: true"),
    ("gpt-tiny", ["model.window=512"], "model.window: got 512, expected 1 <= window <= model.max_seq_len=256"),
    ("gpt-tiny", ["model.global_every=2"], "model.global_every: got 2 without model.window"),
    ("bert-tiny", ["model.qk_norm=true", "model.norm=batchnorm"], "model.qk_norm: normalises each head"),
    ("gpt-tiny", ["model.rope_scaling=linear", "model.rope_factor=2"],
     "model.rope_scaling: linear scales RoPE, but model.positions is learned"),
]


@pytest.mark.parametrize("recipe, overrides, expected", REFUSED, ids=[r[2].split(":")[0] for r in REFUSED])
def test_combinations_no_path_honours_are_refused_naming_the_key(recipe, overrides, expected):
    with pytest.raises(ConfigError, match=expected):
        load_recipe(recipe, overrides)


@pytest.mark.parametrize("recipe, overrides, expected", REFUSED[:1] + REFUSED[2:3] + REFUSED[-1:])
def test_the_cli_gives_one_line_and_exit_code_2(recipe, overrides, expected):
    args = ["recipes", "validate", recipe] + [a for o in overrides for a in ("--set", o)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and expected in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("recipe", ["gpt-tiny", "bert-tiny"])
def test_document_masks_validate_for_clm_and_mlm(recipe):
    r = load_recipe(recipe, ["data.document_mask=true", "data.reset_positions=true"])
    assert r.data.document_mask and r.data.reset_positions
