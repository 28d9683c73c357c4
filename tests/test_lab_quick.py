"""Every shipped lab spec runs end to end in its --quick form: the engine (training, conversion, uptraining,
controls, scoring, probes, report), not the science. One in-process CLI run per spec, tiny sizes."""

import json

import pytest
from typer.testing import CliRunner

from tfkit.cli.main import app
from tfkit.lab.scoring import is_degradation
from tfkit.lab.spec import bundled_specs, load_spec

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("claim", sorted(bundled_specs()))
def test_every_shipped_spec_runs_quick(claim, tmp_path):
    out = tmp_path / claim
    result = CliRunner().invoke(app, ["lab", "run", claim, "--quick", "--seeds", "1", "--out", str(out)])
    assert result.exit_code == 0, result.output
    results = json.loads((out / "results.json").read_text())
    spec = load_spec(claim)
    assert set(spec.variants) <= set(results["rows"])
    for name, row in results["rows"].items():  # every row scored on every eval text, with a finite loss
        if row["kind"] == "finetune":  # a downstream row: its error rate on the task's held-out labels
            assert 0 <= row["scores"][results["downstream"]["label"]]["1337"]["error"] <= 1, name
            continue
        for label in results["evals"]:
            assert 0 < row["scores"][label]["1337"]["loss"] < 20, (name, label)
    assert len(results["verdicts"]) == len(spec.expect)
    assert all(v["status"] != "missing" for v in results["verdicts"]), results["verdicts"]
    if "decode_speed" in spec.probes:  # gqa-uptrain: the kv2 model's cache is half the MHA model's
        decode = results["probes"]["decode_speed"]["values"]
        assert all(rate > 0 for v in decode.values() for rate in v["tokens_per_sec"].values())
        assert decode["scratch-kv2"]["kv_bytes_per_token"] * 2 == decode["mha"]["kv_bytes_per_token"]
    for row in results["rows"].values():  # a degradation column holds past - within of the same rows
        for label, seeds in row["scores"].items():
            if is_degradation(label) and "diverged" not in seeds["1337"]:
                s = seeds["1337"]
                assert s["loss"] == pytest.approx(s["past_loss"] - s["within_loss"]) and s["tokens"] > 0, label
    layers = next((int(o.split("=")[1]) for o in reversed(spec.quick) if o.startswith("model.n_layers=")), 1)
    for key in ("attention", "residual_update"):  # one value per layer (--quick: one, unless the spec's quick says)
        for run in spec.probed_runs(key) if key in spec.probes else []:
            value = results["probes"][key]["values"][run]["1337"]
            assert all(len(v) == layers for v in (value.values() if isinstance(value, dict) else [value])), (key, run)
    markdown = (out / "results.md").read_text()
    assert f"# tfkit lab: {claim}" in markdown and "## Verdicts" in markdown
