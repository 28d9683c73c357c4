"""`objective.mask_replace`: what MLM does with the selected tokens ([MASK] / random / unchanged).

The default must leave every existing run's batches bit for bit as they were: the digest below is that of
`mask_tokens` before the split became a key (80/10/10 hard-coded), on inputs built by arithmetic alone.
"""

from __future__ import annotations

import hashlib
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from tfkit.errors import ConfigError
from tfkit.tokenization.batches import MlmDataset
from tfkit.tokenization.masking import mask_tokens, replacement_ids, row_keys, uniform
from tfkit.tokenization.train import TokenizerSpec, load_tokenizer, train_tokenizer
from tfkit.trainer.data import _dataset
from tfkit.trainer.recipe import load_recipe

BEFORE_THE_KEY = "bdb725d0f33ec0270cbb16631c0be32e00ecebd74b019007f98c025f6ba90e22"
SPECIALS = [0, 1, 2, 3, 4]


def masked(replace=None, rows: int = 64):
    ids = (torch.arange(rows * 48) * 7919 % 995 + 5).reshape(rows, 48)  # (B, T) non-special ids
    special = torch.zeros_like(ids, dtype=torch.bool)
    special[:, 0] = special[:, -1] = True
    keys = row_keys([(7, r) for r in range(rows)])
    kw = {} if replace is None else {"replace": replace}
    out, labels = mask_tokens(ids, special, mask_id=4, replacements=replacement_ids(1000, SPECIALS), mask_prob=0.15,
                              keys=keys, **kw)
    return ids, out, labels, keys


def test_the_default_split_gives_the_batches_of_before_bit_for_bit():
    for replace in (None, (0.8, 0.1, 0.1), [0.8, 0.1, 0.1]):
        _, out, labels, _ = masked(replace)
        assert hashlib.sha256(out.numpy().tobytes() + labels.numpy().tobytes()).hexdigest() == BEFORE_THE_KEY


def test_the_split_follows_the_action_draw_of_each_position():
    """An independent reading of the rule: action < p_mask -> [MASK]; < p_mask + p_random -> random; else kept."""
    ids, out, labels, keys = masked((0.5, 0.3, 0.2), rows=256)
    selected = labels != -100
    action = uniform(keys, ids.shape[1], stream=1)  # (B, T): the draw mask_tokens makes for each position
    assert torch.equal(out[selected & (action < 0.5)], torch.full_like(out[selected & (action < 0.5)], 4))
    kept = selected & (action >= 0.5 + 0.3)
    assert torch.equal(out[kept], ids[kept]) and kept.sum() > 0
    random = selected & (action >= 0.5) & (action < 0.8)
    assert (out[random] >= 5).all() and (out[random] != ids[random]).float().mean() > 0.9
    assert abs((out[selected] == 4).float().mean().item() - 0.5) < 0.05


def test_all_mask_replaces_every_selected_token():
    ids, out, labels, _ = masked([1.0, 0.0, 0.0])
    selected = labels != -100
    assert selected.sum() > 100 and (out[selected] == 4).all()
    assert torch.equal(out[~selected], ids[~selected]) and torch.equal(labels[selected], ids[selected])


def test_all_unchanged_keeps_the_inputs_and_still_sets_the_labels():
    ids, out, labels, _ = masked([0.0, 0.0, 1.0])
    selected = labels != -100
    assert torch.equal(out, ids) and selected.sum() > 100 and torch.equal(labels[selected], ids[selected])


def test_all_random_draws_non_special_tokens():
    ids, out, labels, _ = masked([0.0, 1.0, 0.0])
    selected = labels != -100
    assert (out[selected] >= 5).all() and not (out[selected] == 4).any()
    assert (out[selected] != ids[selected]).float().mean() > 0.95


@pytest.mark.parametrize("value", ["[0.8, 0.1]", "[0.5, 0.6, -0.1]", "[0.5, 0.2, 0.2]", "[.nan, 0.5, 0.5]"])
def test_a_bad_split_is_one_problem_naming_the_key(value):
    with pytest.raises(ConfigError, match=r"objective.mask_replace: got .*expected three non-negative numbers "
                                          r"summing to 1"):
        load_recipe("bert-tiny", [f"objective.mask_replace={value}"])


def test_integers_are_numbers_and_the_default_is_berts():
    assert load_recipe("bert-tiny", ["objective.mask_replace=[1, 0, 0]"]).objective.mask_replace == [1.0, 0.0, 0.0]
    assert load_recipe("bert-tiny").objective.mask_replace == [0.8, 0.1, 0.1]


TEXT = "The quick brown fox jumps over the lazy dog while five wizards box nightly. " * 300


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tok") / "wordpiece"
    train_tokenizer(TokenizerSpec(kind="wordpiece", vocab_size=120), [TEXT], folder, show_progress=False)
    return load_tokenizer(folder)


def test_the_recipe_key_reaches_the_mlm_batches(tokenizer):
    tokens = np.asarray(tokenizer.encode(TEXT), dtype=np.uint16)
    recipe = load_recipe("bert-tiny", ["objective.mask_replace=[0, 0, 1]", "data.seq_len=32"])
    dataset = _dataset(recipe, tokenizer, SimpleNamespace(tokens=tokens))
    batch = dataset.batch(0, 8)
    assert torch.equal(batch["input_ids"], dataset.originals(dataset._permutation(0)[:8]))  # nothing replaced
    assert (batch["labels"] != -100).sum() >= 8  # yet every row has targets
    default = _dataset(load_recipe("bert-tiny", ["data.seq_len=32"]), tokenizer, SimpleNamespace(tokens=tokens))
    assert (default.batch(0, 8)["input_ids"] == tokenizer.mask_id).any()
    with pytest.raises(ConfigError, match="objective.mask_replace"):
        MlmDataset(tokens, 32, 0, tokenizer, mask_replace=(0.9, 0.2, 0.0))
