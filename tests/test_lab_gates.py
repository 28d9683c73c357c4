"""The lab's gates: a run that never trained (here: learning rate 1e-9) is caught against the unigram model
of its training text and its step-0 loss, and no comparison involving it is reported as a finding; and the
scale every report opens with (parameters, tokens seen, tokens per parameter, epochs, precision); and a
model that sees later tokens while it trains (BatchNorm in a GPT) makes its comparisons invalid."""

import json
import math
from collections import Counter

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from tfkit.cli.main import app
from tfkit.lab.gates import MIN_GAIN, gate, unigram_loss
from tfkit.lab.spec import Expectation, load_spec
from tfkit.lab.verdict import judge

TINY = ("model.d_model=32", "model.n_layers=1", "model.n_heads=4", "model.max_seq_len=64", "data.seq_len=32",
        "tokenizer.vocab_size=320", "tokenizer.max_train_mb=0.1", "train.max_steps=60", "train.batch_size=8",
        "train.log_every=20", "train.eval_every=20", "train.save_every=60", "schedule.warmup_steps=2",
        "eval.batches=2", "eval.batch_size=4", "optim.lr=1e-2")

SPEC = """\
# a run that trains and one whose weights barely move
base: gpt-tiny
reference: good
variants: {good: [], frozen: [optim.lr=1e-9, schedule.min_lr=0]}
expect:
  - {better: good, than: frozen, source: test}
"""


def test_the_unigram_figure_is_the_smoothed_cross_entropy():
    train, labels, vocab = np.array([0, 0, 0, 1, 2, 2]), np.array([0, 2, 3]), 5
    counts = Counter(train.tolist())
    expected = -sum(math.log((counts[t] + 1) / (len(train) + vocab)) for t in labels.tolist()) / len(labels)
    assert unigram_loss(train, labels, vocab) == pytest.approx(expected, rel=1e-12)


def test_the_gate_of_one_run():
    assert gate(4.3, unigram=4.5, step0=5.7, from_scratch=True) == "trained"
    assert gate(4.5 - MIN_GAIN / 2, unigram=4.5, step0=5.7, from_scratch=True) == "did not learn"
    assert gate(5.7, unigram=4.5, step0=5.7, from_scratch=True) == "did not learn"  # never moved
    assert gate(9.0, unigram=4.5, step0=5.7, from_scratch=True) == "diverged"
    assert gate(float("nan"), unigram=4.5, step0=5.7, from_scratch=True) == "diverged"
    assert gate(4.3, unigram=4.5, step0=4.2, from_scratch=False) == "trained"  # uptraining may end above its start


def results_with_gates(failed: str) -> dict:
    rows = {"mha": [5.0, 5.1, 5.2], "kv2-mean": [5.3, 5.4, 5.5], "kv2-first": [5.6, 5.7, 5.8]}
    seeds = {"1": 0.0, "2": 0.0, "3": 0.0}
    runs = {"mha": {"kind": "train", "source": None,
                    "seeds": {s: {"loss": 6.79 if failed else 5.0, "unigram": 6.78, "step0": 8.3,
                                  "status": failed or "trained"} for s in seeds}},
            "kv2-mean": {"kind": "convert", "source": "mha", "seeds": {}},
            "kv2-first": {"kind": "convert", "source": "mha", "seeds": {}}}
    return {"claim": "demo", "metric": "loss", "reference": "mha", "evals": {"docs-valid": "x"}, "probes": {},
            "gates": {"label": "docs-valid", "min_gain": MIN_GAIN, "runs": runs},
            "rows": {name: {"kind": "train", "scores": {"docs-valid": {str(s): {"loss": v} for s, v in
                                                                       enumerate(values, 1)}}}
                     for name, values in rows.items()}}


def test_a_comparison_of_conversions_of_a_run_that_did_not_train_is_not_tested():
    exp = Expectation(source="s", better="kv2-mean", than="kv2-first")
    verdict = judge(exp, results_with_gates("did not learn"))
    assert verdict.status == "not tested"
    assert verdict.line.startswith("kv2-mean < kv2-first on docs-valid: not tested: mha did not train (seed 1: did "
                                   "not learn, loss 6.790 against unigram 6.780 and step 0 8.300;")
    assert "95% CI [" in verdict.line  # the numbers are still there
    assert judge(exp, results_with_gates("")).status == "holds"


@pytest.fixture(scope="module")
def gate_lab(english_text, tmp_path_factory):
    """A lab of 2 tiny runs (seconds): `good` learns, `frozen` (lr 1e-9) does not."""
    folder = tmp_path_factory.mktemp("gates")
    (folder / "train.txt").write_text(english_text[:60_000])
    (folder / "valid.txt").write_text(english_text[60_000:70_000])
    (folder / "gate.yaml").write_text(SPEC)
    args = ["lab", "run", str(folder / "gate.yaml"), "--seeds", "1", "--data", str(folder / "train.txt"),
            "--eval", str(folder / "valid.txt"), "--out", str(folder / "out"),
            "--set", f"data.valid={folder / 'valid.txt'}", *[x for s in TINY for x in ("--set", s)]]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return folder / "out"


def test_a_run_that_did_not_train_is_caught_and_not_compared(gate_lab):
    results = json.loads((gate_lab / "results.json").read_text())
    good, frozen = (results["gates"]["runs"][n]["seeds"]["1337"] for n in ("good", "frozen"))
    assert good["status"] == "trained" and good["loss"] < good["unigram"] - MIN_GAIN < good["step0"]
    assert frozen["status"] == "did not learn"
    # the step-0 figure is the run's own initial weights: a run that never moved ends exactly there
    assert frozen["step0"] == pytest.approx(frozen["loss"], abs=1e-4)
    assert good["step0"] == pytest.approx(frozen["step0"])  # one seed, one initialisation
    (verdict,) = results["verdicts"]
    assert verdict["status"] == "not tested"
    assert verdict["line"].startswith("good < frozen on valid: not tested: frozen did not train (seed 1337: did not "
                                      "learn")
    markdown = (gate_lab / "results.md").read_text()
    assert "| frozen | train |" in markdown and "0/1 (did not learn: seed 1337)" in markdown


def test_the_unigram_figure_is_over_the_tokens_the_loss_is_scored_on(gate_lab):
    """The gate holds a run's loss against the unigram loss of the same tokens: all of the eval text, as the
    score reads it (not its first eval.batches), and a figure cached under the old rule is computed again."""
    from tfkit.lab.gates import scored_labels
    from tfkit.trainer.recipe import load_recipe

    results = json.loads((gate_lab / "results.json").read_text())
    run = gate_lab / "runs" / "good" / "seed-1337"
    checkpoint = max((run / "checkpoints").iterdir())
    recipe = load_recipe(str(run / "recipe.yaml"))
    labels = scored_labels(checkpoint, results["evals"]["valid"], recipe, gate_lab / "data")
    score = results["rows"]["good"]["scores"]["valid"]["1337"]
    assert len(labels) == score["tokens"] > recipe.eval.batches * recipe.eval.batch_size * recipe.data.seq_len
    saved = json.loads((gate_lab / "gates" / "good-seed-1337.json").read_text())
    assert set(saved) == {"unigram/all", "step0/all"}


def test_the_report_opens_with_the_scale_of_the_runs(gate_lab):
    results = json.loads((gate_lab / "results.json").read_text())
    good = results["scale"]["good"]
    assert good["tokens"] == 60 * 8 * 32  # steps x batch x seq_len: every input token the run consumed
    assert good["steps"] == 60 and good["precision"] in ("fp32", "bf16", "fp16")
    params = results["rows"]["good"]["scores"]["valid"]["1337"]["params"]
    assert good["params"] == params and 0 < good["train_tokens"] < 60_000  # the tokens of train.txt
    markdown = (gate_lab / "results.md").read_text()
    head = markdown.split("## Verdicts")[0]
    assert "| run | kind | parameters | steps | tokens seen | tokens / parameter | epochs | precision |" in head
    per_param, epochs = f"{15360 / params:.3g}", f"{15360 / good['train_tokens']:.3g}"
    assert f"| good | train | {params / 1e3:.3g}k | 60 | 15.4k | {per_param} | {epochs} | {good['precision']} |" in head


@pytest.mark.parametrize("arch", ["gpt", "bert"])
def test_the_mask_leak_probe_sees_batchnorm_look_ahead_in_training(arch, tmp_path):
    """In eval mode BatchNorm uses running statistics and hides nothing; in training its statistics span
    every position of the batch, so a GPT's earlier outputs move with later tokens. A BERT's padding stays
    out of its statistics. Dropout is on: both forwards must draw the same masks."""
    from tfkit.checkpoints.weights import save_model
    from tfkit.lab.probes import mask_leak
    from tfkit.models import build_model
    from tfkit.models.config import ModelConfig

    leaks = {}
    for norm in ("layernorm", "batchnorm"):
        cfg = ModelConfig.from_dict({"arch": arch, "vocab_size": 100, "d_model": 32, "n_layers": 1, "n_heads": 4,
                                     "max_seq_len": 32, "norm": norm, "dropout": 0.1})
        torch.manual_seed(0)
        save_model(build_model(cfg), tmp_path / norm)
        leaks[norm] = mask_leak(tmp_path / norm, {"input_ids": torch.randint(0, 100, (4, 16))})
    assert leaks["layernorm"] == 0.0
    assert (leaks["batchnorm"] > 1e-3) == (arch == "gpt")


def test_a_comparison_with_a_model_that_sees_later_tokens_is_invalid():
    results = results_with_gates("")
    results["options"] = {"quick": True}  # the leak is the architecture's: it shows at any size
    results["probes"] = {"mask_leak": {"values": {"mha": {"1": 0.0}, "kv2-mean": {"1": 0.12}}}}
    verdict = judge(Expectation(source="s", better="mha", than="kv2-mean"), results)
    assert verdict.status == "invalid"
    assert verdict.line.startswith("mha < kv2-mean on docs-valid: invalid for a causal model: kv2-mean's outputs "
                                   "change by up to 0.12 when only tokens its mask hides change")
    results["probes"]["mask_leak"]["values"]["kv2-mean"]["1"] = 0.0
    assert judge(Expectation(source="s", better="mha", than="kv2-mean"), results).status == "no verdict"
    assert "batchnorm" in load_spec("norms").probes["mask_leak"]["runs"]


MLM_SPEC = """\
# two BERTs: the gate and the metric read the [MASK]ed positions only
base: bert-tiny
reference: a
metric: masked_loss
variants: {a: [], b: [objective.mask_prob=0.3]}
expect:
  - {better: a, than: b, source: test}
"""


def test_an_mlm_model_is_gated_and_judged_on_its_masked_positions(tmp_path, english_text):
    """Under 80/10/10 a tenth of the targets stand in the input; the gate reads the loss where every chosen
    position is [MASK] (nothing to copy), against the unigram figure of those positions."""
    (tmp_path / "train.txt").write_text(english_text[:60_000])
    (tmp_path / "valid.txt").write_text(english_text[60_000:70_000])
    (tmp_path / "spec.yaml").write_text(MLM_SPEC)
    result = CliRunner().invoke(app, ["lab", "run", str(tmp_path / "spec.yaml"), "--seeds", "1", "--data",
                                      str(tmp_path / "train.txt"), "--eval", str(tmp_path / "valid.txt"),
                                      "--out", str(tmp_path / "out"), *[x for s in TINY for x in ("--set", s)],
                                      "--set", f"data.valid={tmp_path / 'valid.txt'}"])
    assert result.exit_code == 0, result.output
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    gates = results["gates"]
    assert gates["metric"] == "masked_loss"
    for name in ("a", "b"):
        score = results["rows"][name]["scores"]["valid"]["1337"]
        gate_entry = gates["runs"][name]["seeds"]["1337"]
        assert gate_entry["loss"] == score["masked_loss"] != score["loss"]
        assert 0 < score["masked_tokens"] <= score["tokens"] * 1.5
    saved = json.loads((tmp_path / "out" / "gates" / "a-seed-1337.json").read_text())
    assert set(saved) == {"unigram_masked/all", "step0_masked/all"}  # of the masked positions, not the mixed loss
    assert "Loss on the [MASK]ed positions only" in (tmp_path / "out" / "results.md").read_text()
    assert results["verdicts"][0]["mean"] == pytest.approx(
        results["rows"]["a"]["scores"]["valid"]["1337"]["masked_loss"]
        - results["rows"]["b"]["scores"]["valid"]["1337"]["masked_loss"])
