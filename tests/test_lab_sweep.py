"""`sweep: {SECTION.KEY: [values]}`: every variant trained at every value, each compared at its best, so
a claim is not decided by one learning rate that suits one variant (post-norm stalled at 2e-3)."""

from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from tfkit.cli.main import app
from tfkit.lab.gates import MIN_GAIN
from tfkit.lab.plan import LabOptions, plan_jobs, resolve_recipes
from tfkit.lab.scoring import pick_best
from tfkit.lab.spec import Expectation, load_spec
from tfkit.lab.verdict import judge

SPEC = """\
base: gpt-tiny
reference: a
sweep: {optim.lr: [1.0e-3, 4.0e-3]}
variants: {a: [], b: [model.norm=rmsnorm, optim.lr=1.0e-2]}
expect:
  - {better: a, than: b, source: test}
"""


def test_every_variant_is_trained_at_every_value(tmp_path):
    (tmp_path / "s.yaml").write_text(SPEC)
    spec = load_spec(str(tmp_path / "s.yaml"))
    jobs = plan_jobs(spec, [1, 2])
    assert [j.name for j in jobs if j.seed == 1] == ["a@lr=0.001", "a@lr=0.004", "b@lr=0.001", "b@lr=0.004"]
    recipes = resolve_recipes(spec, LabOptions(), jobs)
    assert recipes["b@lr=0.004/seed-2"].optim.lr == 4e-3  # the swept value wins over the variant's own
    assert recipes["b@lr=0.004/seed-2"].model.norm == "rmsnorm"


@pytest.mark.parametrize("extra, message", [
    ("sweep: {optim.lr: [1.0e-3]}\n", "two or more values"),
    ("sweep: {lr: [1.0e-3, 2.0e-3]}\n", "SECTION.KEY"),
    ("probes: {attention_reliance: {run: a}}\n", "cannot be combined with convert or with probes"),
])
def test_a_bad_sweep_is_one_line_naming_it(tmp_path, extra, message):
    text = SPEC.replace("sweep: {optim.lr: [1.0e-3, 4.0e-3]}\n", "") if extra.startswith("sweep") else SPEC
    (tmp_path / "s.yaml").write_text(text + extra)
    result = CliRunner().invoke(app, ["lab", "run", str(tmp_path / "s.yaml"), "--quick"])
    assert result.exit_code == 2 and "sweep:" in result.output and message in result.output, result.output
    assert "Traceback" not in result.output


def test_each_variant_is_compared_at_its_best_value(tmp_path):
    (tmp_path / "s.yaml").write_text(SPEC)
    spec = load_spec(str(tmp_path / "s.yaml"))
    means = {"a@lr=0.001": 5.0, "a@lr=0.004": 4.6, "b@lr=0.001": 4.9, "b@lr=0.004": 6.8}
    rows = {run: {"kind": "train", "scores": {"valid": {str(s): {"loss": m + 0.01 * s} for s in (1, 2, 3)}}}
            for run, m in means.items()}
    lab = SimpleNamespace(spec=spec, evals={"valid": "v.txt"})
    sweep = pick_best(lab, rows)
    assert sweep["best"] == {"a": "a@lr=0.004", "b": "b@lr=0.001"}
    assert rows["a"]["scores"] == rows["a@lr=0.004"]["scores"] and rows["b"]["kind"] == "best"
    results = {"metric": "loss", "evals": lab.evals, "rows": rows, "probes": {}}
    verdict = judge(Expectation(source="s", better="a", than="b"), results)
    assert verdict.status == "holds" and verdict.mean == pytest.approx(4.6 - 4.9)
    # a variant whose best run did not train is not tested (the gates alias it to that run)
    results["gates"] = {"runs": {"b@lr=0.001": {"seeds": {"1": {"status": "did not learn", "loss": 4.9,
                                                                "unigram": 4.9 + MIN_GAIN / 2, "step0": 8.0}}},
                                 "b": {"kind": "best", "source": "b@lr=0.001", "seeds": {}}}}
    assert judge(Expectation(source="s", better="a", than="b"), results).line.startswith(
        "a < b on valid: not tested: b@lr=0.001 did not train")
