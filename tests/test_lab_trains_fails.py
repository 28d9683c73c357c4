"""`trains: A, fails: B`: a claim whose predicted outcome is that one run does not train (QK-norm at a learning
rate where the plain model diverges). The gates, which otherwise turn such a run into "not tested", decide it
seed by seed; a training the trainer stops on non-finite updates is a recorded divergence, not the end of the
lab; and the attention-logit probe that shows why such a run fails."""

import json
import math

import pytest
import torch
from typer.testing import CliRunner

from tfkit.checkpoints.weights import save_model
from tfkit.cli.main import app
from tfkit.lab.probes import attention_logits
from tfkit.lab.spec import Expectation, load_spec
from tfkit.lab.verdict import judge
from tfkit.models import build_model

from helpers import tiny_cfg


def gates(a: list[str], b: list[str], quick: bool = False) -> dict:
    """Results whose gates give run `a` and run `b` these statuses, one per seed."""
    def run(statuses: list[str], loss: float) -> dict:
        return {"kind": "train", "source": None,
                "seeds": {str(s): {"loss": loss if st == "trained" else 6.8, "unigram": 6.79, "step0": 8.3,
                                   "status": st} for s, st in enumerate(statuses, 1)}}
    return {"claim": "demo", "metric": "loss", "reference": "a", "options": {"quick": quick},
            "evals": {"docs-valid": "x"}, "probes": {}, "rows": {},
            "gates": {"label": "docs-valid", "min_gain": 0.05, "runs": {"a": run(a, 5.2), "b": run(b, 5.9)}}}


EXP = Expectation(source="paper", trains="a", fails="b")
T, F = "trained", "diverged"


@pytest.mark.parametrize("a, b, status", [
    ([T, T, T], [F, F, "did not learn"], "holds"),
    ([T, T, T], [T, T, T], "does not hold"),
    ([T, T, T], [F, T, F], "mixed"),
    ([F, F, F], [T, T, T], "reversed"),
    ([T, F, T], [F, F, F], "not tested"),
    ([F, F, F], [F, F, F], "not tested"),
])
def test_trains_where_the_other_does_not_is_read_from_the_gates(a, b, status):
    verdict = judge(EXP, gates(a, b))
    assert verdict.status == status and verdict.n == 3
    assert verdict.line.startswith(f"a trains where b does not on docs-valid: {status}")
    assert f"a trained {a.count(T)}/3" in verdict.line and f"b trained {b.count(T)}/3" in verdict.line
    assert "against unigram 6.790 and step 0 8.300" in verdict.line and verdict.line.endswith("— paper")
    if status == "not tested":
        assert "not tested: a did not train (seed" in verdict.line


def test_trains_where_the_other_does_not_needs_three_seeds_and_a_full_size_run():
    assert judge(EXP, gates([T, T], [F, F])).status == "no verdict"
    quick = judge(EXP, gates([T, T, T], [F, F, F], quick=True))
    assert quick.status == "no verdict" and "quick run" in quick.line and "b trained 0/3 (diverged: seeds 1, 2, 3)" \
        in quick.line


@pytest.mark.parametrize("item, message", [
    ("{trains: a, source: s}", "expect[0].fails: got None"),
    ("{trains: a, fails: a, source: s}", "trains and fails name the same run 'a'"),
    ("{better: a, than: b, fails: b, source: s}", "expect[0].fails: belongs to trains, not to better"),
    ("{same: [a, b], than: b, source: s}", "expect[0].than: belongs to better, not_worse or faster, not to same"),
    ("{trains: a, fails: b, better: a, source: s}", "exactly one of"),
])
def test_a_bad_trains_fails_expectation_is_one_line(tmp_path, item, message):
    spec = tmp_path / "bad.yaml"
    spec.write_text(f"base: gpt-tiny\nvariants: {{a: [], b: []}}\nexpect:\n  - {item}\n")
    result = CliRunner().invoke(app, ["lab", "run", str(spec), "--quick"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert message in result.output and str(spec) in result.output


def test_the_shipped_qk_norm_claim_predicts_the_plain_model_fails():
    spec = load_spec("qk-norm")
    assert [(e.trains, e.fails) for e in spec.expect if e.trains] == [("qknorm-high", "plain-high")]
    assert any(e.not_worse == "qknorm" and e.than == "plain" for e in spec.expect)


SPEC = """\
# a run that trains and one the trainer stops at once
base: gpt-tiny
reference: good
variants: {good: [], exploded: [optim.lr=1.0e+6, optim.grad_clip=null, schedule.warmup_steps=0]}
probes: {attention_logits: {runs: [good, exploded]}}
expect:
  - {trains: good, fails: exploded, source: test}
  - {better: good, than: exploded, source: test}
"""


def test_a_training_that_diverges_is_recorded_and_the_lab_goes_on(english_text, tmp_path):
    (tmp_path / "train.txt").write_text(english_text[:60_000])
    (tmp_path / "valid.txt").write_text(english_text[60_000:70_000])
    (tmp_path / "exploding.yaml").write_text(SPEC)
    args = ["lab", "run", str(tmp_path / "exploding.yaml"), "--quick", "--seeds", "1", "--data",
            str(tmp_path / "train.txt"), "--eval", str(tmp_path / "valid.txt"), "--out", str(tmp_path / "out"),
            "--set", f"data.valid={tmp_path / 'valid.txt'}"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    out = tmp_path / "out"
    results = json.loads((out / "results.json").read_text())
    gate = results["gates"]["runs"]["exploded"]["seeds"]["1337"]
    assert gate["status"] == "diverged" and "training diverged" in gate["why"]
    assert math.isnan(results["rows"]["exploded"]["scores"]["valid"]["1337"]["loss"])
    assert list(results["probes"]["attention_logits"]["values"]) == ["good"]  # nothing to probe in exploded
    trains, better = results["verdicts"]
    assert "exploded trained 0/1 (diverged: seed 1337), loss nan" in trains["line"]
    markdown = (out / "results.md").read_text()
    assert "| exploded | train | nan | - | - | 0/1 (diverged: seed 1337) |" in markdown
    assert "- exploded, seed 1337: training diverged:" in markdown
    again = CliRunner().invoke(app, args)  # continued: the divergence is not trained again
    assert again.exit_code == 0 and "train exploded/seed-1337: done before" in again.output


def test_the_attention_logit_probe_is_the_largest_scaled_score(tmp_path):
    """By hand on one layer; and QK-norm (RMSNorm, unit gains) bounds it by sqrt(d_head) however large the
    projections grow, where the plain model's logits grow with them."""
    ids = torch.randint(0, 61, (2, 12), generator=torch.Generator().manual_seed(0))  # (B, T)
    values = {}
    for qk in (False, True):
        torch.manual_seed(0)
        model = build_model(tiny_cfg("gpt", n_layers=1, norm="rmsnorm", qk_norm=qk))
        with torch.no_grad():
            attn = model.blocks[0].attn
            attn.q_proj.weight.mul_(100.0), attn.k_proj.weight.mul_(100.0)  # the growth a high rate gives
        save_model(model, tmp_path / str(qk))
        values[qk] = attention_logits(tmp_path / str(qk), {"input_ids": ids})
        if not qk:
            with torch.no_grad():  # the same number from the layer's input, spelled out
                h = model.blocks[0].norm_attn(model.embed(ids, None))  # (B, T, C)
                q = attn.q_proj(h).view(2, 12, 4, 8).transpose(1, 2)  # (B, H, T, D)
                k = attn.k_proj(h).view(2, 12, 4, 8).transpose(1, 2)  # (B, H, T, D)
                scores = (q @ k.transpose(-2, -1)) / math.sqrt(8)  # (B, H, T, T)
                causal = torch.ones(12, 12, dtype=torch.bool).tril()
                assert values[qk] == pytest.approx(float(scores.abs().masked_fill(~causal, 0).amax()), rel=1e-5)
    assert values[True] <= math.sqrt(8) + 1e-4 < 100 < values[False]
