"""The three families: published parameter counts (checked against transformers/torch references),
padding invariance, causality, named sizes, config errors, init, and the FLOP formula."""

import math

import pytest
import torch
from torch import nn

from tfkit.errors import ConfigError
from tfkit.models import build_model, sized_config

from helpers import tiny_cfg

POSITIONS = ("learned", "sinusoidal", "rope", "alibi")


def count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


# --- published sizes, counted on the meta device (no memory, no init time) ---

def test_gpt2_small_matches_published_and_huggingface():
    transformers = pytest.importorskip("transformers")
    with torch.device("meta"):
        ours = build_model(sized_config("gpt", "small"))
        ref = transformers.GPT2LMHeadModel(transformers.GPT2Config())
    assert ours.num_params() == count(ref) == 124_439_808
    assert ours.num_params(non_embedding=True) == 124_439_808 - 50257 * 768 - 1024 * 768  # 85.06M


def test_bert_base_matches_huggingface_module_by_module():
    transformers = pytest.importorskip("transformers")
    with torch.device("meta"):
        ours = build_model(sized_config("bert", "small"))
        config = transformers.BertConfig()
        ref_mlm = transformers.BertForMaskedLM(config)  # BertModel without pooler + MLM head
        ref_pooler = transformers.models.bert.modeling_bert.BertPooler(config)
    body = count(ours.embed) + count(ours.blocks)
    assert body == count(ref_mlm.bert) == 108_891_648
    assert count(ours.pooler) == count(ref_pooler) == 590_592
    head = count(ours.mlm.dense) + count(ours.mlm.norm) + ours.mlm.decoder.bias.numel()  # decoder weight tied
    assert body + head == count(ref_mlm) == 109_514_298
    assert ours.num_params() == count(ref_mlm) + 590_592


def test_transformer_base_matches_torch_nn_transformer():
    with torch.device("meta"):
        ours = build_model(sized_config("transformer", "small"))
        ref = nn.Transformer(d_model=512, nhead=8, num_encoder_layers=6, num_decoder_layers=6,
                             dim_feedforward=2048, batch_first=True)
    final_norms = 2 * 2 * 512  # nn.Transformer ends each stack in a LayerNorm; post-LN blocks need none
    assert ours.num_params() == count(ref) - final_norms + 37000 * 512 == 63_082_496


def test_flops_per_token_formula_for_gpt2_small():
    with torch.device("meta"):
        model = build_model(sized_config("gpt", "small"))
    n_matmul = 12 * (4 * 768 * 768 + 2 * 768 * 3072) + 768 * 50257  # blocks + tied LM head
    assert model.flops_per_token(1024) == 6 * n_matmul + 12 * 12 * 768 * 1024


# --- behaviour ---

@pytest.mark.parametrize("positions", POSITIONS)
def test_bert_padding_does_not_change_real_tokens(positions):
    model = build_model(tiny_cfg("bert", positions=positions)).eval()
    ids = torch.randint(1, 61, (1, 6))
    padded = torch.cat([ids, torch.zeros(1, 4, dtype=torch.long)], dim=1)
    mask = torch.tensor([[True] * 6 + [False] * 4])
    torch.testing.assert_close(model.encode(padded, mask)[:, :6], model.encode(ids), atol=1e-5, rtol=1e-5)
    # the mask matters: without it the padding tokens do change the outputs
    assert not torch.allclose(model.encode(padded)[:, :6], model.encode(ids), atol=1e-4)


def test_pad_ids_are_ordinary_tokens_without_a_mask():
    """Padding is what attention_mask says, even when the config names a pad id (no inference from ids)."""
    model = build_model(tiny_cfg("bert", pad_token_id=0)).eval()
    ids = torch.randint(1, 61, (1, 6))
    padded = torch.cat([ids, torch.zeros(1, 3, dtype=torch.long)], dim=1)
    mask = torch.tensor([[True] * 6 + [False] * 3])
    torch.testing.assert_close(model.encode(padded, mask)[:, :6], model.encode(ids), atol=1e-5, rtol=1e-5)
    assert not torch.allclose(model.encode(padded)[:, :6], model.encode(ids), atol=1e-4)


@pytest.mark.parametrize("positions", POSITIONS)
def test_transformer_source_padding_does_not_change_outputs(positions):
    model = build_model(tiny_cfg("transformer", positions=positions)).eval()
    src, tgt = torch.randint(1, 61, (1, 5)), torch.randint(1, 61, (1, 4))
    padded = torch.cat([src, torch.zeros(1, 3, dtype=torch.long)], dim=1)
    mask = torch.tensor([[True] * 5 + [False] * 3])
    torch.testing.assert_close(model.encode(padded, mask)[:, :5], model.encode(src), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(model(padded, tgt, src_mask=mask), model(src, tgt), atol=1e-5, rtol=1e-5)


def test_batched_sequences_of_different_lengths_match_single_runs():
    model = build_model(tiny_cfg("bert")).eval()
    a, b = torch.randint(1, 61, (1, 7)), torch.randint(1, 61, (1, 4))
    batch = torch.cat([a, torch.cat([b, torch.zeros(1, 3, dtype=torch.long)], dim=1)])
    mask = torch.tensor([[True] * 7, [True] * 4 + [False] * 3])
    hidden = model.encode(batch, mask)
    torch.testing.assert_close(hidden[0:1], model.encode(a), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(hidden[1:2, :4], model.encode(b), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("attention", ["flash", "naive"])
@pytest.mark.parametrize("positions", POSITIONS)
def test_gpt_is_causal(positions, attention):
    model = build_model(tiny_cfg("gpt", positions=positions, attention=attention)).eval()
    ids = torch.randint(0, 61, (1, 10))
    changed = ids.clone()
    changed[0, 6:] = (ids[0, 6:] + 1) % 61
    before, after = model(ids), model(changed)
    torch.testing.assert_close(before[:, :6], after[:, :6], atol=0, rtol=0)
    assert not torch.allclose(before[:, 6:], after[:, 6:])


@pytest.mark.parametrize("positions", POSITIONS)
def test_transformer_decoder_is_causal_and_reads_the_source(positions):
    model = build_model(tiny_cfg("transformer", positions=positions)).eval()
    src, tgt = torch.randint(0, 61, (1, 6)), torch.randint(0, 61, (1, 8))
    changed = tgt.clone()
    changed[0, 5:] = (tgt[0, 5:] + 1) % 61
    torch.testing.assert_close(model(src, tgt)[:, :5], model(src, changed)[:, :5], atol=0, rtol=0)
    other_src = (src + 1) % 61
    assert not torch.allclose(model(src, tgt)[:, 0], model(other_src, tgt)[:, 0])


def test_bert_is_bidirectional():
    model = build_model(tiny_cfg("bert")).eval()
    ids = torch.randint(0, 61, (1, 8))
    changed = ids.clone()
    changed[0, -1] = (ids[0, -1] + 1) % 61
    assert not torch.allclose(model.encode(ids)[:, 0], model.encode(changed)[:, 0])


def test_bert_heads():
    model = build_model(tiny_cfg("bert")).eval()
    ids = torch.randint(0, 61, (2, 6))
    segments = torch.tensor([[0, 0, 0, 1, 1, 1]] * 2)
    hidden = model.encode(ids, token_type_ids=segments)
    assert not torch.allclose(hidden, model.encode(ids))  # segments are embedded
    rows = hidden[torch.tensor([[False, True, False, False, True, False]] * 2)]  # (4, C): masked rows only
    torch.testing.assert_close(model.mlm_logits(rows), model(ids, token_type_ids=segments)[:, [1, 4]].reshape(4, 61))
    pooled = model.pooled(hidden)
    assert pooled.shape == (2, 32) and pooled.abs().max() < 1
    assert model.mlm.decoder.weight is model.embed.tok.weight and model.mlm.decoder.bias.shape == (61,)


# --- configuration choices ---

@pytest.mark.parametrize("arch", ["gpt", "bert", "transformer"])
def test_tied_and_untied_embeddings(arch):
    tied, untied = build_model(tiny_cfg(arch)), build_model(tiny_cfg(arch, tie_embeddings=False))
    extra = {"gpt": 1, "bert": 1, "transformer": 2}[arch]  # the transformer also unshares src/tgt tables
    assert untied.num_params() - tied.num_params() == extra * 61 * 32
    if arch == "transformer":
        assert tied.src_embed.tok is tied.tgt_embed.tok
        assert tied.lm_head.weight is tied.src_embed.tok.weight
        assert untied.src_embed.tok is not untied.tgt_embed.tok


def test_bias_off_rmsnorm_swiglu():
    model = build_model(tiny_cfg("gpt", bias=False, norm="rmsnorm", activation="swiglu"))
    names = [name for name, _ in model.named_parameters()]
    assert not any(name.endswith(".bias") for name in names)
    assert isinstance(model.blocks[0].norm_attn, nn.RMSNorm)
    assert model.blocks[0].ffn.gate.out_features == model.config.ffn_dim == 128
    assert model(torch.randint(0, 61, (1, 5))).shape == (1, 5, 61)


def test_post_norm_has_no_final_norm_and_pre_norm_does():
    assert build_model(tiny_cfg("gpt", norm_placement="post")).ln_f is None
    assert build_model(tiny_cfg("gpt", norm_placement="pre")).ln_f is not None


def test_scaled_embeddings():
    plain = build_model(tiny_cfg("transformer", positions="rope"))
    scaled = build_model(tiny_cfg("transformer", positions="rope", scale_embeddings=True))
    scaled.load_state_dict(plain.state_dict())
    ids = torch.randint(0, 61, (1, 4))
    torch.testing.assert_close(scaled.src_embed(ids), plain.src_embed(ids) * math.sqrt(32))


def test_normal_init_scales_residual_projections():
    cfg = tiny_cfg("gpt", d_model=256, n_layers=8, n_heads=4, vocab_size=512)
    model = build_model(cfg)
    assert abs(model.blocks[0].attn.q_proj.weight.std().item() - 0.02) < 0.002
    assert abs(model.blocks[0].attn.o_proj.weight.std().item() - 0.02 / 4) < 0.0005
    assert abs(model.blocks[0].ffn.down.weight.std().item() - 0.02 / 4) < 0.0005


def test_xavier_init():
    model = build_model(tiny_cfg("transformer", init="xavier", d_model=64))
    weight = model.encoder[0].ffn.up.weight  # (256, 64)
    bound = math.sqrt(6 / (64 + 256))
    assert weight.abs().max() <= bound and weight.abs().max() > 0.9 * bound


def test_alibi_slopes_are_geometric():
    from tfkit.models.layers import alibi_slopes

    torch.testing.assert_close(alibi_slopes(8), torch.tensor([2.0 ** -(i + 1) for i in range(8)]))
    six = alibi_slopes(6)  # 4 from the power of two below, 2 interleaved from the next
    assert six.shape == (6,) and six[0] == 2 ** -2 and six[4] == 2 ** -1


# --- sizes and config errors ---

def test_named_sizes():
    tiny = sized_config("gpt", "tiny")
    assert (tiny.d_model, tiny.n_heads, tiny.max_seq_len) == (128, 4, 256)
    bert = sized_config("bert", "small")
    assert (bert.norm_placement, bert.norm_eps, bert.d_ff, bert.type_vocab_size) == ("post", 1e-12, 3072, 2)
    t = sized_config("transformer", "small", vocab_size=1000)
    assert (t.positions, t.activation, t.scale_embeddings, t.vocab_size) == ("sinusoidal", "relu", True, 1000)
    for arch in ("gpt", "bert", "transformer"):  # tiny really is tiny
        assert build_model(sized_config(arch, "tiny")).num_params() < 2_000_000


def test_unknown_size_names_it_and_lists_the_valid_ones():
    with pytest.raises(ConfigError, match=r"'huge'.*tiny, small"):
        sized_config("gpt", "huge")
    with pytest.raises(ConfigError, match="model.arch"):
        sized_config("llama", "tiny")
    with pytest.raises(ConfigError, match="n_layer"):
        sized_config("gpt", "tiny", n_layer=3)


def test_indivisible_heads_are_a_config_error_naming_n_kv_heads():
    with pytest.raises(ConfigError, match="n_kv_heads"):
        build_model(tiny_cfg("gpt", n_kv_heads=3))
    with pytest.raises(ConfigError, match="n_kv_heads"):
        sized_config("gpt", "small", n_kv_heads=5)
    with pytest.raises(ConfigError, match="d_model"):
        build_model(tiny_cfg("gpt", n_heads=5))
