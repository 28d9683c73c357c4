"""What a plan measures (trainer/pace.py, trainer/pair_lengths.py): enough updates of a candidate that a
loaded machine does not scramble the pace, and seq2seq rows padded as the run's own rows are."""

import json

import torch

from tfkit.trainer import pace as pace_module
from tfkit.trainer.objectives import IGNORE, count_inputs
from tfkit.trainer.pace import measure_pace, synthetic_batch
from tfkit.trainer.pair_lengths import BYTES_PER_TOKEN, fill, pair_lengths
from tfkit.trainer.recipe import load_recipe

SMALL = ["model.size=null", "model.d_model=32", "model.n_layers=2", "model.n_heads=2", "train.batch_size=2",
         "data.seq_len=16", "tokenizer.vocab_size=300"]


def counted_updates(monkeypatch) -> list[int]:
    calls: list[int] = []
    window = pace_module.run_window

    def counting(*args, **kwargs):
        calls.append(1)
        return window(*args, **kwargs)

    monkeypatch.setattr(pace_module, "run_window", counting)
    return calls


def test_updates_are_timed_until_a_floor_of_seconds_and_the_median_taken(monkeypatch):
    recipe = load_recipe("quickstart", SMALL)
    cfg = recipe.model.config(recipe.tokenizer.vocab_size)
    calls = counted_updates(monkeypatch)
    measure_pace(recipe, cfg, torch.device("cpu"), floor=0.0, min_timed=3)
    assert len(calls) == 1 + 3  # a warm-up, then the fewest timed updates
    calls.clear()
    pace = measure_pace(recipe, cfg, torch.device("cpu"), floor=0.3, min_timed=3)
    assert len(calls) > 1 + 3 and len(calls) - 1 >= 0.3 / max(pace.seconds * 4, 1e-6)  # ms updates: many of them
    assert pace.tokens == 2 * 16


def pair_file(tmp_path, pairs):
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps({"source": s, "target": t}) + "\n" for s, t in pairs), encoding="utf-8")
    return path


def test_seq2seq_rows_are_as_long_as_the_corpus_makes_them(tmp_path):
    n = int(10 * BYTES_PER_TOKEN)  # 10 tokens of text
    path = pair_file(tmp_path, [("a" * n, "b" * 2 * n), ("c" * 100 * n, "d" * n)])
    recipe = load_recipe("transformer-tiny", [f"data.train={path}", "data.valid=null", "data.seq_len=32"])
    assert pair_lengths(recipe) == [(11, 21), (32, 11)]  # EOS / BOS counted; a long source cut to the row
    text = tmp_path / "doc.txt"
    text.write_text("x" * int(100 * BYTES_PER_TOKEN), encoding="utf-8")  # one document of 100 tokens
    recipe = load_recipe("transformer-tiny", [f"data.train={text}", "data.valid=null", "data.seq_len=32"])
    rows = pair_lengths(recipe)
    assert [t for _, t in rows] == [32, 32, 32, 7 + 1]  # chunks of 31 target tokens + BOS, then the rest
    assert all(s < t for s, t in rows)  # the source's noise spans are one mask token each


def test_a_seq2seq_pace_counts_the_real_tokens_of_padded_rows(tmp_path):
    recipe = load_recipe("transformer-tiny", SMALL + ["data.seq_len=32"])
    cfg = recipe.model.config(300)
    lengths = [(11, 21), (32, 11)]
    batch = synthetic_batch(cfg, "seq2seq", 2, 32, lengths=lengths)
    assert count_inputs(batch) in (2 * 32, 2 * 43, 2 * 32 + 43)  # two rows drawn from the two lengths
    real = batch["tgt_mask"].sum(1)
    assert ((batch["labels"] == IGNORE).sum(1) == 32 - real).all()  # padding is never a target
    pace = measure_pace(recipe, cfg, torch.device("cpu"), lengths=lengths, floor=0.0, min_timed=1)
    assert pace.tokens == count_inputs(batch) < 2 * 2 * 32
    assert fill(lengths, 32) == (11 + 21 + 32 + 11) / 128


def test_the_pace_counts_the_tokens_that_carry_a_loss():
    """Every token of a causal LM's update is a target; an MLM's are the recipe's chosen share of them (what the
    plan's law counts as data), at the recipe's own masking rate."""
    clm = load_recipe("quickstart", SMALL)
    pace = measure_pace(clm, clm.model.config(300), torch.device("cpu"), floor=0.0, min_timed=1)
    assert pace.predicted == pace.tokens == 2 * 16
    for rate in (0.15, 0.5):
        mlm = load_recipe("bert-tiny", SMALL + [f"objective.mask_prob={rate}"])
        pace = measure_pace(mlm, mlm.model.config(300), torch.device("cpu"), floor=0.0, min_timed=1)
        assert pace.tokens == 2 * 16 and pace.predicted == 2 * round(rate * 16)
