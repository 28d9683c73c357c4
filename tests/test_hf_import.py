"""`import_hf`: HuggingFace BERT / GPT-2 / Llama folders become tfkit checkpoints computing the same logits.

The reference is transformers itself (litgpt style): small models built locally from config objects with
random weights (spread wide enough that logits are O(1), so 1e-5 means something), saved with
`save_pretrained`, imported, reloaded with tfkit's `load_model`, and compared in fp32 eval mode.
"""

import json
import warnings
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tfkit.checkpoints.hf_import import import_hf
from tfkit.checkpoints.hf_names import HFInteropWarning
from tfkit.checkpoints.record import CheckpointRecord
from tfkit.checkpoints.weights import load_model

from helpers import T_MAX, D, H, L, V, bert_config, gpt2_config, llama_config, qwen3_config, randomise, save_hf

transformers = pytest.importorskip("transformers")

ATOL = 1e-5


def imported(src: Path, out: Path):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import_hf(src, out)
    model, cfg = load_model(out)
    return model, cfg, [str(w.message) for w in caught if issubclass(w.category, HFInteropWarning)]


IDS = torch.randint(5, V, (2, 16), generator=torch.Generator().manual_seed(1))


def test_bert_for_masked_lm_logits_match(tmp_path):
    hf = transformers.BertForMaskedLM(bert_config())
    ours, cfg, _ = imported(save_hf(hf, tmp_path / "hf"), tmp_path / "ckpt")
    assert (cfg.arch, cfg.norm_placement, cfg.norm_eps, cfg.pad_token_id) == ("bert", "post", 1e-12, 0)
    segments = torch.tensor([[0] * 8 + [1] * 8] * 2)
    mask = torch.ones(2, 16, dtype=torch.bool)
    mask[1, 11:] = False
    with torch.no_grad():
        expected = hf(input_ids=IDS, attention_mask=mask.long(), token_type_ids=segments).logits
        got = ours(IDS, attention_mask=mask, token_type_ids=segments)
    assert expected.std() > 0.5  # logits are O(1): the tolerance is tight
    torch.testing.assert_close(got[mask], expected[mask], atol=ATOL, rtol=0)  # padding rows are unused


def test_bare_bert_model_hidden_states_match_and_the_missing_head_is_initialised(tmp_path):
    hf = transformers.BertModel(bert_config())
    ours, cfg, messages = imported(save_hf(hf, tmp_path / "hf"), tmp_path / "ckpt")
    assert any("no MLM head" in m and "tied" in m for m in messages)
    with torch.no_grad():
        out = hf(IDS)
        hidden = ours.encode(IDS)
        torch.testing.assert_close(hidden, out.last_hidden_state, atol=ATOL, rtol=0)
        torch.testing.assert_close(ours.pooled(hidden), out.pooler_output, atol=ATOL, rtol=0)
        assert ours(IDS).shape == (2, 16, V)  # the initialised head works
    assert ours.mlm.decoder.weight is ours.embed.tok.weight
    assert torch.all(ours.mlm.decoder.bias == 0) and torch.all(ours.mlm.norm.weight == 1)


def test_bert_for_pretraining_drops_the_nsp_head_with_a_warning(tmp_path):
    hf = transformers.BertForPreTraining(bert_config())
    ours, _, messages = imported(save_hf(hf, tmp_path / "hf"), tmp_path / "ckpt")
    assert any("cls.seq_relationship.bias, cls.seq_relationship.weight" in m for m in messages)
    with torch.no_grad():
        out = hf(IDS)
        torch.testing.assert_close(ours(IDS), out.prediction_logits, atol=ATOL, rtol=0)
        torch.testing.assert_close(ours.pooled(ours.encode(IDS)), hf.bert(IDS).pooler_output, atol=ATOL, rtol=0)


def test_gpt2_logits_match(tmp_path):
    hf = transformers.GPT2LMHeadModel(gpt2_config())
    ours, cfg, messages = imported(save_hf(hf, tmp_path / "hf"), tmp_path / "ckpt")
    assert (cfg.positions, cfg.norm, cfg.norm_placement, cfg.activation) == ("learned", "layernorm", "pre", "gelu")
    assert not messages[:-1] and "no tokenizer" in messages[-1]  # nothing approximated
    with torch.no_grad():
        expected = hf(IDS).logits
        assert expected.std() > 0.5
        torch.testing.assert_close(ours(IDS), expected, atol=ATOL, rtol=0)
    assert ours.lm_head.weight is ours.embed.tok.weight
    assert CheckpointRecord.read(tmp_path / "ckpt").hf_architecture == "GPT2LMHeadModel"


def test_bare_gpt2_model_imports_with_its_tied_head(tmp_path):
    hf = transformers.GPT2Model(gpt2_config())
    ours, _, _ = imported(save_hf(hf, tmp_path / "hf"), tmp_path / "ckpt")
    with torch.no_grad():
        expected = hf(IDS).last_hidden_state @ hf.wte.weight.T  # GPT-2's LM head is the tied embedding
        torch.testing.assert_close(ours(IDS), expected, atol=ATOL, rtol=0)


def test_gpt2_tanh_gelu_logits_match_exactly(tmp_path):
    """GPT-2's default gelu_new imports as gelu_tanh, silently and exactly."""
    hf = transformers.GPT2LMHeadModel(gpt2_config(activation_function="gelu_new"))
    ours, _, _ = imported(save_hf(hf, tmp_path / "hf"), tmp_path / "ckpt")
    with torch.no_grad():
        torch.testing.assert_close(ours(IDS), hf(IDS).logits, atol=ATOL, rtol=0)


@pytest.mark.parametrize("kv_heads, tied, bias", [(2, False, False), (1, True, True), (4, False, False)])
def test_llama_logits_match(tmp_path, kv_heads, tied, bias):
    hf = transformers.LlamaForCausalLM(llama_config(num_key_value_heads=kv_heads, tie_word_embeddings=tied,
                                                    attention_bias=bias, mlp_bias=bias, rope_theta=500.0))
    ours, cfg, _ = imported(save_hf(hf, tmp_path / "hf"), tmp_path / "ckpt")
    assert cfg.kv_heads == kv_heads and cfg.n_kv_heads == (None if kv_heads == H else kv_heads)
    assert (cfg.positions, cfg.norm, cfg.activation, cfg.norm_eps, cfg.rope_theta) == (
        "rope", "rmsnorm", "swiglu", 1e-6, 500.0)
    assert (cfg.tie_embeddings, cfg.bias) == (tied, bias)
    with torch.no_grad():
        expected = hf(IDS).logits
        assert expected.std() > 0.5
        torch.testing.assert_close(ours(IDS), expected, atol=ATOL, rtol=0)


@pytest.mark.parametrize("kv_heads, tied", [(2, False), (1, True)])
def test_qwen3_is_a_llama_with_qk_norm_and_its_logits_match(tmp_path, kv_heads, tied):
    hf = transformers.Qwen3ForCausalLM(qwen3_config(num_key_value_heads=kv_heads, tie_word_embeddings=tied))
    ours, cfg, _ = imported(save_hf(hf, tmp_path / "hf"), tmp_path / "ckpt")
    assert (cfg.qk_norm, cfg.positions, cfg.norm, cfg.bias, cfg.kv_heads, cfg.window) == (
        True, "rope", "rmsnorm", False, kv_heads, None)
    with torch.no_grad():
        expected = hf(IDS).logits
        assert expected.std() > 0.5
        torch.testing.assert_close(ours(IDS), expected, atol=ATOL, rtol=0)


def test_mistral_with_a_sliding_window_is_a_windowed_gpt_and_round_trips(tmp_path):
    from tfkit.checkpoints.hf_export import export_hf

    hf = transformers.MistralForCausalLM(transformers.MistralConfig(
        vocab_size=V, hidden_size=D, num_hidden_layers=L, num_attention_heads=H, num_key_value_heads=2,
        intermediate_size=96, max_position_embeddings=T_MAX, sliding_window=5))
    ours, cfg, _ = imported(save_hf(hf, tmp_path / "hf"), tmp_path / "ckpt")
    assert (cfg.window, cfg.global_every, cfg.kv_heads) == (5, None, 2)
    with torch.no_grad():  # 16 tokens: most queries see only the last 5 keys
        torch.testing.assert_close(ours(IDS), hf(IDS).logits, atol=ATOL, rtol=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HFInteropWarning)
        export_hf(tmp_path / "ckpt", tmp_path / "hf2")
    assert json.loads((tmp_path / "hf2" / "config.json").read_text())["sliding_window"] == 5
    again = transformers.MistralForCausalLM.from_pretrained(tmp_path / "hf2").eval()
    with torch.no_grad():
        torch.testing.assert_close(again(IDS).logits, hf(IDS).logits, atol=ATOL, rtol=0)


def test_mistral_without_a_sliding_window_is_a_llama(tmp_path):
    hf = transformers.MistralForCausalLM(transformers.MistralConfig(
        vocab_size=V, hidden_size=D, num_hidden_layers=L, num_attention_heads=H, num_key_value_heads=2,
        intermediate_size=96, max_position_embeddings=T_MAX, sliding_window=None))
    ours, cfg, _ = imported(save_hf(hf, tmp_path / "hf"), tmp_path / "ckpt")
    assert (cfg.positions, cfg.kv_heads) == ("rope", 2)
    with torch.no_grad():
        torch.testing.assert_close(ours(IDS), hf(IDS).logits, atol=ATOL, rtol=0)


def test_bf16_weights_stay_bf16_in_the_checkpoint(tmp_path):
    hf = randomise(transformers.LlamaForCausalLM(llama_config())).to(torch.bfloat16)
    hf.save_pretrained(tmp_path / "hf")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HFInteropWarning)
        import_hf(tmp_path / "hf", tmp_path / "ckpt")
    assert {t.dtype for t in load_file(tmp_path / "ckpt" / "model.safetensors").values()} == {torch.bfloat16}
    ours, _ = load_model(tmp_path / "ckpt")  # tfkit loads it (into fp32) like any checkpoint
    with torch.no_grad():
        # The same bf16 weights computed in fp32; reloaded rather than hf.float(), which would keep the
        # RoPE inverse frequencies the bf16 cast rounded.
        reference = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32).eval()
        expected = reference(IDS).logits
        torch.testing.assert_close(ours(IDS), expected, atol=ATOL, rtol=0)


def test_pytorch_bin_and_sharded_safetensors_import_alike(tmp_path):
    hf = randomise(transformers.GPT2LMHeadModel(gpt2_config()))
    hf.save_pretrained(tmp_path / "sharded", max_shard_size="100KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    (tmp_path / "bin").mkdir()
    hf.config.save_pretrained(tmp_path / "bin")
    torch.save(hf.state_dict(), tmp_path / "bin" / "pytorch_model.bin")  # incl. the tied lm_head copy
    a, _, _ = imported(tmp_path / "sharded", tmp_path / "a")
    b, _, _ = imported(tmp_path / "bin", tmp_path / "b")
    for key, value in a.state_dict().items():
        assert torch.equal(value, b.state_dict()[key]), key


@pytest.mark.parametrize("cls, config", [
    ("BertForMaskedLM", bert_config), ("GPT2LMHeadModel", gpt2_config), ("LlamaForCausalLM", llama_config),
    ("Qwen3ForCausalLM", qwen3_config),
])
def test_import_export_import_round_trips_exactly(tmp_path, cls, config):
    from tfkit.checkpoints.hf_export import export_hf

    src = save_hf(getattr(transformers, cls)(config()), tmp_path / "hf")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HFInteropWarning)
        import_hf(src, tmp_path / "one")
        export_hf(tmp_path / "one", tmp_path / "hf2")
        import_hf(tmp_path / "hf2", tmp_path / "two")
    original, exported = load_file(src / "model.safetensors"), load_file(tmp_path / "hf2" / "model.safetensors")
    assert sorted(original) == sorted(exported)
    assert all(torch.equal(original[k], exported[k]) for k in original)
    one, two = load_file(tmp_path / "one" / "model.safetensors"), load_file(tmp_path / "two" / "model.safetensors")
    assert sorted(one) == sorted(two) and all(torch.equal(one[k], two[k]) for k in one)
    assert CheckpointRecord.read(tmp_path / "one").model == CheckpointRecord.read(tmp_path / "two").model


def test_bare_llama_model_imports_with_an_initialised_head_and_a_warning(tmp_path):
    """A LlamaModel has no lm_head (and unlike GPT-2 does not tie one): its hidden states import exactly
    and the head is initialised, as a bare BertModel's MLM head is."""
    hf = transformers.LlamaModel(llama_config())
    ours, cfg, messages = imported(save_hf(hf, tmp_path / "hf"), tmp_path / "ckpt")
    assert not cfg.tie_embeddings
    assert any(m.startswith("LlamaModel has no LM head: lm_head.weight initialised") for m in messages)
    assert CheckpointRecord.read(tmp_path / "ckpt").hf_architecture == "LlamaModel"
    with torch.no_grad():
        expected = hf(IDS).last_hidden_state @ ours.lm_head.weight.T  # (B, T, V) through the new head
        torch.testing.assert_close(ours(IDS), expected, atol=ATOL, rtol=0)
    assert 0 < ours.lm_head.weight.std() < 0.1  # initialised like tfkit's own init, not copied
