"""Every recipe key is documented where the code defines it, and `tfkit recipes keys` prints them; choices
that silently mean something else (noam's lr, post-norm at a high lr) are said when a recipe is shown."""

import pytest
from typer.testing import CliRunner

from tfkit.cli.main import app
from tfkit.trainer.recipe import bundled_recipes, load_recipe
from tfkit.trainer.recipe_keys import recipe_keys


def test_every_key_has_a_meaning_and_a_default():
    keys = recipe_keys()
    assert len({k.name for k in keys}) == len(keys) > 60
    assert [k.name for k in keys if not k.meaning] == []


def test_recipes_keys_prints_the_keys_a_comparison_needs_with_their_choices():
    result = CliRunner().invoke(app, ["recipes", "keys"])
    assert result.exit_code == 0, result.output
    lines = {line.split("│")[1].strip(): line for line in result.stdout.splitlines() if line.count("│") >= 4}
    for key, choice in [("model.attention", "naive"), ("model.norm", "rmsnorm"), ("model.norm_placement", "post"),
                        ("model.activation", "swiglu"), ("model.positions", "alibi"), ("model.rope_theta", "RoPE"),
                        ("schedule.decay_fraction", "wsd"), ("model.n_kv_heads", "MQA")]:
        assert choice in lines[key], lines.get(key)
    one = CliRunner().invoke(app, ["recipes", "keys", "optim"])
    assert one.exit_code == 0 and "optim.lr" in one.stdout and "model.d_model" not in one.stdout
    bad = CliRunner().invoke(app, ["recipes", "keys", "modle"])
    assert bad.exit_code == 2 and "section 'modle': expected one of model" in bad.stderr


def test_noam_says_that_lr_is_a_multiplier_and_what_the_peak_is():
    result = CliRunner().invoke(app, ["recipes", "show", "gpt-tiny", "--set", "schedule.name=noam", "--lr-points", "0"])
    assert result.exit_code == 0, result.output
    assert "noam uses optim.lr=0.003 as a multiplier" in result.stderr and "peaks at 4.84e-05" in result.stderr


def test_post_norm_at_a_high_peak_lr_is_warned_with_the_remedy():
    warnings = load_recipe("gpt-tiny", ["model.norm_placement=post"]).warnings()
    assert any("post-norm at a peak learning rate of 0.003" in w and "norm_placement=pre" in w for w in warnings)
    assert load_recipe("gpt-tiny", ["model.norm_placement=post", "optim.lr=1e-3"]).warnings() == []


@pytest.mark.parametrize("name", sorted(bundled_recipes()))
def test_bundled_recipes_warn_about_nothing(name):
    assert load_recipe(name).warnings() == []
