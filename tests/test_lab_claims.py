"""The claims of the design notes the lab covers beyond the first ones, and the `untested` form a spec uses for
a claim it cannot test: every spec loads, names its sources and its measured cost; an untested claim reads "not
tested: <why>" and never a verdict word; a malformed one is one line."""

import pytest
from typer.testing import CliRunner

from tfkit.cli.main import app
from tfkit.lab.plan import LabOptions, plan_jobs, resolve_recipes, seed_values
from tfkit.lab.report import complete, render
from tfkit.lab.spec import Expectation, load_spec
from tfkit.lab.verdict import judge
from helpers import one_error_line

CLAIMS = ("heads", "attention-score", "shared-qk", "pad-mask", "batchnorm", "dropout", "residual", "noam")


@pytest.mark.parametrize("claim", CLAIMS)
def test_each_claim_loads_with_sources_a_measured_cost_and_valid_recipes(claim):
    spec = load_spec(claim)
    assert spec.expect and all(e.source for e in spec.expect)
    assert spec.cost.get("cpu_minutes") and spec.cost.get("runs") == 3 * len(spec.variants)
    recipes = resolve_recipes(spec, LabOptions(), plan_jobs(spec, seed_values(1337, 3)))  # every variant's recipe
    assert len(recipes) == spec.cost["runs"]


def test_variants_differ_in_what_their_claim_is_about():
    score = {k: r.model for k, r in resolve_recipes(load_spec("attention-score"), LabOptions(),
                                                    plan_jobs(load_spec("attention-score"), [1])).items()}
    assert {(m.attn_score, m.head_dim, m.score_scale) for m in score.values()} == {
        ("additive", 16, None), ("dot", 16, 1.0), ("additive", 64, None), ("dot", 64, 1.0), ("additive", 256, None),
        ("dot", 256, 1.0), ("dot", 256, None)}
    assert all(m.init == "xavier" and m.attention == "naive" for m in score.values())
    fills = {k.split("/")[0]: r.model.padding_fill for k, r in
             resolve_recipes(load_spec("pad-mask"), LabOptions(), plan_jobs(load_spec("pad-mask"), [1])).items()}
    assert fills == {"neg-inf": float("-inf"), "large-neg": -10000.0, "zero": 0.0}
    noam = resolve_recipes(load_spec("noam"), LabOptions(), plan_jobs(load_spec("noam"), [1]))
    from tfkit.trainer.schedules import lr_at

    def rates(name: str) -> list[float]:
        r = noam[f"{name}/seed-1"]
        return [lr_at(s, r.schedule, r.optim.lr, r.train.max_steps, r.model.d_model) for s in range(300)]

    warm, cold = rates("noam"), rates("noam-nowarmup")
    assert max(warm) == pytest.approx(2e-3, rel=1e-3) and warm.index(max(warm)) == 29  # the recipe's peak, step 30
    assert cold[0] == pytest.approx(2e-3 * 30**0.5, rel=1e-3) and cold[29:] == pytest.approx(warm[29:])


def results() -> dict:
    return {"claim": "demo", "metric": "loss", "reference": "a", "seeds": [1, 2, 3], "options": {},
            "evals": {"docs-valid": "stdlib:docs:valid"}, "probes": {},
            "rows": {"a": {"kind": "train", "scores": {"docs-valid": {"1": {"loss": 5.0}}}}}}


def test_an_untested_claim_says_why_and_gives_no_verdict_word():
    exp = Expectation(source="Vaswani et al., 2017, section 5.3", untested="the paper's schedule trains",
                      why="its 4000 warmup steps exceed the run")
    verdict = judge(exp, results())
    assert verdict.status == "not tested"
    assert verdict.line == ("the paper's schedule trains: not tested: its 4000 warmup steps exceed the run — nothing "
                            "measured — Vaswani et al., 2017, section 5.3")
    spec = load_spec("noam")
    text = render(complete(results(), spec))
    assert "- the paper's own setting of the schedule" in text and "not tested: at this scale" in text


@pytest.mark.parametrize("item, expected", [
    ("{untested: some claim, source: s}", "expect[0].why: expected the reason in words, got None"),
    ("{untested: '', why: w, source: s}", "expect[0].untested: expected the claim in words"),
    ("{better: a, than: b, why: w, source: s}", "expect[0].why: belongs to untested, not to better"),
    ("{untested: c, why: w, better: a, than: b, source: s}", "expected exactly one of better, not_worse or faster"),
])
def test_a_malformed_untested_claim_is_one_line(tmp_path, item, expected):
    spec = tmp_path / "bad.yaml"
    spec.write_text(f"base: gpt-tiny\nvariants: {{a: [], b: []}}\nexpect:\n  - {item}\n")
    line = one_error_line(CliRunner().invoke(app, ["lab", "run", str(spec), "--quick", "--out", str(tmp_path / "o")]))
    assert str(spec) in line and expected in line
