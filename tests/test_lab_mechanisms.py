"""The mechanism probes against oracles outside them: attention entropy, max probability and score spread from
the weights the naive attention path itself returns; the residual update from a block called by hand; the
length split from a forward of the 1x row; and the behaviour each probe exists to show (scores scaled by
sqrt(d) spread sqrt(d) times less; a block that writes nothing updates nothing; a position past the
training length scored as such)."""

import math

import pytest
import torch
import torch.nn.functional as F

from tfkit.checkpoints.weights import save_model
from tfkit.lab.lengths import past_training_length, split_sums
from tfkit.lab.mechanisms import attention_stats, layer_stats, residual_updates
from tfkit.models import build_model
from tfkit.models.attention import AttnMask, self_attention_mask
from tfkit.tokenization.batches import IGNORE_INDEX

from helpers import tiny_cfg

IDS = torch.randint(0, 61, (2, 12), generator=torch.Generator().manual_seed(0))  # (B, T)


def saved(tmp_path, name: str, **overrides):
    torch.manual_seed(0)
    model = build_model(tiny_cfg("gpt", **overrides))
    model.eval()
    save_model(model, tmp_path / name)
    return model, tmp_path / name


def test_layer_statistics_by_hand():
    """Three queries under a causal mask: the first sees one key and is left out; the others by hand."""
    scores = torch.tensor([[[[9.0, 0.0, 0.0], [1.0, 3.0, 0.0], [0.0, 2.0, 4.0]]]])  # (1, 1, 3, 3)
    mask = AttnMask(torch.ones(3, 3, dtype=torch.bool).tril()[None, None], is_causal=True)
    got = layer_stats(scores, mask)
    p1, p2 = torch.softmax(torch.tensor([1.0, 3.0]), 0), torch.softmax(torch.tensor([0.0, 2.0, 4.0]), 0)
    entropy = [float(-(p * p.log()).sum()) for p in (p1, p2)]
    assert got["entropy"] == pytest.approx(sum(entropy) / 2, rel=1e-6)
    assert got["max_prob"] == pytest.approx((float(p1.max()) + float(p2.max())) / 2, rel=1e-6)
    assert got["spread"] == pytest.approx((math.sqrt(2.0) + 2.0) / 2, rel=1e-6)  # sample sd of (1, 3), (0, 2, 4)
    alibi = self_attention_mask(3, causal=True, alibi=torch.tensor([1.0]))  # bias -|i - j|, -inf above
    biased = layer_stats(scores, alibi)  # the softmax sees the scores plus the bias
    p2 = torch.softmax(torch.tensor([0.0 - 2, 2.0 - 1, 4.0]), 0)
    assert biased["max_prob"] == pytest.approx((float(torch.softmax(torch.tensor([0.0, 3.0]), 0).max())
                                                + float(p2.max())) / 2, rel=1e-6)


def test_attention_statistics_are_those_of_the_weights_the_model_attends_with(tmp_path):
    model, folder = saved(tmp_path, "m", n_layers=1, attention="naive")
    got = attention_stats(folder, {"input_ids": IDS})
    with torch.no_grad():  # the weights naive attention returns, from the layer's own input and mask
        h = model.blocks[0].norm_attn(model.embed(IDS, None))  # (B, T, C)
        _, weights = model.blocks[0].attn(h, self_attention_mask(12, causal=True), need_weights=True)  # (B, H, T, T)
    seen = weights[:, :, 1:]  # (B, H, T-1, T): the queries that see two keys or more
    entropy = -(seen * seen.clamp_min(1e-30).log()).sum(-1)  # (B, H, T-1)
    assert got["entropy"] == [pytest.approx(float(entropy.mean()), rel=1e-5)]
    assert got["max_prob"] == [pytest.approx(float(seen.amax(-1).mean()), rel=1e-5)]
    assert len(got["spread"]) == 1 and got["spread"][0] > 0


def test_unscaled_scores_spread_sqrt_d_times_wider_and_attend_more_sharply(tmp_path):
    """The same weights with and without the 1/sqrt(d_head) scale (one layer, so both see the same input): the
    mechanism qk-scale is about."""
    stats = {}
    for scale in ("sqrt_d", "none"):
        model, folder = saved(tmp_path, scale, attn_scale=scale, n_layers=1)
        with torch.no_grad():  # projections large enough for scores that matter
            model.blocks[0].attn.q_proj.weight.mul_(20.0), model.blocks[0].attn.k_proj.weight.mul_(20.0)
        save_model(model, folder)
        stats[scale] = attention_stats(folder, {"input_ids": IDS})
    (spread,), (plain,) = stats["none"]["spread"], stats["sqrt_d"]["spread"]
    assert spread == pytest.approx(plain * math.sqrt(32 // 4), rel=1e-5)
    assert stats["none"]["entropy"][0] < stats["sqrt_d"]["entropy"][0]
    assert stats["none"]["max_prob"][0] > stats["sqrt_d"]["max_prob"][0]


def test_the_residual_update_of_each_block(tmp_path):
    model, folder = saved(tmp_path, "r")
    got = residual_updates(folder, {"input_ids": IDS})
    with torch.no_grad():
        x = model.embed(IDS, None)  # (B, T, C)
        mask = self_attention_mask(12, causal=True)
        expected = []
        for block in model.blocks:
            y = block(x, mask)  # (B, T, C)
            expected.append(float(((y - x).norm(dim=-1) / x.norm(dim=-1)).mean()))
            x = y
    assert got == [pytest.approx(e, rel=1e-5) for e in expected]
    with torch.no_grad():  # a block whose branches write nothing leaves the stream as it was
        for proj in (model.blocks[1].attn.o_proj, model.blocks[1].ffn.down):
            proj.weight.zero_()
            if proj.bias is not None:
                proj.bias.zero_()
    save_model(model, folder)
    silent = residual_updates(folder, {"input_ids": IDS})
    assert silent[0] == pytest.approx(got[0], rel=1e-6) and silent[1] == pytest.approx(0.0, abs=1e-7)


def test_split_sums_count_each_side_of_the_training_length():
    logits = torch.randn(2, 6, 5, generator=torch.Generator().manual_seed(1))  # (B, T, V)
    labels = torch.tensor([[1, 2, 3, 4, 0, 1], [2, IGNORE_INDEX, 4, 4, 3, IGNORE_INDEX]])  # (B, T)
    byte_table = torch.tensor([1, 2, 3, 4, 5])
    sums = split_sums(logits, labels, 3, byte_table)
    nll = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX, reduction="none")
    nll = nll.view(2, 6)
    assert sums[0].tolist() == pytest.approx([float(nll[:, :3].sum()), 5, 2 + 3 + 4 + 3 + 5])  # 0, 1, 2
    assert sums[1].tolist() == pytest.approx([float(nll[:, 3:].sum()), 5, 5 + 1 + 2 + 5 + 4])


def test_within_the_training_length_is_the_1x_loss_and_past_it_is_what_is_left(tmp_path, eval_tokenizers, valid_file):
    """On a causal model the first L positions of a 2L row are computed as a 1x row: the split's `within`
    is the loss of the rows cut at L, and `past` that of the rest, each from a forward of its own."""
    from tfkit.evaluation.evaluate import eval_batches
    from tfkit.tokenization import load_tokenizer

    tokenizer = load_tokenizer(eval_tokenizers["bpe"])
    torch.manual_seed(0)
    model = build_model(tiny_cfg("gpt", vocab_size=tokenizer.vocab_size, max_seq_len=64, positions="rope"))
    save_model(model, tmp_path / "c")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if (eval_tokenizers["bpe"] / name).is_file():
            (tmp_path / "c" / name).write_bytes((eval_tokenizers["bpe"] / name).read_bytes())
    got = past_training_length(tmp_path / "c", str(valid_file), 16, 2, batch_size=4, batches=2,
                               cache_dir=tmp_path / "cache")
    batches, _ = eval_batches(tokenizer, str(valid_file), "clm", seq_len=32, batch_size=4, stride=None, seed=0,
                              cache_dir=tmp_path / "cache", show_progress=False)
    nll = {"within": [], "past": []}
    with torch.no_grad():
        for _, batch in zip(range(2), batches):
            ids, labels = batch["input_ids"], batch["labels"]  # (B, 32)
            short = model(ids[:, :16])  # (B, 16, V): a 1x row
            nll["within"].append(F.cross_entropy(short.flatten(0, 1), labels[:, :16].flatten(), reduction="none"))
            full = model(ids)  # (B, 32, V)
            nll["past"].append(F.cross_entropy(full[:, 16:].flatten(0, 1), labels[:, 16:].flatten(), reduction="none"))
    within, past = (float(torch.cat(nll[k]).mean()) for k in ("within", "past"))
    assert got["within_loss"] == pytest.approx(within, rel=1e-5) and got["past_loss"] == pytest.approx(past, rel=1e-5)
    assert got["loss"] == pytest.approx(past - within, abs=1e-6) and got["tokens"] == got["tokens_within"] == 2 * 4 * 16
    assert got["bits_per_byte"] == pytest.approx(got["past_bits_per_byte"] - got["within_bits_per_byte"])
