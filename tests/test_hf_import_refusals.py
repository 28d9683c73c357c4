"""`import_hf` refuses what it cannot import exactly, in one message that names it: unsupported options
(all at once), wrong-typed or out-of-range config values by file and key, missing, unexpected or misshaped
weights, a tfkit checkpoint given as the source, and an output folder it may not replace."""

import json
import warnings

import pytest
import torch

from tfkit.checkpoints.hf_import import hf_to_tfkit, import_hf
from tfkit.checkpoints.hf_names import HFInteropWarning
from tfkit.errors import CheckpointError, ConfigError

from helpers import T_MAX, D, H, L, V, gpt2_config, llama_config, save_hf

transformers = pytest.importorskip("transformers")


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
    from tfkit.checkpoints.hf_import import config_from_hf

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
    from tfkit.checkpoints.hf_import import config_from_hf

    family, arch, cfg = config_from_hf({**LLAMA, "rope_theta": 500000.0, "rope_scaling": None, "rms_norm_eps": 1e-5,
                                        "num_key_value_heads": 1, "tie_word_embeddings": True})
    assert (family, arch) == ("llama", "LlamaForCausalLM")
    assert (cfg.rope_theta, cfg.norm_eps, cfg.n_kv_heads, cfg.tie_embeddings) == (500000.0, 1e-5, 1, True)


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
    # a table of another size than config.json declares: named by the key, before anything is mapped
    with pytest.raises(CheckpointError, match=r"n_positions=64 \(the weights hold 32\)"):
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


def test_a_causal_lm_without_its_head_is_still_refused():
    """Only a bare model lacks its head by design; a LlamaForCausalLM without lm_head is a broken file."""
    hf = transformers.LlamaForCausalLM(llama_config())
    state = {k: v for k, v in hf.state_dict().items() if k != "lm_head.weight"}
    with pytest.raises(CheckpointError, match=r"^LlamaForCausalLM weights are missing: lm_head\.weight$"):
        hf_to_tfkit(hf.config.to_dict(), state)


def test_importing_a_tfkit_checkpoint_names_its_folder_and_says_what_it_is(tmp_path):
    from tfkit.checkpoints.weights import save_model
    from tfkit.models import ModelConfig, build_model

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
