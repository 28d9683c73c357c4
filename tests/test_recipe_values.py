"""Recipe values: every float key is finite and in its meaningful range; a warmup longer than the run warns."""

import typing

import pytest

from tfkit.errors import ConfigError
from tfkit.trainer.recipe import SECTIONS, Recipe, load_recipe
from tfkit.trainer.schedules import lr_at


def _float_keys() -> list[str]:
    """Every `section.key` annotated float or float | None, found from the dataclasses themselves so a float
    key added later is covered without editing this test."""
    keys = []
    for section in SECTIONS:
        for name, hint in typing.get_type_hints(typing.get_type_hints(Recipe)[section]).items():
            if hint is float or set(typing.get_args(hint)) == {float, type(None)}:
                keys.append(f"{section}.{name}")
    return keys


def _compound_float_keys() -> list[str]:
    """Keys that hold floats inside another type: a list of floats, or a duration that may be a number."""
    keys, plain = [], set(_float_keys())
    for section in SECTIONS:
        for name, hint in typing.get_type_hints(typing.get_type_hints(Recipe)[section]).items():
            if f"{section}.{name}" not in plain and "float" in str(hint):
                keys.append(f"{section}.{name}")
    return keys


def _message(overrides, tmp_path=None, text=None) -> str:
    source = "gpt-tiny"
    if text is not None:
        source = tmp_path / "r.yaml"
        source.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_recipe(str(source), overrides)
    return str(info.value)


def test_the_float_keys_are_found():
    assert {"model.norm_eps", "model.dropout", "tokenizer.max_train_mb", "data.valid_fraction",
            "objective.mask_prob", "optim.lr", "optim.eps", "optim.grad_clip", "schedule.min_lr"} <= set(_float_keys())


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
@pytest.mark.parametrize("key", _float_keys())
def test_every_float_key_rejects_nan_and_infinity(key, value):
    message = _message([f"{key}={value}"])
    assert f"overrides {key}={value}: {key}: got {value}, expected " in message


def test_the_compound_float_keys_are_found():
    assert set(_compound_float_keys()) == {"model.attn_scale", "objective.mask_replace", "train.max_time",
                                           "model.pad_fill"}


MINUS_INFINITY_MEANS = {"model.pad_fill"}  # -inf is the exact padding mask: the one key where it is a value


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", ".nan", ".inf", "-.inf"])
@pytest.mark.parametrize("key", _compound_float_keys())
def test_every_compound_float_key_rejects_nan_and_infinity(key, value):
    """Given alone (YAML reads `nan` as text, `.nan` as the float) or inside a list, a non-finite number is
    refused with a line naming the key (model.pad_fill: -inf, spelled either way, is its exact mask)."""
    for given in (value, f"[{value}, 0.1, 0.1]"):
        if key in MINUS_INFINITY_MEANS and given in ("-inf", "-.inf"):
            assert load_recipe("gpt-tiny", [f"{key}={given}"]).model.pad_fill == "-inf"
            continue
        message = _message([f"{key}={given}"])
        assert f"overrides {key}={given}: {key}: got " in message and "expected" in message


@pytest.mark.parametrize("override, expected", [
    ("optim.lr=0", "optim.lr: got 0.0, expected a positive finite number"),
    ("optim.eps=-1", "optim.eps: got -1.0, expected a positive finite number"),
    ("optim.weight_decay=-0.1", "optim.weight_decay: got -0.1, expected a finite number >= 0"),
    ("optim.beta1=1", "optim.beta1: got 1.0, expected 0 <= value < 1"),
    ("optim.beta2=-0.5", "optim.beta2: got -0.5, expected 0 <= value < 1"),
    ("optim.grad_clip=0", "optim.grad_clip: got 0.0, expected a positive finite number or null"),
    ("schedule.min_lr=-1e-5", "schedule.min_lr: got -1e-05, expected a finite number >= 0"),
    ("schedule.decay_fraction=0", "schedule.decay_fraction: got 0.0, expected 0 < value <= 1"),
    ("model.norm_eps=0", "model.norm_eps: got 0.0, expected a positive finite number"),
    ("model.rope_theta=-1", "model.rope_theta: got -1.0, expected a positive finite number"),
    ("model.init_std=0", "model.init_std: got 0.0, expected a positive finite number"),
    ("model.attn_dropout=1", "model.attn_dropout: got 1.0, expected 0 <= value < 1"),
    ("objective.mask_prob=1", "objective.mask_prob: got 1.0, expected 0 < value < 1"),
    ("objective.mask_prob=0", "objective.mask_prob: got 0.0, expected 0 < value < 1"),
    ("objective.label_smoothing=1", "objective.label_smoothing: got 1.0, expected 0 <= value < 1"),
    ("data.valid_fraction=0", "data.valid_fraction: got 0.0, expected 0 < value < 1"),
    ("tokenizer.max_train_mb=0", "tokenizer.max_train_mb: got 0.0, expected a positive finite number or null"),
])
def test_values_outside_their_range_are_rejected(override, expected):
    assert expected in _message([override])


def test_the_bounds_that_are_meaningful_are_accepted():
    recipe = load_recipe("gpt-tiny", ["optim.weight_decay=0", "optim.beta1=0", "optim.grad_clip=null",
                                      "schedule.min_lr=0", "schedule.decay_fraction=1", "model.dropout=0",
                                      "objective.label_smoothing=0", "tokenizer.max_train_mb=null"])
    assert (recipe.optim.weight_decay, recipe.optim.grad_clip, recipe.schedule.decay_fraction) == (0.0, None, 1.0)


def test_every_bad_value_in_a_file_is_reported_at_once(tmp_path):
    message = _message(None, tmp_path, "optim:\n  lr: .nan\n  eps: -1\nschedule:\n  min_lr: nan\n")
    assert message.startswith(f"{tmp_path / 'r.yaml'}: ")
    for part in ("optim.lr: got nan", "optim.eps: got -1.0", "schedule.min_lr: got nan"):
        assert part in message


def test_warmup_longer_than_the_run_is_a_warning_naming_both_keys():
    """A quick `--set train.max_steps=20` try of a recipe with a longer warmup must still run."""
    recipe = load_recipe("gpt-tiny", ["train.max_steps=20", "schedule.warmup_steps=50"])
    assert recipe.warnings() == ["schedule.warmup_steps: 50 exceeds train.max_steps=20, so the learning rate "
                                 "never reaches optim.lr"]
    # a warmup as long as the run still reaches the peak, on the last update
    recipe = load_recipe("gpt-tiny", ["train.max_steps=30", "schedule.warmup_steps=30", "schedule.name=constant"])
    assert lr_at(29, recipe.schedule, recipe.optim.lr, 30, recipe.model.d_model) == recipe.optim.lr


def test_a_floor_above_the_peak_is_rejected_where_the_schedule_decays():
    with pytest.raises(ConfigError, match=r"schedule.min_lr: 1 exceeds optim.lr=0.003, the peak it decays from"):
        load_recipe("gpt-tiny", ["schedule.min_lr=1"])
    assert load_recipe("gpt-tiny", ["schedule.min_lr=1", "schedule.name=constant"]).schedule.min_lr == 1.0


@pytest.mark.parametrize("value", ["90", "1.5", "0"])
def test_a_time_budget_without_a_unit_is_refused(value):
    """`train.max_time=90` could mean seconds or minutes: the unit is required."""
    message = _message([f"train.max_time={value}"])
    assert f"train.max_time: got {value} without a unit" in message and "90s, 3m or 1h30m" in message


@pytest.mark.parametrize("override, key", [("optim.lr=30", "optim.lr"), ("optim.lr=0.5", "optim.lr"),
                                           ("optim.muon_lr=2", "optim.muon_lr")])
def test_a_peak_learning_rate_that_diverges_warns(override, key):
    recipe = load_recipe("small-corpus", [override])  # AdamW and Muon
    assert [w for w in recipe.warnings() if w.startswith(f"{key}: a peak learning rate of")], recipe.warnings()


def test_no_bundled_recipe_warns_of_its_learning_rate():
    from tfkit.trainer.recipe import bundled_recipes

    for name in bundled_recipes():
        assert not [w for w in load_recipe(name).warnings() if "peak learning rate of" in w and "above" in w], name
