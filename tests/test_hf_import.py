"""`import_hf`: HuggingFace BERT / GPT-2 / Llama folders become tfkit checkpoints computing the same logits.

The reference is transformers itself (litgpt style): small models built locally from config objects with
random weights (spread wide enough that logits are O(1), so 1e-5 means something), saved with
`save_pretrained`, imported, reloaded with tfkit's `load_model`, and compared in fp32 eval mode.
"""

import json
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tfkit.errors import CheckpointError, ConfigError
from tfkit.models import load_model, read_config
from tfkit.models.hf_import import hf_to_tfkit, import_hf
from tfkit.models.hf_names import HFInteropWarning

transformers = pytest.importorskip("transformers")

V, D, L, H, T_MAX = 300, 64, 2, 4, 64
ATOL = 1e-5


def randomise(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Every parameter away from its init (norm weights around 1, the rest N(0, 0.1)): a swapped or
    transposed tensor, a missing bias or a wrong epsilon then shows in the logits."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            is_norm = "Norm" in type(module).__name__  # LayerNorm, LlamaRMSNorm, ...
            for name, p in module.named_parameters(recurse=False):
                noise = 0.1 * torch.randn(p.shape, generator=gen)
                p.copy_(1 + noise if is_norm and name == "weight" else noise)
    return model.eval()


def bert_config(**kw):
    return transformers.BertConfig(vocab_size=V, hidden_size=D, num_hidden_layers=L, num_attention_heads=H,
                                   intermediate_size=4 * D, max_position_embeddings=T_MAX, **kw)


def gpt2_config(**kw):
    kw.setdefault("activation_function", "gelu")
    return transformers.GPT2Config(vocab_size=V, n_embd=D, n_layer=L, n_head=H, n_positions=T_MAX,
                                   bos_token_id=0, eos_token_id=0, **kw)


def llama_config(**kw):
    kw.setdefault("num_key_value_heads", 2)
    return transformers.LlamaConfig(vocab_size=V, hidden_size=D, num_hidden_layers=L, num_attention_heads=H,
                                    intermediate_size=96, max_position_embeddings=T_MAX, **kw)


def qwen3_config(**kw):
    kw.setdefault("num_key_value_heads", 2)
    return transformers.Qwen3Config(vocab_size=V, hidden_size=D, num_hidden_layers=L, num_attention_heads=H,
                                    head_dim=D // H, intermediate_size=96, max_position_embeddings=T_MAX, **kw)


def save_hf(model, folder: Path) -> Path:
    randomise(model).save_pretrained(folder)
    return folder


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
    assert read_config(tmp_path / "ckpt")["hf_architecture"] == "GPT2LMHeadModel"


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
    from tfkit.models.hf_export import export_hf

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
    from tfkit.models.hf_export import export_hf

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
    assert read_config(tmp_path / "one")["model"] == read_config(tmp_path / "two")["model"]


BERT = {"architectures": ["BertForMaskedLM"], "model_type": "bert", "vocab_size": V, "hidden_size": D,
        "num_hidden_layers": L, "num_attention_heads": H, "intermediate_size": 4 * D, "max_position_embeddings": 64}
LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": V, "hidden_size": D,
         "num_hidden_layers": L, "num_attention_heads": H, "intermediate_size": 96, "max_position_embeddings": 64}


@pytest.mark.parametrize("config, named", [
    ({**LLAMA, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "rope_scaling.rope_type='llama3'"),
    ({**LLAMA, "rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4}}, "rope_parameters.rope_type='yarn'"),
    ({**LLAMA, "rope_parameters": {"rope_type": "default", "rope_theta": 1e4},
      "rope_scaling": {"type": "linear", "factor": 2.0}}, "rope_scaling.rope_type='linear'"),
    ({**LLAMA, "attention_bias": True}, "attention_bias=True with mlp_bias=False"),
    ({**LLAMA, "head_dim": 32}, "head_dim=32"),
    ({**LLAMA, "hidden_act": "gelu"}, "hidden_act='gelu'"),
    ({**LLAMA, "model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "use_sliding_window": True,
      "sliding_window": 16}, "sliding_window=16"),
    ({**BERT, "position_embedding_type": "relative_key"}, "position_embedding_type='relative_key'"),
    ({**BERT, "hidden_act": "gelu_fast"}, "hidden_act='gelu_fast'"),
    ({**BERT, "architectures": ["BertForSequenceClassification"]}, "BertForSequenceClassification"),
    ({"architectures": ["T5ForConditionalGeneration"], "model_type": "t5"}, "T5ForConditionalGeneration"),
])
def test_unsupported_options_are_named(config, named):
    with pytest.raises(ConfigError, match="not supported|unsupported") as err:
        hf_to_tfkit(config, {})
    assert named in str(err.value)


GPT2 = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": V, "n_embd": D, "n_layer": L,
        "n_head": H, "n_positions": 64}


@pytest.mark.parametrize("config, message", [
    ({**GPT2, "n_layer": "2"}, "n_layer: got '2', expected an integer"),
    ({**GPT2, "n_embd": 64.0}, "n_embd: got 64.0, expected an integer"),
    ({**GPT2, "n_inner": "256"}, "n_inner: got '256', expected an integer or null"),
    ({**GPT2, "layer_norm_epsilon": None}, "layer_norm_epsilon: got None, expected a number"),
    ({**GPT2, "tie_word_embeddings": "no"}, "tie_word_embeddings: got 'no', expected true/false"),
    ({**GPT2, "architectures": "GPT2LMHeadModel"},
     "architectures: got 'GPT2LMHeadModel', expected a list of strings or null"),
    ({**BERT, "hidden_act": ["gelu"]}, "hidden_act: got ['gelu'], expected a string"),
    ({**LLAMA, "num_attention_heads": "4", "attention_bias": "yes"},
     "num_attention_heads: got '4', expected an integer; attention_bias: got 'yes', expected true/false"),
    ({**LLAMA, "rope_parameters": {"rope_type": "default", "rope_theta": "1e4"}},
     "rope_parameters.rope_theta: got '1e4', expected a number"),
    ({**LLAMA, "sliding_window": "16"}, "sliding_window: got '16', expected an integer or null"),
])
def test_a_wrong_typed_hf_value_is_a_config_error_naming_the_file_and_key(config, message):
    from tfkit.models.hf_import import config_from_hf

    with pytest.raises(ConfigError) as err:
        config_from_hf(config, "hf/config.json")
    assert str(err.value) == f"hf/config.json: {message}"


def test_an_out_of_range_hf_value_is_named_by_the_tfkit_key_it_maps_to():
    with pytest.raises(ConfigError, match=r"model\.norm_eps: got -1e-05, expected a positive finite number"):
        hf_to_tfkit({**GPT2, "layer_norm_epsilon": -1e-5}, {})


def test_import_hf_of_a_wrong_typed_config_is_one_line_and_exit_code_2(tmp_path):
    from typer.testing import CliRunner

    from tfkit.cli.main import app

    src = tmp_path / "hf"
    src.mkdir()
    (src / "config.json").write_text(json.dumps({**GPT2, "n_layer": "2"}))
    result = CliRunner().invoke(app, ["import-hf", str(src), "--out", str(tmp_path / "ckpt")])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    last = result.stderr.strip().splitlines()[-1]
    assert last == f"error: {src / 'config.json'}: n_layer: got '2', expected an integer"
    assert not (tmp_path / "ckpt").exists()


def test_transformers_4_llama_configs_give_rope_theta_at_the_top_level():
    from tfkit.models.hf_import import config_from_hf

    family, arch, cfg = config_from_hf({**LLAMA, "rope_theta": 500000.0, "rope_scaling": None, "rms_norm_eps": 1e-5,
                                        "num_key_value_heads": 1, "tie_word_embeddings": True})
    assert (family, arch) == ("llama", "LlamaForCausalLM")
    assert (cfg.rope_theta, cfg.norm_eps, cfg.n_kv_heads, cfg.tie_embeddings) == (500000.0, 1e-5, 1, True)


def test_the_library_never_imports_transformers():
    """transformers is a test extra only: importing and exporting work without it."""
    code = ("import sys, tfkit.models.hf_import, tfkit.models.hf_export, tfkit.cli.hf; "
            "assert 'transformers' not in sys.modules, 'transformers was imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_every_unsupported_option_is_reported_at_once():
    config = {**LLAMA, "rope_scaling": {"rope_type": "linear", "factor": 2.0}, "head_dim": 8}
    with pytest.raises(ConfigError) as err:
        hf_to_tfkit(config, {})
    assert "rope_scaling" in str(err.value) and "head_dim=8" in str(err.value)


def test_missing_unexpected_and_misshaped_weights_are_named(tmp_path):
    hf = transformers.GPT2LMHeadModel(gpt2_config())
    state, config = dict(hf.state_dict()), hf.config.to_dict()
    with pytest.raises(CheckpointError, match=r"missing: transformer\.h\.1\.ln_2\.bias"):
        hf_to_tfkit(config, {k: v for k, v in state.items() if k != "transformer.h.1.ln_2.bias"})
    with pytest.raises(CheckpointError, match=r"no place for: transformer\.h\.0\.extra\.weight"):
        hf_to_tfkit(config, {**state, "transformer.h.0.extra.weight": torch.zeros(3)})
    with pytest.raises(CheckpointError, match=r"transformer\.wpe\.weight \(32, 64\) \(expected \(64, 64\)\)"):
        hf_to_tfkit(config, {**state, "transformer.wpe.weight": torch.zeros(32, D)})


def test_a_misshaped_fused_weight_is_named_as_the_file_holds_it():
    """GPT-2's c_attn holds q | k | v as one Conv1D (in, 3 * out): the error names it and its shape in the
    file, not the tfkit tensors it would be split into."""
    hf = transformers.GPT2LMHeadModel(gpt2_config())
    state = {**hf.state_dict(), "transformer.h.0.attn.c_attn.weight": torch.zeros(D, D)}
    with pytest.raises(CheckpointError) as err:
        hf_to_tfkit(hf.config.to_dict(), state)
    assert str(err.value) == ("GPT2LMHeadModel weights do not match its config.json: "
                              f"transformer.h.0.attn.c_attn.weight ({D}, {D}) (expected ({D}, {3 * D}))")


def test_bare_llama_model_imports_with_an_initialised_head_and_a_warning(tmp_path):
    """A LlamaModel has no lm_head (and unlike GPT-2 does not tie one): its hidden states import exactly
    and the head is initialised, as a bare BertModel's MLM head is."""
    hf = transformers.LlamaModel(llama_config())
    ours, cfg, messages = imported(save_hf(hf, tmp_path / "hf"), tmp_path / "ckpt")
    assert not cfg.tie_embeddings
    assert any(m.startswith("LlamaModel has no LM head: lm_head.weight initialised") for m in messages)
    assert read_config(tmp_path / "ckpt")["hf_architecture"] == "LlamaModel"
    with torch.no_grad():
        expected = hf(IDS).last_hidden_state @ ours.lm_head.weight.T  # (B, T, V) through the new head
        torch.testing.assert_close(ours(IDS), expected, atol=ATOL, rtol=0)
    assert 0 < ours.lm_head.weight.std() < 0.1  # initialised like tfkit's own init, not copied


def test_a_causal_lm_without_its_head_is_still_refused():
    """Only a bare model lacks its head by design; a LlamaForCausalLM without lm_head is a broken file."""
    hf = transformers.LlamaForCausalLM(llama_config())
    state = {k: v for k, v in hf.state_dict().items() if k != "lm_head.weight"}
    with pytest.raises(CheckpointError, match=r"^LlamaForCausalLM weights are missing: lm_head\.weight$"):
        hf_to_tfkit(hf.config.to_dict(), state)


def test_importing_a_tfkit_checkpoint_names_its_folder_and_says_what_it_is(tmp_path):
    from tfkit.models import ModelConfig, build_model, save_model

    save_model(build_model(ModelConfig(vocab_size=V, d_model=D, n_layers=L, n_heads=H, max_seq_len=T_MAX)),
               tmp_path / "ckpt")
    with pytest.raises(ConfigError) as err:
        import_hf(tmp_path / "ckpt", tmp_path / "out")
    assert str(err.value).startswith(f"{tmp_path / 'ckpt' / 'config.json'}: this is already a tfkit checkpoint")
    assert not (tmp_path / "out").exists()


def test_existing_output_is_never_overwritten_without_force(tmp_path):
    src = save_hf(transformers.GPT2LMHeadModel(gpt2_config()), tmp_path / "hf")
    out = tmp_path / "ckpt"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(CheckpointError, match="already exists; use --force"):
        import_hf(src, out)
    with pytest.raises(CheckpointError, match="is not a model folder"):  # --force replaces earlier outputs only
        import_hf(src, out, force=True)
    assert (out / "keep.txt").read_text() == "mine"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HFInteropWarning)
        import_hf(src, tmp_path / "earlier")
        (tmp_path / "earlier" / "stale.txt").write_text("from the earlier import")
        import_hf(src, tmp_path / "earlier", force=True)
    assert not (tmp_path / "earlier" / "stale.txt").exists() and (tmp_path / "earlier" / "model.safetensors").is_file()


def test_force_never_replaces_a_huggingface_model_or_a_training_checkpoint(tmp_path):
    """--force replaces what import-hf writes (a tfkit model folder), not the user's HF source models nor a
    training checkpoint, whatever config.json they hold."""
    src = save_hf(transformers.GPT2LMHeadModel(gpt2_config()), tmp_path / "gpt2")
    other = save_hf(transformers.LlamaForCausalLM(llama_config()), tmp_path / "llama")
    before = {p.name: p.read_bytes() for p in other.iterdir()}
    with pytest.raises(CheckpointError, match=r"exists and is a HuggingFace model folder that tfkit export-hf did not"):
        import_hf(src, other, force=True)
    assert {p.name: p.read_bytes() for p in other.iterdir()} == before
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HFInteropWarning)
        import_hf(src, tmp_path / "ckpt")
    (tmp_path / "ckpt" / "trainer_state.pt").write_bytes(b"optimizer state")
    with pytest.raises(CheckpointError, match=r"exists and is a training checkpoint \(it has trainer_state\.pt\)"):
        import_hf(src, tmp_path / "ckpt", force=True)
    assert (tmp_path / "ckpt" / "trainer_state.pt").read_bytes() == b"optimizer state"
