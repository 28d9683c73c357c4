"""A lab's `downstream` block (lab/downstream.py): every trained variant fine-tuned once per head, rows
VARIANT+HEAD judged by their error rate on the task's held-out labels, checked before any training."""

import json
import textwrap

import pytest
from typer.testing import CliRunner

from tfkit.cli.main import app
from tfkit.lab.plan import plan_jobs
from tfkit.lab.spec import load_spec
from helpers import one_error_line

runner = CliRunner()

SPEC = """\
claim: heads-and-bodies
base: bert-tiny
reference: small+cls
variants:
  small: []
  wide: [model.d_model=64]
downstream:
  recipe: finetune-classify
  set: [train.max_steps=20]
  heads:
    cls: [task.pooling=cls]
    mean: [task.pooling=mean]
expect:
  - {better: small+mean, than: small+cls, source: "a test"}
"""


def spec_file(tmp_path, text: str = SPEC):
    path = tmp_path / "spec.yaml"
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def test_each_variant_is_fine_tuned_once_per_head_after_every_training(tmp_path):
    spec = load_spec(str(spec_file(tmp_path)))
    jobs = plan_jobs(spec, [1, 2])
    tuned = [j for j in jobs if j.kind == "finetune"]
    assert [j.name for j in tuned] == ["small+cls", "small+mean", "wide+cls", "wide+mean"] * 2
    assert [(j.source, j.seed) for j in tuned[:2]] == [("small", 1), ("small", 1)]
    assert tuned[0].overrides == ["task.pooling=cls"]
    first_tuning = jobs.index(tuned[0])
    assert all(j.kind == "train" for j in jobs[:first_tuning]) and len(jobs[:first_tuning]) == 4  # 2 variants x 2 seeds


def test_a_downstream_recipe_that_cannot_give_an_error_rate_is_refused_before_any_training(tmp_path):
    regress = SPEC.replace("set: [train.max_steps=20]", "set: [objective.name=regress, task.metric=auto]")
    path = spec_file(tmp_path, regress)
    result = runner.invoke(app, ["lab", "run", str(path), "--out", str(tmp_path / "lab")])
    line = one_error_line(result)
    assert "downstream.recipe" in line and "classify" in line and str(path) in line
    assert not (tmp_path / "lab").exists()  # refused before the folder was claimed


@pytest.mark.parametrize("block, says", [
    ("downstream:\n  heads: {cls: [task.pooling=cls]}\n", "downstream.recipe: expected a fine-tuning recipe"),
    ("downstream:\n  recipe: finetune-classify\n  heads: [cls, mean]\n", "downstream.heads: expected a mapping"),
    ("downstream:\n  recipe: finetune-classify\n  heads: {cls: task.pooling=cls}\n",
     "downstream.heads.cls: expected a list of strings"),
    ("downstream:\n  recipe: finetune-classify\n  heads: {cls: []}\n  sett: []\n", "downstream.sett: unknown key"),
    ("downstream:\n  recipe: finetune-classify\nsweep: {optim.lr: [1e-3, 2e-3]}\n",
     "downstream: cannot be combined with sweep"),
])
def test_a_bad_downstream_block_is_one_line_naming_its_key(tmp_path, block, says):
    text = SPEC.split("downstream:")[0] + block + "expect: []\n"
    text = text.replace("reference: small+cls", "reference: small")
    result = runner.invoke(app, ["lab", "run", str(spec_file(tmp_path, text)), "--out", str(tmp_path / "lab")])
    assert says in one_error_line(result)


def test_an_expectation_may_name_only_rows_the_spec_makes(tmp_path):
    path = spec_file(tmp_path, SPEC.replace("better: small+mean", "better: small+max"))
    result = runner.invoke(app, ["lab", "run", str(path), "--out", str(tmp_path / "lab")])
    assert "small+max" in one_error_line(result)


@pytest.mark.slow  # a tiny pretraining and four fine-tunings: about 20 s
def test_a_downstream_lab_scores_each_row_on_the_tasks_held_out_labels(tmp_path):
    out = tmp_path / "lab"
    result = runner.invoke(app, ["lab", "run", "pooling", "--quick", "--seeds", "1", "--out", str(out)])
    assert result.exit_code == 0, result.output
    results = json.loads((out / "results.json").read_text())
    assert results["downstream"] == {"label": "topics-valid", "metric": "error", "data": "stdlib:topics:valid"}
    tuned = {name: row for name, row in results["rows"].items() if row["kind"] == "finetune"}
    assert set(tuned) == {"bert+cls", "bert+mean", "bert+cls-lr5e-4", "bert+mean-lr5e-4"}
    for name, row in tuned.items():
        (scores,) = row["scores"]["topics-valid"].values()
        run = out / "runs" / name / "seed-1337"
        last = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
        assert scores["error"] == pytest.approx(1 - last["val_accuracy"]) and scores["matthews"] == last["val_matthews"]
        recipe = (run / "recipe.yaml").read_text()
        assert f"init_from: {out / 'runs' / 'bert' / 'seed-1337' / 'checkpoints'}" in recipe  # the variant's weights
        assert results["gates"]["runs"][name]["seeds"]["1337"]["matthews"] == scores["matthews"]
    assert set(results["rows"]["bert"]["scores"]) == set(results["evals"])  # the pretraining keeps its text columns
    measured = [v for v in results["verdicts"] if v["on"]]
    assert {v["on"] for v in measured} == {"topics-valid"} and len(measured) == 2
    untestable = [v for v in results["verdicts"] if not v["on"]]  # the spec's claim tfkit's BERT cannot test
    assert [": not tested:" in v["line"] for v in untestable] == [True]
    assert results["summary"]["bert+mean"]["topics-valid"]["delta"] == pytest.approx(
        tuned["bert+mean"]["scores"]["topics-valid"]["1337"]["error"]
        - tuned["bert+cls"]["scores"]["topics-valid"]["1337"]["error"])
    assert "error (1 - accuracy, lower is better) on topics-valid" in (out / "results.md").read_text()


# --- refused before the first training: the downstream block's recipe, files and labels ----------------------

def refused_before_training(tmp_path, monkeypatch, sets: str = "", head: str = "task.pooling=cls") -> str:
    """`lab run` of SPEC with the downstream `set` and the cls head's overrides replaced: its one error line,
    after checking that no training ran (the training function was never called) and nothing was written."""
    from tfkit.lab import engine

    trained = []
    monkeypatch.setattr(engine, "train_job", lambda *args: trained.append(args) or (0, 0.0))
    text = SPEC.replace("set: [train.max_steps=20]", f"set: [{sets}]").replace("cls: [task.pooling=cls]",
                                                                               f"cls: [{head}]")
    path = spec_file(tmp_path, text)
    out = tmp_path / "lab"
    line = one_error_line(runner.invoke(app, ["lab", "run", str(path), "--quick", "--seeds", "1", "--out", str(out)]))
    assert trained == [] and not out.exists()
    assert str(path) in line
    return line


def labelled(tmp_path, name: str, labels: str) -> str:
    path = tmp_path / name
    path.write_text("text,label\n" + "".join(f"text number {i},{label}\n" for i, label in enumerate(labels)))
    return str(path)


def test_a_bad_task_key_is_refused_before_any_training(tmp_path, monkeypatch):
    line = refused_before_training(tmp_path, monkeypatch, head="task.pooling=bogus")
    assert "variant small+cls:" in line
    assert "task.pooling: got 'bogus', expected null (the family's own) or one of cls, last, mean" in line


def test_a_pooling_the_variants_family_lacks_is_refused_before_any_training(tmp_path, monkeypatch):
    line = refused_before_training(tmp_path, monkeypatch, head="task.pooling=last")  # a decoder's pooling
    assert ("downstream small+cls: fine-tunes small (model.arch=bert): task.pooling: 'last' is not a pooling of "
            "bert models, which pool cls or mean") in line


def test_a_missing_labelled_file_is_refused_before_any_training(tmp_path, monkeypatch):
    line = refused_before_training(tmp_path, monkeypatch, f"data.train={tmp_path / 'missing.csv'}, data.valid=null")
    assert f"labelled data {tmp_path / 'missing.csv'}: no such file" in line


def test_a_validation_label_unseen_in_training_is_refused_before_any_training(tmp_path, monkeypatch):
    train, valid = labelled(tmp_path, "train.csv", "abab"), labelled(tmp_path, "valid.csv", "abc")
    line = refused_before_training(tmp_path, monkeypatch, f"data.train={train}, data.valid={valid}")
    assert "label 'c' never occurs in the training data" in line and "valid.csv:4" in line
