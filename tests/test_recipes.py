"""Recipes: strict loading, every problem at once, typed overrides, and every bundled recipe validates."""

import pytest

from tfkit.errors import ConfigError
from tfkit.trainer.recipe import Recipe, bundled_recipes, find_recipe, load_recipe, recipe_from_dict


def _write(tmp_path, text: str):
    path = tmp_path / "r.yaml"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("name", sorted(bundled_recipes()))
def test_every_bundled_recipe_validates(name):
    recipe = load_recipe(name)
    assert isinstance(recipe, Recipe)
    assert recipe.name == name


def test_bundled_recipes_include_the_documented_ones():
    assert {"quickstart", "gpt-tiny", "bert-tiny", "transformer-tiny", "gpt2-small", "bert-base"} <= set(
        bundled_recipes()
    )


def test_every_key_of_every_bundled_recipe_has_a_comment():
    for name, path in bundled_recipes().items():
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if ":" in line and line.startswith("  ") and not line.lstrip().startswith("#"):
                assert "#" in line, f"{name}.yaml:{number} has no comment: {line!r}"


def test_unknown_key_is_reported_with_a_suggestion(tmp_path):
    path = _write(tmp_path, "train:\n  max_step: 10\n")
    with pytest.raises(ConfigError, match=r"train\.max_step: unknown key \(did you mean 'max_steps'\?\)"):
        load_recipe(path)


def test_every_problem_is_reported_at_once(tmp_path):
    path = _write(tmp_path, "model:\n  n_heads: 4\n  n_kv_heads: 3\n  attention: fast\ntrain:\n  batch_size: ten\n")
    with pytest.raises(ConfigError) as info:
        load_recipe(path)
    message = str(info.value)
    assert "train.batch_size: got 'ten', expected an integer" in message
    assert "model.attention: got 'fast'" in message
    # type errors are reported before combination checks, which need well-typed values
    path = _write(tmp_path, "model:\n  n_heads: 4\n  n_kv_heads: 3\n  attention: fast\n")
    message = str(pytest.raises(ConfigError, load_recipe, path).value)
    assert "model.n_kv_heads" in message and "model.attention" in message


def test_objective_must_match_the_architecture(tmp_path):
    path = _write(tmp_path, "model:\n  arch: gpt\nobjective:\n  name: mlm\n")
    with pytest.raises(ConfigError, match="objective.name: 'mlm' does not train model.arch='gpt'"):
        load_recipe(path)


def test_overrides_are_typed_and_validated(tmp_path):
    path = _write(tmp_path, "train:\n  max_steps: 100\n")
    recipe = load_recipe(path, ["train.max_steps=20", "model.n_kv_heads=2", "optim.lr=3e-4", "data.valid=null"])
    assert recipe.train.max_steps == 20
    assert recipe.model.n_kv_heads == 2
    assert recipe.optim.lr == 3e-4
    assert recipe.data.valid is None
    with pytest.raises(ConfigError, match="expected SECTION.KEY=VALUE"):
        load_recipe(path, ["max_steps"])
    with pytest.raises(ConfigError, match="train.max_steps: got 'many'"):
        load_recipe(path, ["train.max_steps=many"])


def test_floats_written_without_a_dot_are_numbers(tmp_path):
    recipe = load_recipe(_write(tmp_path, "optim:\n  lr: 3e-4\n  weight_decay: 0\n"))
    assert recipe.optim.lr == 3e-4 and isinstance(recipe.optim.weight_decay, float)


def test_size_fills_unset_keys_and_explicit_keys_win(tmp_path):
    recipe = load_recipe(_write(tmp_path, "model:\n  arch: gpt\n  size: small\n  n_kv_heads: 4\n"))
    assert (recipe.model.d_model, recipe.model.n_layers, recipe.model.n_heads) == (768, 12, 12)
    assert recipe.model.n_kv_heads == 4
    assert recipe.model.vocab_size is None  # taken from the tokenizer
    with pytest.raises(ConfigError, match="model.size"):
        load_recipe(_write(tmp_path, "model:\n  size: enormous\n"))


def test_unknown_recipe_name_lists_the_bundled_ones():
    with pytest.raises(ConfigError, match=r"recipe 'gpt-tinyy'.*did you mean 'gpt-tiny'.*bundled:"):
        find_recipe("gpt-tinyy")


def test_yaml_syntax_error_names_the_file_and_line(tmp_path):
    path = _write(tmp_path, "train:\n  max_steps: [1,\n")
    with pytest.raises(ConfigError, match=r"r\.yaml line \d+: not valid YAML"):
        load_recipe(path)


def test_resolved_recipe_round_trips_through_yaml():
    import yaml

    recipe = load_recipe("gpt-tiny", ["train.max_steps=7"])
    again = recipe_from_dict(yaml.safe_load(recipe.to_yaml()))
    assert again == recipe
