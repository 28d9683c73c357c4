"""bars.png is drawn from `plots.bar_chart`, tested here as data, not pixels: the y-axis starts at 0 and holds
every bar, whisker and line (the unigram figure the gates read included); each whisker is the paired interval the
verdict reads, placed at the reference's mean; a quick run and a run that did not train are marked."""

import math

import pytest

from tfkit.lab.plots import bar_chart, write_plots
from tfkit.lab.spec import Expectation
from tfkit.lab.verdict import judge, summary


def results_with(rows: dict, quick: bool = False, gates: dict | None = None) -> dict:
    results = {"claim": "demo", "metric": "loss", "reference": "mha", "evals": {"docs-valid": "stdlib:docs:valid"},
               "options": {"quick": quick}, "probes": {}, "gates": gates or {},
               "rows": {name: {"kind": "train", "scores": {"docs-valid": {str(s): {"loss": v} for s, v in
                                                                         enumerate(values, 1)}}}
                        for name, values in rows.items()}}
    results["summary"] = summary(results)
    return results


def gates_of(rows: dict, unigram: float, failed: str = "") -> dict:
    return {"label": "docs-valid", "min_gain": 0.05, "runs": {
        name: {"kind": "train", "source": None, "seeds": {
            str(s): {"loss": v, "unigram": unigram, "step0": 10.0,
                     "status": "did not learn" if name == failed else "trained"} for s, v in enumerate(values, 1)}}
        for name, values in rows.items()}}


ROWS = {"mha": [5.89, 5.90, 5.88], "gqa": [6.15, 6.16, 6.14], "mqa": [6.75, 6.70, 6.80]}


def test_the_whiskers_are_the_paired_interval_the_verdict_reads():
    results = results_with(ROWS)
    chart = bar_chart(results)
    (column,) = chart["columns"].values()
    bars = {b["row"]: b for b in column}
    ref = bars["mha"]["mean"]
    assert bars["mha"]["lo"] is None  # the reference is what the others are compared with
    for name in ("gqa", "mqa"):
        verdict = judge(Expectation(source="s", better=name, than="mha"), results)
        assert (bars[name]["lo"], bars[name]["hi"]) == pytest.approx((ref + verdict.lo, ref + verdict.hi))
        assert bars[name]["mean"] == pytest.approx(sum(ROWS[name]) / 3)


def test_the_y_axis_starts_at_zero_and_holds_every_whisker_and_the_unigram_line():
    results = results_with(ROWS, gates=gates_of(ROWS, unigram=7.4))
    chart = bar_chart(results)
    low, high = chart["ylim"]
    assert low == 0.0
    whiskers = [b["hi"] for b in chart["columns"]["docs-valid"] if b["hi"] is not None]
    assert high > max(whiskers) and high > 7.4
    assert chart["unigram"] == {"label": "docs-valid", "rows": {n: pytest.approx(7.4) for n in ROWS}}


def test_a_quick_run_and_a_run_that_did_not_train_are_marked():
    chart = bar_chart(results_with(ROWS, quick=True, gates=gates_of(ROWS, unigram=6.5, failed="mqa")))
    assert chart["note"].startswith("quick run: no verdict")
    assert {b["row"]: b["mark"] for b in chart["columns"]["docs-valid"]} == {"mha": "", "gqa": "",
                                                                             "mqa": "did not train"}
    assert bar_chart(results_with(ROWS))["note"] == ""


def test_one_seed_gives_bars_without_whiskers_and_a_diverged_row_no_bar():
    rows = {"mha": [5.9], "gqa": [6.1], "bad": [math.nan]}
    chart = bar_chart(results_with(rows))
    bars = {b["row"]: b for b in chart["columns"]["docs-valid"]}
    assert all(b["lo"] is None for b in bars.values()) and bars["bad"]["mean"] is None
    assert chart["ylim"] == (0.0, pytest.approx(6.1 * 1.08))


def test_bars_png_is_written_from_that_data(tmp_path):
    pytest.importorskip("matplotlib")
    results = results_with(ROWS, quick=True, gates=gates_of(ROWS, unigram=7.4, failed="mqa"))
    results["curves"] = {}
    assert "bars.png" in write_plots(tmp_path, results)
    assert (tmp_path / "bars.png").stat().st_size > 0
