"""Two eval texts by default and a flag where they disagree; probe values compared between runs like losses;
per-layer probes judged on their mean; each MLM model scored on its own masking; spec errors for the new keys
one line."""

import pytest
from typer.testing import CliRunner

from tfkit.cli.main import app
from tfkit.lab.engine import default_evals, prepare
from tfkit.lab.plan import LabOptions
from tfkit.lab.spec import Expectation, load_spec
from tfkit.lab.verdict import counterparts, judge

TEXTS = {"docs-valid": "stdlib:docs:valid", "code-valid": "stdlib:code:valid"}


def results_with(rows: dict, probes: dict | None = None, seeds: int = 3) -> dict:
    """rows: {name: {label: [value per seed]}}."""
    return {"claim": "demo", "metric": "loss", "reference": "a", "seeds": list(range(1, seeds + 1)), "evals": TEXTS,
            "probes": probes or {}, "options": {"quick": False},
            "rows": {name: {"kind": "train", "scores": {label: {str(s): {"loss": v} for s, v in enumerate(values, 1)}
                                                         for label, values in labels.items()}}
                     for name, labels in rows.items()}}


def test_a_lab_scores_its_own_held_out_text_and_one_other_by_default(tmp_path):
    assert default_evals("stdlib:docs:valid") == ["stdlib:docs:valid", "stdlib:code:valid"]
    assert default_evals("stdlib:code:valid") == ["stdlib:code:valid", "stdlib:docs:valid"]
    assert default_evals("mine.txt") == ["mine.txt", "stdlib:docs:valid"]
    assert default_evals(None) == []
    lab = prepare(load_spec("qk-scale"), LabOptions(quick=True, seeds=1), tmp_path / "lab")
    assert lab.evals == TEXTS  # the first is the lab's own data: gates and default verdicts read it
    named = prepare(load_spec("qk-scale"), LabOptions(quick=True, seeds=1, evals=["x.txt"]), tmp_path / "named")
    assert named.evals == {"x": "x.txt"}  # --eval replaces the default


def test_every_comparison_gives_the_other_text_and_flags_opposite_directions():
    agree = results_with({"a": {"docs-valid": [5.0, 5.1, 5.2], "code-valid": [6.0, 6.1, 6.2]},
                          "b": {"docs-valid": [5.3, 5.42, 5.5], "code-valid": [6.2, 6.33, 6.4]}})
    verdict = judge(Expectation(source="s", better="a", than="b"), agree)
    assert verdict.status == "holds" and [o["on"] for o in verdict.others] == ["code-valid"]
    assert "— on code-valid: Δ -0.21, 95% CI [-0.253, -0.167], n = 3 — s" in verdict.line
    assert "texts disagree" not in verdict.line
    against = results_with({"a": {"docs-valid": [5.0, 5.1, 5.2], "code-valid": [6.5, 6.6, 6.72]},
                            "b": {"docs-valid": [5.3, 5.42, 5.5], "code-valid": [6.2, 6.33, 6.4]}})
    flagged = judge(Expectation(source="s", better="a", than="b"), against)
    assert flagged.status == "holds"  # judged on its own text, flagged for the other
    assert ("[texts disagree: Δ is lower than 0 on docs-valid but higher on code-valid (both 95% intervals "
            "exclude 0)]") in flagged.line
    noisy = results_with({"a": {"docs-valid": [5.0, 5.1, 5.2], "code-valid": [6.5, 6.0, 6.72]},
                          "b": {"docs-valid": [5.3, 5.42, 5.5], "code-valid": [6.2, 6.33, 6.4]}})
    assert judge(Expectation(source="s", better="a", than="b"), noisy).disagree == ""  # code-valid's includes 0
    assert counterparts(agree, "docs-valid@2x") == ["code-valid@2x"]
    assert counterparts(agree, "code-valid@whole") == ["docs-valid@whole"]


def attention(values: dict) -> dict:
    """probes.attention values from {run: [entropy per layer, one list per seed]}."""
    return {"attention": {"values": {run: {str(s): {"entropy": layers, "max_prob": layers, "spread": layers}
                                           for s, layers in enumerate(seeds, 1)} for run, seeds in values.items()}}}


@pytest.mark.parametrize("a, status", [
    ([[1.0, 1.2], [1.1, 1.3], [0.9, 1.1]], "holds"),  # below b's in every seed, by about 1
    ([[3.0, 3.2], [3.1, 3.3], [2.9, 3.1]], "reversed"),
    ([[1.0, 1.2], [3.1, 3.3], [2.0, 2.2]], "inconclusive"),
])
def test_a_probe_bound_naming_a_run_is_a_paired_comparison_of_layer_means(a, status):
    b = [[2.0, 2.2], [2.1, 2.3], [2.0, 2.1]]
    losses = {"docs-valid": [5, 5, 5]}
    results = results_with({"a": losses, "b": losses}, attention({"a": a, "b": b}))
    verdict = judge(Expectation(source="s", probe="attention_entropy", run="a", below="b"), results)
    assert verdict.status == status and verdict.n == 3
    assert verdict.line.startswith(f"attention_entropy of a < b's: {status} — a ")
    means = [sum(x) / 2 - sum(y) / 2 for x, y in zip(a, b)]
    assert verdict.mean == pytest.approx(sum(means) / 3)
    above = judge(Expectation(source="s", probe="attention_entropy", run="a", above="b"), results)
    assert above.status == {"holds": "reversed", "reversed": "holds", "inconclusive": "inconclusive"}[status]


def test_a_probe_comparison_needs_three_seeds_and_trained_runs():
    values = attention({"a": [[1.0], [1.1]], "b": [[2.0], [2.1]]})
    two = results_with({"a": {"docs-valid": [5, 5]}, "b": {"docs-valid": [5, 5]}}, values, seeds=2)
    assert judge(Expectation(source="s", probe="attention_entropy", run="a", below="b"), two).status == "no verdict"
    one = results_with({}, attention({"a": [[1.0]], "b": [[2.0]]}), seeds=1)
    line = judge(Expectation(source="s", probe="attention_entropy", run="a", below="b"), one).line
    assert line == ("attention_entropy of a < b's: no verdict (1 seed; a verdict needs 3) — a 1, b 2; Δ -1, n = 1 "
                    "(no interval from one seed) — s")
    three = results_with({}, attention({"a": [[1.0], [1.1], [1.0]], "b": [[2.0], [2.1], [2.0]]}))
    three["gates"] = {"runs": {"a": {"kind": "train", "source": None, "seeds": {str(s): {
        "status": "did not learn", "loss": 6.8, "unigram": 6.79, "step0": 8.3} for s in (1, 2, 3)}}}}
    verdict = judge(Expectation(source="s", probe="attention_entropy", run="a", below="b"), three)
    assert verdict.status == "not tested" and "a did not train" in verdict.line


def test_a_threshold_on_a_per_layer_probe_reads_its_layer_mean():
    results = results_with({}, {"residual_update": {"values": {"a": {"1": [0.2, 0.6], "2": [0.3, 0.5],
                                                                      "3": [0.1, 0.5]}}}})
    verdict = judge(Expectation(source="s", probe="residual_update", run="a", below=0.35), results)
    assert verdict.status == "mixed" and verdict.holding == 1  # layer means 0.4, 0.4, 0.3: one below 0.35
    assert verdict.mean == pytest.approx((0.4 + 0.4 + 0.3) / 3)


def one_line(tmp_path, body: str) -> str:
    spec = tmp_path / "bad.yaml"
    spec.write_text(body)
    result = CliRunner().invoke(app, ["lab", "run", str(spec), "--quick", "--out", str(tmp_path / "out")])
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and str(spec) in lines[0], result.output
    return lines[0]


@pytest.mark.parametrize("body, message", [
    ("variants: {a: [], b: []}\nprobes: {attention: {runs: [a]}}\nexpect:\n"
     "  - {probe: attention_entropy, run: a, below: b, source: s}\n",
     "expect[0]: probes.attention does not measure 'b' (it measures a)"),
    ("variants: {a: [], b: []}\nexpect:\n  - {probe: residual_update, run: a, below: 0.5, source: s}\n",
     "expect[0].probe: residual_update is measured by probes.residual_update, which the spec does not run"),
    ("variants: {a: [], b: []}\nprobes: {attention: {}}\nexpect:\n"
     "  - {probe: attention_spread, run: a, above: nobody, source: s}\n", "expect[0].above: got 'nobody'"),
    ("variants: {a: [], b: []}\nprobes: {attention: {runs: [zz]}}\n", "probes.attention: run 'zz' is none of"),
    ("variants: {a: [], b: []}\nprobes: {lengths: [1, 2]}\n", "probes.lengths: got [1, 2], expected factors of 2"),
    ("variants: {a: []}\nown_masking: yes please\n", "own_masking: got 'yes please', expected true or false"),
    ("variants: {a: []}\nown_masking: true\n", "own_masking: scores each model under the masking it trained with"),
])
def test_a_bad_probe_or_column_setting_is_one_line(tmp_path, body, message):
    assert message in one_line(tmp_path, "base: gpt-tiny\n" + body)


def test_the_lengths_probe_refuses_a_bidirectional_model(tmp_path):
    line = one_line(tmp_path, "base: bert-tiny\nvariants: {a: []}\nprobes: {lengths: [2]}\n"
                              "quick: [model.max_seq_len=64]\n")
    assert "probes.lengths: splits each row at the training length" in line and "objective.name=mlm" in line


def test_own_masking_scores_under_the_masking_a_model_trained_with(eval_tokenizers, valid_file, tmp_path):
    """The targets of an @own column: 40% of the tokens for a model trained at 40%, none kept or random for a
    model trained with [MASK] only; the common column keeps 15% with 80/10/10."""
    from tfkit.evaluation.evaluate import eval_batches
    from tfkit.tokenization import load_tokenizer

    tokenizer = load_tokenizer(eval_tokenizers["wordpiece"])

    def first(masking):
        batches, _ = eval_batches(tokenizer, str(valid_file), "mlm", seq_len=64, batch_size=8, stride=None, seed=0,
                                  cache_dir=tmp_path, show_progress=False, masking=masking)
        return next(iter(batches))

    share = {}
    for name, masking in (("common", None), ("p40", {"mask_prob": 0.4}), ("mask-only", {"mask_replace": [1.0, 0, 0]})):
        batch = first(masking)
        scored = batch["labels"] != -100  # (B, T)
        share[name] = float(scored.float().mean())
        if name == "mask-only":
            assert bool((batch["input_ids"][scored] == tokenizer.mask_id).all())
    assert share["p40"] > 2 * share["common"] and abs(share["mask-only"] - share["common"]) < 0.02
    assert not bool((first(None)["input_ids"][first(None)["labels"] != -100] == tokenizer.mask_id).all())
