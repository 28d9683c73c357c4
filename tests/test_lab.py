"""`tfkit lab`: spec errors are one line and exit 2; verdicts from paired differences; the report; a lab
continued in its folder redoes nothing that finished. The tiny lab here trains for seconds on a 60 kB file."""

import json

import pytest
from typer.testing import CliRunner

from tfkit.cli.main import app
from tfkit.lab import engine
from tfkit.lab.report import complete, render
from tfkit.lab.spec import Expectation, bundled_specs, load_spec
from tfkit.lab.verdict import coverage_warning, judge, summary
from helpers import one_error_line

runner = CliRunner()

SHIPPED = ("gqa-uptrain", "flash-exact", "masks", "prepost-warmup", "qk-scale", "positions", "norms", "embed-scale",
           "tie", "mlm-mask", "tokenizers", "muon-vs-adamw", "document-mask", "qk-norm", "pooling")


def lab(*args: str):
    return runner.invoke(app, ["lab", *args])


def test_every_required_claim_is_shipped_and_loads():
    assert set(SHIPPED) <= set(bundled_specs())
    for claim in SHIPPED:
        spec = load_spec(claim)
        assert spec.expect and all(e.source for e in spec.expect), claim
        assert spec.cost.get("cpu_minutes"), claim


def test_list_shows_every_claim():
    result = lab("list")
    assert result.exit_code == 0, result.output
    assert all(claim in result.output for claim in SHIPPED)


def test_unknown_claim_is_one_line_and_exit_2():
    line = one_error_line(lab("run", "gqa-uptrian", "--quick"))
    assert "'gqa-uptrian'" in line and "did you mean 'gqa-uptrain'" in line


def test_every_problem_of_a_spec_is_reported_at_once(tmp_path):
    spec = tmp_path / "bad.yaml"
    spec.write_text("base: gpt-tiny\nvariantz: {}\nvariants: {a: [], b: oops}\nreference: c\n"
                    "expect:\n  - {better: a, than: zz, source: me}\n  - {better: a, than: b}\n")
    line = one_error_line(lab("run", str(spec), "--quick"))
    for part in (str(spec), "variantz: unknown key (did you mean 'variants'?)", "variants.b: expected a list",
                 "reference: got 'c'", "expect[0].than: got 'zz'", "expect[1].source"):
        assert part in line, part


def test_a_bad_recipe_key_in_a_variant_names_the_variant(tmp_path):
    spec = tmp_path / "keys.yaml"
    spec.write_text("base: gpt-tiny\nvariants: {good: [], bad: [model.n_layerz=2]}\n")
    line = one_error_line(lab("run", str(spec), "--quick", "--out", str(tmp_path / "out")))
    assert "variant bad:" in line and "model.n_layerz" in line and "did you mean 'n_layers'" in line
    assert "variant good" not in line
    assert not (tmp_path / "out").exists()  # refused before anything was written


def test_report_of_a_folder_without_results_is_one_line(tmp_path):
    line = one_error_line(lab("report", str(tmp_path)))
    assert str(tmp_path) in line and "results.json" in line


# --- verdicts on synthetic numbers -----------------------------------------------------------------------

def results_with(rows: dict, probes: dict | None = None) -> dict:
    return {"claim": "demo", "metric": "loss", "reference": "mha", "seeds": [1, 2, 3],
            "evals": {"docs-valid": "stdlib:docs:valid"}, "probes": probes or {},
            "rows": {name: {"kind": "train", "scores": {"docs-valid": {str(s): {"loss": v} for s, v in
                                                                       enumerate(values, 1)}}}
                     for name, values in rows.items()}}


def test_verdict_lines_give_the_difference_and_its_interval():
    results = results_with({"mha": [5.89, 5.90, 5.88], "mean": [6.15, 6.16, 6.14], "first": [6.75, 6.70, 6.80]})
    held = judge(Expectation(source="GQA paper", better="mean", than="first"), results)
    assert held.status == "holds"
    assert held.line == ("mean < first on docs-valid: holds — Δ -0.6, 95% CI [-0.749, -0.451], n = 3 — GQA paper")
    reversed_ = judge(Expectation(source="s", better="first", than="mha"), results)
    assert reversed_.status == "reversed" and reversed_.line.startswith("first < mha on docs-valid: reversed — Δ +0.86")
    same = judge(Expectation(source="s", same=("mha", "mean"), tol=0.05), results)
    assert same.status == "differs"
    missing = judge(Expectation(source="s", better="mha", than="nobody"), results)
    assert missing.status == "missing"


def test_low_attention_reliance_warns_on_layout_comparisons():
    probes = {"attention_reliance": {"run": "mha", "threshold": 0.25,
                                     "values": {"docs-valid": {"1": 0.1, "2": 0.12, "3": 0.11}}}}
    results = results_with({"mha": [5.0, 5.1, 5.2], "gqa": [5.2, 5.3, 5.4]}, probes)
    verdict = judge(Expectation(source="s", better="mha", than="gqa"), results)
    assert "removing attention from mha costs only 0.110 nats" in verdict.warning
    assert judge(Expectation(source="s", probe="attention_reliance", run="mha", above=0.25), results).status == "reversed"
    probes["attention_reliance"]["values"]["docs-valid"] = {"1": 1.0, "2": 1.1, "3": 0.9}
    assert judge(Expectation(source="s", better="mha", than="gqa"), results).warning == ""


def test_a_lossy_tokenizer_under_bits_per_byte_is_warned_about():
    results = results_with({"bpe": [2.5, 2.5], "wordpiece": [2.2, 2.2]})
    results["metric"] = "bits_per_byte"
    for name, coverage in (("bpe", 1.0), ("wordpiece", 0.83)):
        for value in results["rows"][name]["scores"]["docs-valid"].values():
            value["bits_per_byte"], value["byte_coverage"] = value["loss"], coverage
    warning = coverage_warning(results, "docs-valid")
    assert "wordpiece 83.0%" in warning and "bpe" not in warning.split("(")[1].split(")")[0]
    results["metric"] = "loss"
    assert coverage_warning(results, "docs-valid") == ""


def test_summary_and_markdown_table():
    results = results_with({"mha": [5.9, 5.91, 5.89], "gqa": [6.1, 6.2, 6.0]})
    stats = summary(results)
    assert stats["gqa"]["docs-valid"]["delta"] == pytest.approx(0.2, abs=1e-9)
    assert stats["mha"]["docs-valid"]["delta"] is None
    spec = load_spec("gqa-uptrain")
    spec.expect = [Expectation(source="paper", better="mha", than="gqa")]
    text = render(complete(results, spec))
    assert "| mha (ref) | train | 5.900 ± 0.010 | - |" in text
    assert "| gqa | train | 6.100 ± 0.100 | +0.200 |" in text
    assert "- mha < gqa on docs-valid: inconclusive — Δ -0.2, 95% CI [-0.424, +0.0236], n = 3 — paper" in text
    assert "95% paired t interval" in text  # the rule is stated above the verdicts


def test_a_verdict_line_with_one_seed_has_no_interval_and_no_verdict():
    results = results_with({"a": [5.0], "b": [5.2]})
    line = judge(Expectation(source="src", better="a", than="b"), results).line
    assert line == "a < b on docs-valid: no verdict (1 seed; a verdict needs 3) — Δ -0.2, n = 1 (no interval from one seed) — src"


# --- a tiny lab, run twice -------------------------------------------------------------------------------

SPEC = """\
# a tiny conversion lab for the tests
base: gpt-tiny
reference: mha
variants: {mha: []}
convert: {from: mha, kv_heads: [2], methods: [mean]}
uptrain: {fractions: [0.5], set: [schedule.warmup_steps=1]}
probes: {attention_reliance: {run: mha}}
expect:
  - {better: kv2-mean+up50%, than: kv2-mean, source: test}
  - {same: [kv2-mean+up50%, mha+up50%], tol: 5, source: test}
"""


@pytest.fixture(scope="module")
def tiny_lab(english_text, tmp_path_factory):
    folder = tmp_path_factory.mktemp("lab")
    (folder / "train.txt").write_text(english_text[:60_000])
    (folder / "valid.txt").write_text(english_text[60_000:70_000])
    (folder / "tiny.yaml").write_text(SPEC)
    args = ["run", str(folder / "tiny.yaml"), "--quick", "--seeds", "1", "--data", str(folder / "train.txt"),
            "--eval", str(folder / "valid.txt"), "--set", f"data.valid={folder / 'valid.txt'}",
            "--out", str(folder / "out")]
    result = lab(*args)
    assert result.exit_code == 0, result.output
    return folder / "out", args


def test_the_lab_adds_controls_and_writes_table_json_and_verdicts(tiny_lab):
    out, _ = tiny_lab
    results = json.loads((out / "results.json").read_text())
    assert list(results["rows"]) == ["mha", "scratch-kv2", "kv2-mean", "kv2-mean+up50%", "mha+up50%", "mha-no-attn"]
    scores = {name: row["scores"]["valid"]["1337"] for name, row in results["rows"].items()}
    assert len({s["data_fingerprint"] for s in scores.values()}) == 1  # every checkpoint on the same tokens
    assert len(results["verdicts"]) == 2  # --quick and one seed: numbers, no verdict word
    assert all(v["status"] == "no verdict" and "quick run" in v["line"] for v in results["verdicts"])
    assert results["probes"]["attention_reliance"]["values"]["valid"]["1337"] == pytest.approx(
        scores["mha-no-attn"]["loss"] - scores["mha"]["loss"])
    markdown = (out / "results.md").read_text()
    assert "| kv2-mean+up50% | uptrain |" in markdown and "## Verdicts" in markdown


def test_a_continued_lab_redoes_only_what_is_missing(tiny_lab, monkeypatch):
    out, args = tiny_lab
    before = json.loads((out / "results.json").read_text())
    import shutil

    shutil.rmtree(out / "runs" / "mha+up50%")  # as if the lab had been killed before this run finished
    (out / "scores" / "mha+up50%-seed-1337.json").unlink()
    trained = []
    real = engine.train_job
    monkeypatch.setattr(engine, "train_job", lambda recipe, run_dir, log: trained.append(run_dir) or real(recipe, run_dir, log))
    result = lab(*args)
    assert result.exit_code == 0, result.output
    assert [p.parent.name for p in trained] == ["mha+up50%"]
    after = json.loads((out / "results.json").read_text())
    assert after["rows"]["mha"] == before["rows"]["mha"]  # read back, not recomputed
    assert after["rows"]["mha+up50%"]["scores"]["valid"]["1337"]["loss"] == pytest.approx(
        before["rows"]["mha+up50%"]["scores"]["valid"]["1337"]["loss"], abs=1e-5)


def test_a_score_of_other_rows_is_scored_again(tiny_lab, monkeypatch):
    """A score written before a score said what it read (no `covers`: the text's first eval.batches, whatever the
    lab) is scored again when the lab continues, and nothing is trained. This lab is --quick: its scores read the
    first eval.batches batches, and say so; a full lab's read all of the text."""
    out, args = tiny_lab
    before = json.loads((out / "results.json").read_text())
    path = out / "scores" / "mha-seed-1337.json"
    old = json.loads(path.read_text())
    old["valid"] = {k: v for k, v in old["valid"].items() if k != "covers"} | {"loss": 99.0}
    path.write_text(json.dumps(old))
    trained = []
    monkeypatch.setattr(engine, "train_job", lambda recipe, run_dir, log: trained.append(run_dir))
    result = lab(*args)
    assert result.exit_code == 0, result.output
    assert trained == []
    after, scored = json.loads(path.read_text())["valid"], before["rows"]["mha"]["scores"]["valid"]["1337"]
    assert after["covers"] == "first 2 batches" and after["loss"] == pytest.approx(scored["loss"])


def test_a_lab_folder_is_never_mixed(tiny_lab, tmp_path):
    out, args = tiny_lab
    other = [*args[:-1], str(out), "--steps", "3"]  # other options: refused (more seeds are a second look)
    assert "holds a lab of" in one_error_line(lab(*other))
    (tmp_path / "mine.txt").write_text("a user's file")
    foreign = [*args[:-1], str(tmp_path)]
    assert "is not a lab folder" in one_error_line(lab(*foreign))
    assert (tmp_path / "mine.txt").read_text() == "a user's file"


def test_report_rebuilds_the_files(tiny_lab):
    out, _ = tiny_lab
    (out / "results.md").unlink()
    result = lab("report", str(out))
    assert result.exit_code == 0, result.output
    assert "## Verdicts" in (out / "results.md").read_text()


def test_the_plan_adds_baselines_conversions_uptraining_and_same_steps_controls():
    from tfkit.lab.plan import LabOptions, plan_jobs, resolve_recipes

    spec = load_spec("gqa-uptrain")
    jobs = plan_jobs(spec, [1, 2])
    names = {(j.name, j.kind) for j in jobs if j.seed == 1}
    layouts = {(f"kv{k}-{m}{up}", "uptrain" if up else "convert") for k in (1, 2) for m in ("mean", "first", "random")
               for up in ("", "+up5%")}  # GQA-2 and MQA, each method before and after uptraining
    assert names == {("mha", "train"), ("scratch-kv2", "train"), ("scratch-kv1", "train"), ("mha+up5%", "uptrain"),
                     *layouts}
    recipes = resolve_recipes(spec, LabOptions(steps=200), jobs)
    uptrained, control = recipes["kv2-mean+up5%/seed-1"], recipes["mha+up5%/seed-1"]
    assert uptrained.train.max_steps == control.train.max_steps == 10  # 5% of --steps 200, for both
    assert uptrained.model.n_kv_heads == 2 and control.model.n_kv_heads is None
    assert uptrained.optim.lr == control.optim.lr == 1e-3  # uptrain.set applies to the control too
    assert recipes["scratch-kv2/seed-2"].model.n_kv_heads == 2 and recipes["mha/seed-2"].train.max_steps == 200
