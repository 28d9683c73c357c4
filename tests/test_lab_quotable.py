"""What a verdict line carries beyond its word, on results made by hand: the paper beside it (agreement in direction,
scale ratio), the margin's reason, the family-wise view, a difference of differences (`minus`), the steps-to-loss
ratio (`faster`), a per-layer probe read at one layer, a sweep picked on another text with its edge-of-grid
warning, and a probe this machine cannot measure (training speed without a GPU)."""

import pytest
from typer.testing import CliRunner

from tfkit.cli.main import app
from tfkit.lab.annotate import annotate
from tfkit.lab.curve_verdicts import steps_to
from tfkit.lab.paper import AGREES, DISAGREES, agreement, ratio
from tfkit.lab.report import complete, render
from tfkit.lab.scoring import sweep_warnings
from tfkit.lab.spec import load_spec
from tfkit.lab.verdict import judge
from helpers import one_error_line


def results_with(rows: dict, evals=("docs-valid",), **extra) -> dict:
    return {"claim": "demo", "metric": "loss", "reference": "a", "options": {}, "seeds": [1, 2, 3],
            "evals": {e: e for e in evals}, "probes": {}, "scale": {"a": {"params": 1e6, "tokens": 6e5, "train_tokens": 4e5, "steps": 300, "kind": "train", "precision": "bf16"}},
            "rows": {name: {"kind": "train", "scores": {e: {str(s): {"loss": v} for s, v in enumerate(values, 1)}
                                                        for e in evals}}
                     for name, values in rows.items()}, **extra}


def spec_file(tmp_path, expect: str, extra: str = "") -> object:
    path = tmp_path / "s.yaml"
    path.write_text("base: gpt-tiny\nreference: a\nvariants: {a: [], b: [], c: [], d: []}\n" + extra
                    + "expect:\n" + expect)
    return load_spec(str(path))


def test_the_paper_is_printed_beside_the_verdict_with_agreement_and_scale(tmp_path):
    spec = spec_file(tmp_path, "  - {better: a, than: b, reported: 'perplexity 82 -> 78', source: s}\n"
                               "  - {better: b, than: a, source: s}\n",
                     "paper: {cite: 'Press and Wolf, 2017', params: 66.0e+6, tokens: 3.0e+7, data: PTB}\n")
    out = complete(results_with({"a": [5.0, 5.02, 5.01], "b": [5.2, 5.25, 5.21]}), spec)
    first, second = out["verdicts"]
    assert first["status"] == "holds" and first["paper"]["agreement"] == AGREES
    assert second["status"] == "reversed" and second["paper"]["agreement"] == DISAGREES
    assert first["paper"]["params_ratio"] == "66x" and first["paper"]["tokens_ratio"] == "50x"
    assert first["line"].endswith("[paper: agrees in direction]")
    text = render(out)
    assert "## Against the papers" in text and "| a < b | holds | Press and Wolf, 2017 | 66M parameters, 30M tokens, " \
        "PTB | perplexity 82 -> 78 | agrees in direction | 66x, 50x |" in text


def test_agreement_reads_the_interval_not_only_the_word():
    assert agreement("inconclusive", -0.3, -0.005, -1) == AGREES  # the direction is resolved, the margin is not
    assert agreement("inconclusive", -0.3, 0.2, -1).startswith("not comparable (our interval holds 0)")
    assert agreement("not tested", -0.3, -0.1, -1) == "not comparable (not tested)"
    assert agreement("mixed", None, None, None) == "not comparable (mixed)"
    assert ratio(None, 1e6) == "not stated" and ratio(2.5e9, 6e5) == "4,167x" and ratio(3e6, 1e6) == "3x"


def test_a_margin_carries_its_reason_and_holm_counts_the_lab(tmp_path):
    spec = spec_file(tmp_path, "  - {same: [a, b], tol: 0.05, margin_reason: the noise floor, source: s}\n"
                               "  - {better: a, than: c, source: s}\n  - {better: a, than: d, source: s}\n")
    rows = {"a": [5.0, 5.02, 5.01], "b": [5.01, 5.02, 5.0], "c": [5.04, 5.07, 5.04], "d": [5.5, 5.6, 5.55]}
    out = complete(results_with(rows), spec)
    assert "[margin: the noise floor]" in out["verdicts"][0]["line"]
    assert out["family"]["m"] == 3 and all(v["holm"] >= v["p"] for v in out["verdicts"])
    assert "[Holm: kept" in out["verdicts"][2]["line"]
    assert "## Family-wise view (Holm)" in render(out)


def test_a_difference_of_differences_is_read_seed_by_seed(tmp_path):
    """BatchNorm's loss from the small batch against LayerNorm's: (c - d) - (a - b) per seed."""
    spec = spec_file(tmp_path, "  - {better: a, than: b, minus: [c, d], source: s}\n")
    (exp,) = spec.expect
    assert exp.describe() == "a - b < c - d"
    rows = {"a": [5.0, 5.1, 5.2], "b": [5.0, 5.1, 5.2], "c": [5.3, 5.42, 5.5], "d": [5.0, 5.1, 5.2]}
    verdict = judge(exp, results_with(rows))
    assert verdict.status == "holds" and verdict.mean == pytest.approx(-(0.3 + 0.32 + 0.3) / 3)


def test_the_steps_to_the_other_runs_final_loss_give_a_ratio(tmp_path):
    assert steps_to([[10, 6.0], [20, 5.0], [30, 4.0]], 4.5) == pytest.approx(25.0)
    assert steps_to([[10, 6.0], [20, 5.0]], 4.5) is None
    spec = spec_file(tmp_path, "  - {faster: a, than: b, source: s}\n")
    curve_b = [[10, 6.0], [20, 5.5], [30, 5.0], [40, 4.8]]
    curves = {"a": {s: [[10, 5.8], [20, 5.0], [30, 4.6], [40, 4.4]] for s in "123"}, "b": {s: curve_b for s in "123"}}
    curves["a"]["2"] = [[10, 5.8], [20, 4.9], [30, 4.5], [40, 4.3]]
    verdict = judge(spec.expect[0], results_with({"a": [1, 1, 1], "b": [1, 1, 1]}, curves=curves))
    assert verdict.status == "holds" and verdict.ratio and 1.3 < verdict.mean < 1.8
    assert "b's steps over a's" in verdict.line
    curves["a"] = {s: [[10, 6.1], [20, 5.9], [30, 5.8], [40, 5.7]] for s in "123"}  # never reaches 4.8
    assert judge(spec.expect[0], results_with({"a": [1, 1, 1], "b": [1, 1, 1]}, curves=curves)).status == "reversed"


def test_a_per_layer_probe_is_read_at_the_layer_named(tmp_path):
    spec = spec_file(tmp_path, "  - {probe: residual_update, run: a, layer: -1, below: a, than_layer: 1, source: s}\n",
                     "probes: {residual_update: {}}\n")
    (exp,) = spec.expect
    assert exp.describe() == "residual_update of a at layer -1 < a's at layer 1"
    values = {"a": {s: [2.0, 0.9 + d, 0.5, 0.3 + d] for s, d in (("1", 0.0), ("2", 0.02), ("3", -0.01))}}
    verdict = judge(exp, results_with({"a": [5, 5, 5]}, probes={"residual_update": {"values": values}}))
    assert verdict.status == "holds" and verdict.mean == pytest.approx(-0.6)
    assert "a (layer -1) 0.303, a (layer 1) 0.903" in verdict.line


@pytest.mark.parametrize("item, message", [
    ("{better: a, than: b, layer: 1, source: s}", "expect[0].layer: belongs to probe, not to better"),
    ("{probe: mask_leak, run: a, layer: 1, below: 0.1, source: s}", "mask_leak has no layers"),
    ("{trains: a, fails: b, minus: [c, d], source: s}", "expect[0].minus: belongs to better, not_worse or same"),
    ("{better: a, than: b, margin_reason: '', source: s}", "expect[0].margin_reason: got '', expected text"),
])
def test_a_malformed_new_key_is_one_line(tmp_path, item, message):
    spec = tmp_path / "bad.yaml"
    spec.write_text("base: gpt-tiny\nvariants: {a: [], b: [], c: [], d: []}\nprobes: {mask_leak: {}}\n"
                    f"expect:\n  - {item}\n")
    line = one_error_line(CliRunner().invoke(app, ["lab", "run", str(spec), "--quick", "--out", str(tmp_path / "o")]))
    assert message in line


def test_a_sweep_is_picked_on_the_other_text_and_warns_at_the_grid_edge():
    results = {"evals": {"docs-valid": "x", "code-valid": "y"},
               "sweep": {"key": "optim.lr", "values": [1e-3, 3e-3], "best": {"a": "a@lr=0.003"}, "on": "code-valid",
                         "edges": {"a": "largest"}}}
    (warning,) = sweep_warnings(results)
    assert "a's best optim.lr is the grid's largest value (a@lr=0.003)" in warning
    one = {**results, "evals": {"docs-valid": "x"}, "sweep": {**results["sweep"], "on": "docs-valid", "edges": {}}}
    assert "the only eval text" in sweep_warnings(one)[0]


def test_a_line_judged_on_the_selection_text_says_so(tmp_path):
    spec = spec_file(tmp_path, "  - {better: a, than: b, eval: code-valid, source: s}\n")
    results = results_with({"a": [5.0, 5.02, 5.01], "b": [5.2, 5.25, 5.21]}, evals=("docs-valid", "code-valid"),
                           sweep={"key": "optim.lr", "values": [1, 2], "best": {}, "on": "code-valid", "edges": {}})
    line = annotate(judge(spec.expect[0], results), spec.expect[0], results, None).line
    assert "the text the sweep picked each variant's best optim.lr on" in line


def test_training_speed_is_not_tested_without_a_gpu(tmp_path):
    spec = load_spec("flash-speed")
    results = results_with({"flash": [5, 5, 5]}, probes={"train_speed": {"run": "flash", "why": "no GPU on this "
                                                                          "machine: FlashAttention's speed is measured on one"}})
    (verdict,) = [judge(e, results) for e in spec.expect]
    assert verdict.status == "not tested" and "no GPU on this machine" in verdict.line
