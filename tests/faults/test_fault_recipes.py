"""Bad recipes: every key with a value of the wrong type, values out of range, sizes no library or machine
takes, and damaged or hostile YAML. Each is one line naming the key (or file) and what was expected,
exit code 2, and leaves nothing behind: `pretrain` of a bad recipe makes no run folder."""

from __future__ import annotations

import json
import math

import pytest
import yaml
from fault_helpers import assert_one_line_error, cli, snapshot

from tfkit.trainer.recipe import SECTIONS, Recipe, _hints

BASE = {
    "model": {"arch": "gpt", "d_model": 32, "n_layers": 2, "n_heads": 4, "max_seq_len": 64},
    "tokenizer": {"kind": "bpe", "vocab_size": 400},
    "data": {"train": "stdlib:docs:valid", "valid": None, "valid_fraction": 0.1, "seq_len": 32},
    "train": {"max_steps": 2, "batch_size": 8, "device": "cpu"},
    "log": {"progress": False, "plot": False, "tensorboard": False},
}


def _wrong_values(hint) -> list:
    """Values of the wrong type for a key annotated `hint`: a mapping and a nested list fit no key; a
    word fits no number or boolean."""
    values = [{"x": 1}, [[1]]]
    text = str(hint)
    if "str" not in text:
        if "bool" in text:
            values.append("maybe")
        elif "int" in text or "float" in text:
            values.append("ten")
    return values


TYPE_CASES = [(section, key, value)
              for section in SECTIONS
              for key, hint in _hints(_hints(Recipe)[section]).items()
              for value in _wrong_values(hint)]


def _recipe_file(folder, section: str | None = None, key: str | None = None, value=None, text: str | None = None):
    path = folder / "bad.yaml"
    if text is None:
        recipe = json.loads(json.dumps(BASE))
        if section is not None:
            recipe.setdefault(section, {})[key] = value
        text = yaml.safe_dump(recipe)  # NaN and inf as YAML spells them
    path.write_bytes(text.encode("utf-8") if isinstance(text, str) else text)
    return path


def test_a_value_of_the_wrong_type_names_the_key(tmp_path):
    """Every key of every section with every value of the wrong type for it (TYPE_CASES, one case per key and
    value): one line naming the key and what was expected. One test walks the whole table (as ~300
    parametrized tests, each case's setup and report cost more than the case) and reports every case that
    fails, each naming its key and value, in one message."""
    failures = []
    for section, key, value in TYPE_CASES:
        path = _recipe_file(tmp_path, section, key, value)
        try:
            assert_one_line_error(cli(["recipes", "validate", path]), f"{section}.{key}", "expected")
        except AssertionError as exc:
            failures.append(f"{section}.{key} = {value!r}: {str(exc).splitlines()[0][:300]}")
    if failures:
        pytest.fail(f"{len(failures)} of {len(TYPE_CASES)} wrong-type cases failed:\n" + "\n".join(failures))


RANGE_CASES = [
    *[("train", key, bad) for key in ("max_steps", "batch_size", "grad_accum", "log_every", "eval_every",
                                       "save_every", "keep_last", "max_bad_steps") for bad in (0, -1)],
    *[("model", key, 0) for key in ("d_model", "n_layers", "n_heads", "max_seq_len")],
    ("model", "vocab_size", -1),
    ("model", "dropout", 1.0), ("model", "dropout", -0.1), ("model", "attn_dropout", 1.5),
    ("model", "dropout", math.nan), ("model", "init_std", 0), ("model", "norm_eps", -1),
    ("optim", "lr", 0), ("optim", "lr", -1), ("optim", "lr", math.nan), ("optim", "lr", math.inf),
    ("optim", "weight_decay", -1), ("optim", "beta1", 1.0), ("optim", "beta2", -0.1), ("optim", "eps", 0),
    ("optim", "grad_clip", 0),
    ("data", "valid_fraction", 0), ("data", "valid_fraction", 1.0), ("data", "seq_len", 0),
    ("data", "seq_len", 1000),
    ("eval", "batches", 0), ("eval", "batch_size", 0),
    ("tokenizer", "vocab_size", 0), ("tokenizer", "vocab_size", 99_999_999_999),
    ("train", "seed", -1), ("train", "seed", 2**64), ("train", "seed", 2**70),
    ("train", "threads", 0), ("train", "threads", 100_000), ("train", "precision", "fp8"),
    ("train", "device", "tpu"), ("schedule", "name", "exp"), ("model", "arch", "rnn"),
    ("model", "positions", "spiral"), ("model", "n_kv_heads", 3),
    ("model", "vocab_size", 3_000_000_000), ("model", "d_model", 131_072), ("model", "n_layers", 1_000_000),
    ("model", "max_seq_len", 2**40),
]


@pytest.mark.parametrize(("section", "key", "value"), RANGE_CASES,
                         ids=[f"range-{s}.{k}={v}" for s, k, v in RANGE_CASES])
def test_a_value_out_of_range_names_the_key_and_leaves_nothing(section, key, value, in_tmp):
    path = _recipe_file(in_tmp, section, key, value)
    before = snapshot(in_tmp)
    line = assert_one_line_error(cli(["recipes", "validate", path]), f"{section}.{key}")
    assert any(word in line for word in ("expected", "need about", "exceeds", "divisible", "must"))
    assert_one_line_error(cli(["pretrain", path]), f"{section}.{key}")
    assert snapshot(in_tmp) == before, "a refused recipe left files behind"


def _bomb(levels: int) -> str:
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]")
    return "\n".join(lines) + f"\nmodel:\n  d_model: *a{levels - 1}\n"


YAML_CASES = {
    "alias bomb 9^7": (_bomb(7), "aliases expand"),
    "alias bomb 9^8": (_bomb(8), "aliases expand"),
    "alias bomb in a known key": ("x: &x [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]\n" + "\n".join(
        f"y{i}: &y{i} [" + ", ".join([f"*{'x' if i == 0 else f'y{i - 1}'}"] * 10) + "]" for i in range(6))
        + "\ntrain:\n  seed: *y5\n", "aliases expand"),
    "python object tag": ("model: !!python/object/apply:os.system ['echo pwned']\n", "not valid YAML"),
    "python name tag": ("model: !!python/name:os.system\n", "not valid YAML"),
    "syntax error": ("model: [1,\n", "not valid YAML"),
    "tab indentation": ("model:\n\tarch: gpt\n", "not valid YAML"),
    "a list, not a mapping": ("- model\n- train\n", "expected a mapping of sections"),
    "a scalar": ("42\n", "expected a mapping of sections"),
    "empty file": ("", "empty recipe"),
    "comments only": ("# nothing\n", "empty recipe"),
    "invalid utf-8": (b"model:\n  arch: \xff\xfe\n", "not valid UTF-8"),
    "section not a mapping": ("model: 5\n", "model: expected a mapping"),
    "unknown section": ("modle:\n  arch: gpt\n", "unknown section 'modle'"),
    "unknown key": ("train:\n  max_step: 5\n", "train.max_step: unknown key"),
    "null byte": ("model:\n  arch: g\x00pt\n", "bad.yaml"),
    "huge line": ("model:\n  arch: " + "x" * 2_000_000 + "\n", "model.arch"),
    "deep nesting": ("model: " + "[" * 5000 + "]" * 5000 + "\n", "bad.yaml"),
    "nesting past the depth limit": ("model: " + "[" * 150 + "]" * 150 + "\n", "nest more than 100 levels deep"),
}


@pytest.mark.parametrize("case", sorted(YAML_CASES), ids=[f"yaml-{c}" for c in sorted(YAML_CASES)])
def test_damaged_or_hostile_yaml_is_refused_in_one_line(case, in_tmp):
    """Refused, not expanded or parsed to the end: an alias bomb that expanded would exhaust memory, and
    values nested past the depth limit are refused by their depth. (No wall-clock bound: a shared machine
    makes one fail for nothing; the refusal itself is the behaviour.)"""
    text, expected = YAML_CASES[case]
    path = _recipe_file(in_tmp, text=text)
    before = snapshot(in_tmp)
    assert_one_line_error(cli(["recipes", "validate", path]), expected)
    assert_one_line_error(cli(["pretrain", path]), expected)
    assert snapshot(in_tmp) == before


SET_CASES = {
    "no equals sign": (["train.max_steps"], "expected SECTION.KEY=VALUE"),
    "no section": (["max_steps=5"], "expected SECTION.KEY=VALUE"),
    "three parts": (["train.max.steps=5"], "expected SECTION.KEY=VALUE"),
    "unknown section": (["trian.max_steps=5"], "unknown section 'trian'"),
    "unknown key": (["train.max_stepz=5"], "train.max_stepz"),
    "wrong type": (["train.max_steps=many"], "train.max_steps"),
    "out of range": (["train.batch_size=0"], "train.batch_size"),
    "seed too large": (["train.seed=99999999999999999999999"], "train.seed"),
    "alias bomb": (["model.d_model=" + _bomb(6).split("model:")[0].replace("\n", ", ")], "model.d_model"),
}


@pytest.mark.parametrize("case", sorted(SET_CASES), ids=[f"set-{c}" for c in sorted(SET_CASES)])
def test_a_bad_override_names_itself(case, in_tmp):
    sets, expected = SET_CASES[case]
    args = ["recipes", "validate", _recipe_file(in_tmp)]
    for item in sets:
        args += ["--set", item]
    assert_one_line_error(cli(args), expected)


@pytest.mark.parametrize("name", ["gpt-tiny", "bert-tiny", "transformer-tiny", "gpt2-small", "bert-base"],
                         ids=lambda n: f"estimate-{n}")
def test_the_memory_estimate_counts_the_parameters_and_refuses_what_cannot_fit(name):
    """The count from the keys is within 5% of the built model's, and a machine of too little memory
    (passed in, so the case does not depend on this one) gets the one line with both numbers."""
    import torch

    from tfkit.models import build_model
    from tfkit.trainer.recipe import load_recipe
    from tfkit.trainer.resources import count_parameters, memory_problems

    recipe = load_recipe(name)
    cfg = recipe.model.config(recipe.model.vocab_size or recipe.tokenizer.vocab_size)
    with torch.device("meta"):
        real = build_model(cfg).num_params()
    assert abs(count_parameters(cfg) - real) <= 0.05 * real
    assert memory_problems(recipe, memory=real * 16 * 2) == []
    (line,) = memory_problems(recipe, memory=real * 16 // 2)
    assert f"{count_parameters(cfg):,} parameters" in line and "GiB of memory" in line
