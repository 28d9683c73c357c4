"""Scoring a checkpoint under the packed layout it trained with (`data.document_mask`, `data.reset_positions`):
packed blocks score what its own validation scored, and a whole-document window (sliding windows, `stride`)
shows a document-masked model each document exactly as if it were alone in its row."""

import json

import numpy as np
import pytest
import torch

from tfkit.checkpoints.record import CheckpointRecord, DataRecord
from tfkit.checkpoints.run_record import read_metrics
from tfkit.evaluation.evaluate import EvalRequest, evaluate, sliding_windows, trained_layout, window_batches
from tfkit.models import build_model
from tfkit.tokenization.shards import TokenShards
from tfkit.trainer.recipe import load_recipe
from tfkit.trainer.run import pretrain

from helpers import tiny_cfg, write_recipe


def test_the_layout_comes_from_the_checkpoints_record():
    def layout(**data):
        return trained_layout(CheckpointRecord(tiny_cfg("gpt"), data=DataRecord(**data) if data else None))

    assert layout() == {"document_mask": False, "reset_positions": False}  # imports, older checkpoints
    assert layout(document_mask=True) == {"document_mask": True, "reset_positions": False}
    assert layout(document_mask=True, reset_positions=True)["reset_positions"]
    assert not layout(document_mask=False, reset_positions=True)["reset_positions"]


@pytest.fixture(scope="module")
def masked_run(english_text, tmp_path_factory):
    """A 12-step run with a document mask and restarted positions on JSONL documents (one per line), validated on
    all of its validation file."""
    folder = tmp_path_factory.mktemp("masked")
    docs = [d for d in english_text.split("\n\n") if d.strip()]
    for name, part in (("train", docs[:300]), ("valid", docs[300:360])):
        (folder / f"{name}.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in part))
    path = write_recipe(folder, english_text, data={"train": str(folder / "train.jsonl"),
                                                    "valid": str(folder / "valid.jsonl"),
                                                    "document_mask": True, "reset_positions": True},
                        train={"max_steps": 12, "eval_every": 12, "save_every": 12},
                        eval={"batches": 1000})  # the whole validation file, as `evaluate` scores it
    run_dir = folder / "run"
    pretrain(load_recipe(str(path)), run_dir=run_dir)
    return run_dir, folder / "valid.jsonl"


def test_a_document_masked_checkpoint_scores_what_it_validated(masked_run, tmp_path):
    run_dir, valid = masked_run
    val_loss = [r["val_loss"] for r in read_metrics(run_dir / "metrics.jsonl") if "val_loss" in r][-1]
    checkpoint = run_dir / "checkpoints" / "step-12"
    config = json.loads((checkpoint / "config.json").read_text())
    assert trained_layout(CheckpointRecord.read(checkpoint)) == {"document_mask": True, "reset_positions": True}
    request = EvalRequest(batch_size=8, seq_len=32, cache_dir=tmp_path / "cache", show_progress=False)
    masked = evaluate(checkpoint, str(valid), request)
    assert masked["loss"] == pytest.approx(val_loss, abs=1e-5)
    del config["data"]["document_mask"]  # the same weights scored as if they had trained attending across
    (checkpoint / "config.json").write_text(json.dumps(config))
    try:
        across = evaluate(checkpoint, str(valid), request)
        assert abs(across["loss"] - val_loss) > 1e-4  # 12 steps: 4e-4
        assert across["data_fingerprint"] == masked["data_fingerprint"]  # the same tokens, read two ways
    finally:
        config["data"]["document_mask"] = True
        (checkpoint / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize("positions", ["learned", "rope"])
def test_a_whole_document_window_shows_each_document_as_if_alone(positions):
    """`SEP doc SEP` under the document layout: the separator before the document ends the one before it,
    so every token of the document is predicted exactly as from the document alone at positions 0.."""
    sep, tokens = 0, np.array([5, 6, 7, 8, 9, 0, 12, 13, 14, 0])  # two documents, each ending with SEP
    shards = TokenShards(tokens, np.array([0, 6, 10]), 30, sep, {})
    torch.manual_seed(0)
    model = build_model(tiny_cfg("gpt", positions=positions)).eval()
    windows = list(sliding_windows(shards, seq_len=8, stride=4))
    assert [w.lead for w in windows] == [1, 1]  # each opens with the separator put before its document
    batch = next(window_batches(iter(windows), 8, 2, document_mask=True, reset_positions=True))
    assert batch["doc_ids"][0].tolist() == [0, 1, 1, 1, 1, 1, 1, 1]  # padding joins the document
    assert batch["position_ids"][0].tolist() == [0, 0, 1, 2, 3, 4, 5, 6]
    with torch.no_grad():
        logits = model(batch["input_ids"], doc_ids=batch["doc_ids"], position_ids=batch["position_ids"])
        for row, doc in enumerate(([5, 6, 7, 8, 9], [12, 13, 14])):
            alone = model(torch.tensor([doc]))  # (1, n, V): the document with nothing before it
            torch.testing.assert_close(logits[row, 1:1 + len(doc)], alone[0], rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(logits[row, 0], model(torch.tensor([[sep]]))[0, 0], rtol=1e-5, atol=1e-5)
        plain = model(next(window_batches(iter(windows), 8, 2))["input_ids"])  # attends to the separator
    assert not torch.allclose(plain[0, 1:6], logits[0, 1:6], atol=1e-3)
