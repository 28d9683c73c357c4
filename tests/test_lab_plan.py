"""The plan reads a variant's overrides as the recipe loader parses `--set` (key -> value), never as text: a
variant that sets the head count a conversion produces is that layout's from-scratch baseline however it spells
the setting, and only a different value (a quoted "2" is a string, not a count) makes the plan add its own."""

import textwrap

import pytest

from tfkit.lab.plan import plan_jobs
from tfkit.lab.spec import load_spec, parsed_overrides, scratch_names

SPEC = """\
base: gpt-tiny
reference: mha
variants: {{mha: [], gqa: [{override}]}}
convert: {{from: mha, kv_heads: [2], methods: [mean]}}
"""


def spec_with(tmp_path, override: str):
    path = tmp_path / "spec.yaml"
    path.write_text(textwrap.dedent(SPEC.format(override=override)), encoding="utf-8")
    return load_spec(str(path))


@pytest.mark.parametrize("override", ["model.n_kv_heads=2", "'model.n_kv_heads= 2'", "'model.n_kv_heads=+2'",
                                      "'model.n_kv_heads=0x2'", "optim.lr=1e-3, model.n_kv_heads=2"])
def test_a_variant_setting_the_head_count_is_the_baseline_however_spelled(tmp_path, override):
    spec = spec_with(tmp_path, override)
    assert scratch_names(spec) == {2: "gqa"}
    assert [j.name for j in plan_jobs(spec, [1]) if j.kind == "train"] == ["mha", "gqa"]  # no scratch-kv2 added


@pytest.mark.parametrize("override", ["model.n_kv_heads=1", "'model.n_kv_heads=\"2\"'", "model.n_kv_heads=true",
                                      "model.n_kv_heads=2.0", "model.n_layers=2"])
def test_another_value_is_not_the_baseline(tmp_path, override):
    spec = spec_with(tmp_path, override)
    assert scratch_names(spec) == {2: "scratch-kv2"}
    assert "scratch-kv2" in [j.name for j in plan_jobs(spec, [1]) if j.kind == "train"]


def test_overrides_are_parsed_as_the_recipe_loader_parses_set():
    assert parsed_overrides(["model.n_kv_heads=2"]) == parsed_overrides(["model.n_kv_heads= 2"]) == {
        "model.n_kv_heads": 2}
    assert parsed_overrides(["task.pooling=mean"]) == parsed_overrides(['task.pooling="mean"'])  # a text key
    assert parsed_overrides(["task.label=2"]) != parsed_overrides(['task.label="2"'])  # position 2, column "2"
    assert parsed_overrides(["optim.lr=3e-4"]) == {"optim.lr": 3e-4}
    assert parsed_overrides(["train.max_steps=5", "train.max_steps=7"]) == {"train.max_steps": 7}  # the last wins
    assert parsed_overrides(["oops", "nosection.key=1", "model.n_layers=3"]) == {"model.n_layers": 3}
