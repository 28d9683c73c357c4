"""A lab reads the downstream scores its trainings logged (eval.tasks / eval.probe) as columns `task:NAME`, judged
by their error rate like any column, with no fine-tuning job per variant (lab/inloop_columns.py)."""

import json
import textwrap

import pytest
from typer.testing import CliRunner

from tfkit.cli.main import app

from helpers import one_error_line

SPEC = """\
claim: probe-masking
base: bert-tiny
set: [eval.probe=stdlib:topics]
reference: p15
variants:
  p15: []
  keep: ["objective.mask_replace=[0.0, 0.0, 1.0]"]
expect:
  - {better: p15, than: keep, eval: "task:probe-topics", source: "a test"}
"""


def spec_file(tmp_path, text: str = SPEC):
    path = tmp_path / "spec.yaml"
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def test_a_lab_judges_a_claim_on_the_probe_its_trainings_scored(tmp_path):
    out = tmp_path / "lab"
    result = CliRunner().invoke(app, ["lab", "run", str(spec_file(tmp_path)), "--quick", "--seeds", "1",
                                      "--out", str(out)])
    assert result.exit_code == 0, result.output
    results = json.loads((out / "results.json").read_text())
    for name in ("p15", "keep"):
        (scores,) = results["rows"][name]["scores"]["task:probe-topics"].values()
        metrics = (out / "runs" / name / "seed-1337" / "metrics.jsonl").read_text().splitlines()
        acc = [row for row in map(json.loads, metrics) if "task/probe-topics/acc" in row][-1]["task/probe-topics/acc"]
        assert scores == {"error": pytest.approx(1 - acc), "acc": acc}
    assert {v["on"] for v in results["verdicts"]} == {"task:probe-topics"}
    delta = results["summary"]["keep"]["task:probe-topics"]["delta"]
    assert delta == pytest.approx(results["rows"]["keep"]["scores"]["task:probe-topics"]["1337"]["error"]
                                  - results["rows"]["p15"]["scores"]["task:probe-topics"]["1337"]["error"])


def test_a_missing_task_file_is_refused_before_any_training(tmp_path, monkeypatch):
    from tfkit.lab import engine

    trained = []
    monkeypatch.setattr(engine, "train_job", lambda *args: trained.append(args) or (0, 0.0))
    text = SPEC.replace("set: [eval.probe=stdlib:topics]", f"set: [\"eval.probe={tmp_path / 'nope.csv'}\"]")
    out = tmp_path / "lab"
    line = one_error_line(CliRunner().invoke(app, ["lab", "run", str(spec_file(tmp_path, text)), "--quick",
                                                   "--seeds", "1", "--out", str(out)]))
    assert trained == [] and not out.exists() and "nope.csv" in line
