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
    assert {"quickstart", "gpt-tiny", "bert-tiny", "transformer-tiny", "gpt2-small", "bert-base", "llama-tiny"} <= set(
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
    recipe = load_recipe(path, ["train.max_steps=20", "schedule.warmup_steps=5", "model.n_kv_heads=2",
                                "optim.lr=3e-4", "data.valid=null"])
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

    recipe = load_recipe("gpt-tiny", ["train.max_steps=7", "schedule.warmup_steps=2"])
    again = recipe_from_dict(yaml.safe_load(recipe.to_yaml()))
    assert again == recipe


def test_problems_caused_by_set_name_the_override_and_the_rest_name_the_file(tmp_path):
    path = _write(tmp_path, "train:\n  max_step: 10\n")
    message = str(pytest.raises(ConfigError, load_recipe, path, ["optim.lr=-1", "model.n_layers=2"]).value)
    assert message == (f"{path}: train.max_step: unknown key (did you mean 'max_steps'?); "
                       "overrides optim.lr=-1: optim.lr: got -1.0, expected a positive finite number")
    only_set = str(pytest.raises(ConfigError, load_recipe, "gpt-tiny", ["optim.lr=-1"]).value)
    assert only_set == "overrides optim.lr=-1: optim.lr: got -1.0, expected a positive finite number"
    # a combination problem is blamed on the override that created it, and the last override of a key counts
    across = str(pytest.raises(ConfigError, load_recipe, "gpt-tiny",
                               ["model.max_seq_len=100", "model.max_seq_len=64"]).value)
    assert across.startswith("overrides model.max_seq_len=64: data.seq_len: 128 exceeds model.max_seq_len=64")
    with pytest.raises(ConfigError, match=r"^overrides optm\.lr=1: unknown section 'optm' \(did you mean 'optim'\?\)$"):
        load_recipe("gpt-tiny", ["optm.lr=1"])


@pytest.mark.parametrize("text, expected", [
    ("ROMEO:", "ROMEO:"),  # YAML would read a mapping
    ("123", "123"),  # an integer
    ("true", "true"),
    ("[a, b]", "[a, b]"),
    ("#hash", "#hash"),  # a YAML comment, not a null
    ("'quoted: yes'", "quoted: yes"),  # quotes that reach tfkit still work
    ("null", None),  # the key allows null
    ("~", None),
])
def test_text_keys_take_set_values_literally(text, expected):
    assert load_recipe("gpt-tiny", [f"eval.sample_prompt={text}"]).eval.sample_prompt == expected


def test_a_key_that_cannot_be_null_takes_null_as_text_and_other_keys_stay_typed():
    recipe = load_recipe("gpt-tiny", ["data.text_field=null", "train.max_steps=40", "eval.batch_size=null"])
    assert (recipe.data.text_field, recipe.train.max_steps, recipe.eval.batch_size) == ("null", 40, None)


def test_validate_checks_every_file_and_exits_2_if_any_failed(tmp_path):
    from typer.testing import CliRunner

    from tfkit.cli.main import app

    bad = _write(tmp_path, "optim:\n  lr: .nan\n")
    result = CliRunner().invoke(app, ["recipes", "validate", "gpt-tiny", bad, "bert-tiny", "no-such-recipe"])
    assert result.exit_code == 2
    assert result.stdout.splitlines() == ["ok gpt-tiny", "ok bert-tiny"]
    errors = result.stderr.splitlines()
    assert errors[0] == f"error: {bad}: optim.lr: got nan, expected a positive finite number"
    assert errors[1].startswith("error: recipe 'no-such-recipe': no such file") and len(errors) == 2
    # a --set problem says which of the files it broke
    result = CliRunner().invoke(app, ["recipes", "validate", "gpt-tiny", "bert-tiny", "--set", "model.max_seq_len=64"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert result.stderr.splitlines()[0].startswith("error: gpt-tiny: --set model.max_seq_len=64: data.seq_len")
    assert CliRunner().invoke(app, ["recipes", "validate", "gpt-tiny", "bert-tiny"]).exit_code == 0
    # a warmup longer than the run is legal (quick tries), with a warning per file
    result = CliRunner().invoke(app, ["recipes", "validate", "gpt-tiny", "--set", "train.max_steps=20"])
    assert result.exit_code == 0 and result.stdout.splitlines() == ["ok gpt-tiny"]
    assert result.stderr.startswith("warning: schedule.warmup_steps: 30 exceeds train.max_steps=20")


def test_pretrain_rejects_a_nan_learning_rate_before_training():
    from typer.testing import CliRunner

    from tfkit.cli.main import app

    result = CliRunner().invoke(app, ["pretrain", "gpt-tiny", "--set", "optim.lr=nan"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert result.stderr.strip() == "error: --set optim.lr=nan: optim.lr: got nan, expected a positive finite number"


def test_show_writes_a_recipe_that_loads_and_the_lr_curve_to_stderr(tmp_path):
    """`tfkit recipes show NAME --set ... > my.yaml` is a resolved recipe to edit and run."""
    from typer.testing import CliRunner

    from tfkit.cli.main import app

    result = CliRunner().invoke(app, ["recipes", "show", "gpt-tiny", "--set", "optim.lr=0.001"])
    assert result.exit_code == 0, result.output
    (tmp_path / "my.yaml").write_text(result.stdout)
    assert load_recipe(str(tmp_path / "my.yaml")).optim.lr == 0.001
    assert "learning rate (cosine)" in result.stderr and "learning rate" not in result.stdout


def test_a_bad_arch_is_reported_once():
    message = str(pytest.raises(ConfigError, load_recipe, "gpt-tiny", ["model.arch=xyz"]).value)
    assert message == "overrides model.arch=xyz: model.arch: got 'xyz', expected one of bert, gpt, transformer"


def test_an_unreadable_empty_or_folder_recipe_is_one_error_naming_it(tmp_path):
    """Not UTF-8, empty or comment-only (a truncated file would otherwise train 1000 default steps), a
    folder: each is a ConfigError naming the path; `validate` reports it and goes on to the next file."""
    from typer.testing import CliRunner

    from tfkit.cli.main import app

    latin = tmp_path / "latin.yaml"
    latin.write_bytes(b"model:\n  arch: gpt\n# caf\xe9\n")
    with pytest.raises(ConfigError, match=rf"{latin}: not valid UTF-8 \(byte 0xe9 at position 24\)"):
        load_recipe(str(latin))
    for text in ("", "# nothing yet\n"):
        with pytest.raises(ConfigError, match=r"r\.yaml: empty recipe, no sections"):
            load_recipe(_write(tmp_path, text))
    with pytest.raises(ConfigError, match=rf"recipe {tmp_path}: is a folder, expected a YAML file"):
        load_recipe(str(tmp_path))
    result = CliRunner().invoke(app, ["recipes", "validate", str(latin), "gpt-tiny"])
    assert result.exit_code == 2 and result.stdout.splitlines() == ["ok gpt-tiny"]
    assert result.stderr.startswith(f"error: {latin}: not valid UTF-8")


def test_home_in_path_keys_is_the_home_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    recipe = load_recipe("gpt-tiny", ["log.run_dir=~/runs/x", "tokenizer.path=~/tok", "train.init_from=~/ckpt",
                                      "data.cache_dir=~/cache"])
    assert recipe.log.run_dir == str(tmp_path / "runs" / "x") and recipe.tokenizer.path == str(tmp_path / "tok")
    assert recipe.train.init_from == str(tmp_path / "ckpt") and recipe.data.cache_dir == str(tmp_path / "cache")
