"""`mask_tokens` as a pure function, and which tokens start a word for each tokenizer kind."""

import numpy as np
import torch

from tfkit.tokenization.masking import mask_tokens, replacement_ids, row_keys, uniform, word_start_table


def _run(seed, ids, special, **kw):
    args = dict(mask_id=4, replacements=replacement_ids(1000, [0, 1, 2, 3, 4]), mask_prob=0.15)
    keys = row_keys([(seed, row) for row in range(ids.shape[0])])
    return mask_tokens(ids, special, keys=keys, **{**args, **kw})


def test_statistics_determinism_and_purity():
    ids = torch.randint(5, 1000, (256, 128), generator=torch.Generator().manual_seed(0))  # (B, T)
    special = torch.zeros_like(ids, dtype=torch.bool)
    special[:, 0] = special[:, -1] = True
    special[:3, 5:] = True  # mostly padding rows still get one target
    ids_before = ids.clone()
    out, labels = _run(1, ids, special)
    assert torch.equal(ids, ids_before)  # inputs untouched
    sel = labels != -100
    assert not (sel & special).any() and sel.sum(dim=1).min() >= 1
    assert abs(sel.sum().item() / (~special).sum().item() - 0.15) < 0.015
    assert abs((out[sel] == 4).float().mean().item() - 0.8) < 0.03
    assert abs((out[sel] == ids[sel]).float().mean().item() - 0.1) < 0.03
    assert (out[sel] >= 5).logical_or(out[sel] == 4).all()  # replacements are never other specials
    assert torch.equal(out[~sel], ids[~sel]) and torch.equal(labels[sel], ids[sel])
    again, labels_again = _run(1, ids, special)
    assert torch.equal(again, out) and torch.equal(labels_again, labels)
    assert not torch.equal(_run(2, ids, special)[1], labels)


def test_nothing_maskable_means_no_targets():
    ids = torch.tensor([[2, 3, 0, 0]])
    out, labels = _run(0, ids, torch.ones_like(ids, dtype=torch.bool))
    assert torch.equal(out, ids) and (labels == -100).all()


def test_whole_words_are_masked_together():
    ids = torch.randint(5, 1000, (64, 64), generator=torch.Generator().manual_seed(0))
    starts = torch.rand(64, 64, generator=torch.Generator().manual_seed(1)) < 0.4
    special = torch.zeros_like(starts)
    _, labels = _run(3, ids, special, word_starts=starts)
    word = torch.cumsum(starts.long() | (torch.arange(64) == 0).long(), dim=1)
    sel = labels != -100
    for b in range(64):
        for w in word[b].unique():
            assert sel[b][word[b] == w].unique().numel() == 1
    assert 0.13 < sel.float().mean().item() < 0.22


def test_word_start_tables():
    wp = word_start_table({"[CLS]": 0, "play": 1, "##ing": 2, ",": 3}, "wordpiece")
    assert wp.tolist() == [True, True, False, True]
    bpe = word_start_table({"Ġplay": 0, "ing": 1, ",": 2, "<|endoftext|>": 3}, "bpe")
    assert bpe.tolist() == [True, False, True, True]
    uni = word_start_table({"▁play": 0, "ing": 1, "<s>": 2}, "unigram")
    assert uni.tolist() == [True, False, True] and uni.dtype == np.bool_


def test_a_rows_randomness_depends_on_its_key_alone():
    """Counter-based: row b's numbers are the same whatever rows share its batch (ranks, batch sizes)."""
    keys = row_keys([(0, 7, r) for r in range(8)])
    batch = uniform(keys, 64, stream=0)
    assert torch.equal(uniform(keys[3:4], 64, stream=0)[0], batch[3])
    assert not torch.equal(batch[0], batch[1]) and not torch.equal(batch, uniform(keys, 64, stream=1))
    assert 0.0 <= batch.min() and batch.max() < 1.0


def test_uniform_numbers_are_uniform_and_uncorrelated_across_neighbours():
    u = uniform(row_keys([(1, r) for r in range(512)]), 512, stream=0).flatten()  # 262,144 numbers
    assert abs(u.mean().item() - 0.5) < 0.005 and abs(u.var().item() - 1 / 12) < 0.002
    histogram = torch.histc(u.float(), bins=16, min=0.0, max=1.0) / len(u)
    assert (histogram - 1 / 16).abs().max() < 0.003
    assert abs(torch.corrcoef(torch.stack([u[:-1], u[1:]]))[0, 1].item()) < 0.01
