"""`loss.png` at the end of a run: a run with a skipped non-finite update still finishes and plots it."""

import json

import pytest

from tfkit.checkpoints.run_record import read_metrics
from tfkit.trainer import objectives
from tfkit.trainer.metrics import plot_loss
from tfkit.trainer.recipe import load_recipe
from tfkit.trainer.run import pretrain

matplotlib = pytest.importorskip("matplotlib")  # the plots extra; the test extra installs it


def test_a_run_that_skipped_a_non_finite_update_finishes_and_plots_it(english_text, tmp_path, monkeypatch):
    (tmp_path / "train.txt").write_text(english_text[:40_000], encoding="utf-8")
    recipe = {
        "model": {"arch": "gpt", "d_model": 32, "n_layers": 1, "n_heads": 2, "max_seq_len": 32},
        "tokenizer": {"kind": "bpe", "vocab_size": 300},
        "data": {"train": str(tmp_path / "train.txt"), "valid": None, "seq_len": 32},
        "train": {"max_steps": 8, "batch_size": 4, "log_every": 1, "eval_every": 4, "save_every": 100,
                  "device": "cpu"},
        "eval": {"batches": 1, "sample_prompt": None},
        "log": {"progress": False, "plot": True, "tensorboard": False},
    }
    (tmp_path / "r.yaml").write_text(json.dumps(recipe))
    original, calls = objectives.compute_loss, [0]

    def nan_on_the_third_update(model, batch, objective):
        out = original(model, batch, objective)
        if model.training:
            calls[0] += 1
            if calls[0] == 3:
                out.loss_sum = out.loss_sum * float("nan")
        return out

    monkeypatch.setattr(objectives, "compute_loss", nan_on_the_third_update)
    pretrain(load_recipe(str(tmp_path / "r.yaml")), run_dir=tmp_path / "run")
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in rows if r.get("skipped")] == [3]
    assert (tmp_path / "run" / "loss.png").stat().st_size > 1000


def test_the_plot_marks_skipped_steps_and_ignores_rows_without_a_number(tmp_path, monkeypatch):
    rows = [{"step": 1, "loss": 5.0}, {"step": 2, "loss": None, "skipped": True}, {"step": 2, "loss": 4.0},
            {"step": 3, "loss": float("nan"), "skipped": True}, {"step": 3, "loss": 3.5},
            {"step": 3, "val_loss": None}, {"step": 3, "val_loss": 3.9}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    from matplotlib.figure import Figure

    drawn = {}
    original = Figure.savefig

    def keep_axes(fig, *args, **kwargs):
        drawn["lines"] = {line.get_label(): list(line.get_xdata()) for line in fig.axes[0].get_lines()}
        return original(fig, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", keep_axes)
    assert plot_loss(tmp_path / "metrics.jsonl", tmp_path / "loss.png") is not None
    assert drawn["lines"] == {"train": [1, 2, 3], "validation": [3], "skipped update (2)": [2, 3]}
