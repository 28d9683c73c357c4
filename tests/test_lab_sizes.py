"""`--sizes N`: the lab at N model sizes at the same tokens per parameter, a verdict per rung and a trend; and the
registration of a lab's expectations before its first training, which every verdict line reports, with a second
look at more seeds recorded. Tiny sizes (--quick), one CLI run each."""

import json

import pytest
import yaml
from typer.testing import CliRunner

from tfkit.cli.main import app
from tfkit.lab.plan import LabOptions
from tfkit.lab.sizes import count_params, reference_recipe, size_rungs
from tfkit.lab.spec import load_spec
from tfkit.lab.trend import trend, trend_text, turns
from helpers import one_error_line

SPEC = """\
# two variants, a ladder of widths
base: gpt-tiny
reference: a
sizes: {d_model: [16, 32, 64]}
variants: {a: [], b: [model.attn_scale=none]}
expect:
  - {better: a, than: b, source: test}
"""


def write_spec(folder, text: str = SPEC):
    (folder / "spec.yaml").write_text(text)
    return folder / "spec.yaml"


def test_every_rung_trains_the_same_tokens_per_parameter(tmp_path):
    spec = load_spec(str(write_spec(tmp_path)))
    options = LabOptions(quick=True)
    base = reference_recipe(spec, options, [])
    per_param = base.train.max_steps * base.train.batch_size * base.data.seq_len / count_params(base)
    rungs = size_rungs(spec, options, 3)
    assert [r.name for r in rungs] == ["d_model-16", "d_model-32", "d_model-64"]
    for r in rungs:
        tokens = r.steps * base.train.batch_size * base.data.seq_len
        assert tokens / r.params == pytest.approx(per_param, rel=0.1)  # rounded to whole steps
        assert f"model.d_model={r.value}" in r.overrides and f"train.max_steps={r.steps}" in r.overrides
    assert rungs[1].steps == base.train.max_steps  # the base width is the ordinary lab
    assert rungs[0].params < rungs[1].params < rungs[2].params
    assert [r.value for r in size_rungs(spec, options, 2)] == [16, 32]  # --sizes N: the first N rungs


def test_without_a_sizes_block_the_widths_are_multiples_of_the_base(tmp_path):
    spec = load_spec(str(write_spec(tmp_path, SPEC.replace("sizes: {d_model: [16, 32, 64]}\n", ""))))
    assert [r.value for r in size_rungs(spec, LabOptions(quick=True), 3)] == [16, 32, 64]  # quick's 32: 0.5, 1, 2


@pytest.mark.parametrize("args, message", [(["--sizes", "5"], "sizes: got 5, expected 2 to 3"),
                                           (["--sizes", "2", "--steps", "4"], "sets each rung's training length from its parameters"),
                                           (["--sizes", "2", "--steps", "4", "--steps", "8"], "along one axis")])
def test_a_bad_sizes_ladder_is_one_line(tmp_path, args, message):
    result = CliRunner().invoke(app, ["lab", "run", str(write_spec(tmp_path)), "--quick", *args,
                                      "--out", str(tmp_path / "out")])
    assert message in one_error_line(result)


@pytest.fixture(scope="module")
def ladder(english_text, tmp_path_factory):
    folder = tmp_path_factory.mktemp("sizes")
    (folder / "train.txt").write_text(english_text[:60_000])
    (folder / "valid.txt").write_text(english_text[60_000:70_000])
    args = ["lab", "run", str(write_spec(folder)), "--quick", "--seeds", "3", "--sizes", "2",
            "--data", str(folder / "train.txt"), "--eval", str(folder / "valid.txt"),
            "--set", f"data.valid={folder / 'valid.txt'}", "--out", str(folder / "out")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return folder / "out"


def test_a_sizes_ladder_gives_a_verdict_per_rung_and_a_trend(ladder):
    summary = json.loads((ladder / "results.json").read_text())
    assert summary["axis"] == "d_model" and list(summary["rungs"]) == ["d_model-16", "d_model-32"]
    (t,) = summary["trends"]
    assert t["n"] == 6 and t["per"] == "doubling of parameters"
    markdown = (ladder / "results.md").read_text()
    assert "| claim | d_model 16 | d_model 32 | trend of Δ | where the verdict turns |" in markdown
    assert "per doubling of parameters, 95% CI [" in markdown
    for name in summary["rungs"]:
        rung = json.loads((ladder / name / "results.json").read_text())
        assert rung["options"]["sets"][-3:][0] == f"model.d_model={name.split('-')[1]}"


def test_the_expectations_were_registered_before_the_first_training(ladder, tmp_path):
    folder = ladder / "d_model-16"
    registration = json.loads((folder / "registration.json").read_text())
    assert registration["before_data"] and registration["seeds"] == [1337, 1338, 1339]
    results = json.loads((folder / "results.json").read_text())
    assert all(v["registered"] == "fixed before the data" for v in results["verdicts"])
    assert "[expectation fixed before the data]" in results["verdicts"][0]["line"]
    # an expectation edited after the data (the spec copy the report reads) is a new claim: said so
    copy = yaml.safe_load((folder / "spec.yaml").read_text())
    copy["expect"][0]["margin"] = 0.2
    (folder / "spec.yaml").write_text(yaml.safe_dump(copy))
    rebuilt = CliRunner().invoke(app, ["lab", "report", str(folder)])
    assert rebuilt.exit_code == 0, rebuilt.output
    assert "[expectation written after the data]" in (folder / "results.md").read_text()


def test_more_seeds_continue_a_lab_as_a_second_look(english_text, tmp_path):
    (tmp_path / "train.txt").write_text(english_text[:60_000])
    (tmp_path / "valid.txt").write_text(english_text[60_000:70_000])
    spec = write_spec(tmp_path, SPEC.replace("sizes: {d_model: [16, 32, 64]}\n", ""))
    args = ["lab", "run", str(spec), "--quick", "--data", str(tmp_path / "train.txt"), "--eval", str(tmp_path / "valid.txt"),
            "--set", f"data.valid={tmp_path / 'valid.txt'}", "--out", str(tmp_path / "out")]
    first = CliRunner().invoke(app, [*args, "--seeds", "1"])
    assert first.exit_code == 0, first.output
    second = CliRunner().invoke(app, [*args, "--seeds", "2"])
    assert second.exit_code == 0, second.output
    assert "train a/seed-1337: done before" in second.output  # the first look's runs are kept
    registration = json.loads((tmp_path / "out" / "registration.json").read_text())
    (look,) = registration["looks"]
    assert look["seeds"] == 1 and look["verdicts"][0]["status"] == "no verdict"
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert results["seeds"] == [1337, 1338]
    assert "[second look: no verdict at 1 seeds before these 2]" in results["verdicts"][0]["line"]


def test_trend_and_turns_on_rungs_made_by_hand():
    spec_results = {}
    for params, deltas in ((2**16, [0.30, 0.28, 0.33]), (2**18, [0.10, 0.12, 0.08]), (2**20, [-0.10, -0.12, -0.09])):
        spec_results[f"d_model-{params}"] = {
            "reference": "a", "evals": {"valid": "v"}, "metric": "loss", "scale": {"a": {"params": params}},
            "rows": {"a": {"scores": {"valid": {str(s): {"loss": 5.0 + d} for s, d in enumerate(deltas)}}},
                     "b": {"scores": {"valid": {str(s): {"loss": 5.0} for s in range(3)}}}}}
    from tfkit.lab.spec import Expectation

    t = trend(Expectation(source="s", better="a", than="b"), spec_results, "d_model")
    assert t["slope"] == pytest.approx(-0.1, abs=0.01) and t["hi"] < 0 and t["left_out"] == []
    failed = {"status": "did not learn", "loss": 6.9, "unigram": 6.8, "step0": 8.3}  # a rung where b never trained
    spec_results["d_model-16"] = {**spec_results["d_model-65536"], "scale": {"a": {"params": 2**14}},
                                  "gates": {"runs": {"b": {"seeds": {"0": failed}}}}}
    t2 = trend(Expectation(source="s", better="a", than="b"), spec_results, "d_model")
    assert t2["left_out"] == ["d_model-16"] and t2["slope"] == pytest.approx(t["slope"])
    assert "d_model-16 left out: a run did not train" in trend_text(t2)
    assert turns([("d_model-32", "reversed"), ("d_model-64", "inconclusive"), ("d_model-128", "holds")]) == [
        "reversed at d_model-32, inconclusive at d_model-64", "inconclusive at d_model-64, holds at d_model-128"]
