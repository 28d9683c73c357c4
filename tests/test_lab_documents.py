"""`whole_documents`: a lab scores every eval text document by document as well as in packed blocks (columns
LABEL@whole), every checkpoint on the same windows under its own layout, and reports how documents fall into
the packed rows, the figure that says whether a document mask can matter at all."""

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from tfkit.cli.main import app
from tfkit.lab.documents import packing_figures
from tfkit.lab.spec import load_spec


def test_the_packing_figures_by_hand():
    # documents of 3, 2, 4 and 3 tokens; rows of 4 inputs: [d0 d0 d0 d1] [d1 d2 d2 d2] (the last token is a label)
    f = packing_figures(np.array([0, 3, 5, 9, 12]), 12, 4)
    assert (f["documents"], f["median_tokens"], f["rows"]) == (4, 3.0, 2)
    assert f["documents_per_row"] == 2.0
    assert f["after_another"] == 0.5  # 1 token of row 0 and 3 of row 1 have another document before them
    one = packing_figures(np.array([0, 100]), 100, 8)  # one long document: a mask would change nothing
    assert (one["documents_per_row"], one["after_another"]) == (1.0, 0.0)


@pytest.mark.parametrize("text, message", [
    ("base: gpt-tiny\nwhole_documents: yes please\nvariants: {a: []}\n",
     "whole_documents: got 'yes please', expected true or false"),
    ("base: bert-tiny\nwhole_documents: true\nvariants: {a: []}\n",
     "whole_documents: scores documents with causal sliding windows, but a/seed-1337 trains objective.name=mlm"),
])
def test_a_bad_whole_documents_setting_is_one_line(tmp_path, text, message):
    spec = tmp_path / "bad.yaml"
    spec.write_text(text)
    result = CliRunner().invoke(app, ["lab", "run", str(spec), "--quick", "--seeds", "1", "--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert message in " ".join(result.output.split()) and not (tmp_path / "o").exists()


SPEC = """\
# packing across documents against keeping them apart
base: gpt-tiny
whole_documents: true
reference: across
variants: {across: [], apart: [data.document_mask=true, data.reset_positions=true]}
expect:
  - {better: apart, than: across, eval: valid@whole, source: test}
"""


def test_a_lab_scores_whole_documents_beside_packed_blocks(english_text, tmp_path):
    docs = [d for d in english_text.split("\n\n") if d.strip()]
    for name, part in (("train", docs[:400]), ("valid", docs[400:460])):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in part))
    (tmp_path / "docs.yaml").write_text(SPEC)
    result = CliRunner().invoke(app, [
        "lab", "run", str(tmp_path / "docs.yaml"), "--quick", "--seeds", "1", "--data", str(tmp_path / "train.jsonl"),
        "--eval", str(tmp_path / "valid.jsonl"), "--set", f"data.valid={tmp_path / 'valid.jsonl'}",
        "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    scores = {name: row["scores"] for name, row in results["rows"].items()}
    for name in ("across", "apart"):
        packed, whole = scores[name]["valid"]["1337"], scores[name]["valid@whole"]["1337"]
        assert packed["loss"] != whole["loss"] and whole["seq_len"] == packed["seq_len"] == 32
    whole = [scores[name]["valid@whole"]["1337"] for name in ("across", "apart")]
    assert whole[0]["data_fingerprint"] == whole[1]["data_fingerprint"]  # the same windows for every layout
    assert whole[0]["tokens"] <= 2 * 4 * 32 + 4 * 32  # --quick: eval.batches x batch x seq_len, and the batch past it
    (verdict,) = results["verdicts"]
    assert verdict["on"] == "valid@whole" and verdict["n"] == 1
    figures = results["documents"]
    assert set(figures) == {"train", "valid"} and figures["train"]["documents"] == 400
    assert figures["train"]["documents_per_row"] > 1 and 0 < figures["train"]["after_another"] < 1
    markdown = (tmp_path / "out" / "results.md").read_text()
    assert "## Documents in packed rows" in markdown and "| across (ref) | train |" in markdown
    assert "valid@whole" in markdown.split("## Verdicts")[0]  # a column of the table


def test_the_shipped_document_claim_is_judged_on_whole_documents():
    spec = load_spec("document-mask")
    assert spec.whole_documents and set(spec.variants) == {"across", "apart", "apart-reset"}
    assert [e.on for e in spec.expect if e.better] == ["docs-valid@whole"]
