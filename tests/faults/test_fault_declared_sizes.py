"""A HuggingFace folder whose config.json declares sizes its weights do not have (`n_layer: 1000000` beside the
weights of 2 layers, a hidden size, vocabulary, intermediate size, position table, segment types or key/value
heads the tensors do not show) is refused by `import-hf` in one line naming the key, the value and what the
weights hold, before any weight is mapped or any model built (the mapping's work grows with the declared
depth: minutes for a million layers); safetensors or pickled weights, exit code 2, nothing written."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from fault_helpers import assert_one_line_error, cli

from tfkit.checkpoints import hf_import
from tfkit.checkpoints.hf_export import export_hf
from tfkit.checkpoints.weights import save_model
from tfkit.models import build_model
from tfkit.models.config import ModelConfig

FAMILIES = {
    "gpt2": dict(arch="gpt", positions="learned", norm="layernorm", activation="gelu_tanh"),
    "llama": dict(arch="gpt", positions="rope", norm="rmsnorm", activation="swiglu", bias=False, n_kv_heads=2,
                  tie_embeddings=False, dropout=0.0, attn_dropout=0.0),
    "bert": dict(arch="bert", norm_placement="post"),
}
# (family, config.json key, the value written): each a size some tensor shows
CASES = [
    ("gpt2", "n_layer", 1_000_000), ("gpt2", "n_embd", 64), ("gpt2", "vocab_size", 1_000_000_000),
    ("gpt2", "n_inner", 999), ("gpt2", "n_positions", 10**9),
    ("llama", "num_hidden_layers", 1_000_000), ("llama", "intermediate_size", 4096),
    ("llama", "num_key_value_heads", 1), ("llama", "vocab_size", 10**9),
    ("bert", "num_hidden_layers", 20_000), ("bert", "max_position_embeddings", 10**9),
    ("bert", "type_vocab_size", 1000), ("bert", "intermediate_size", 100),
]
# each case from safetensors headers; the huge depths from pickled weights (pytorch_model.bin) too
CASES = [(*case, False) for case in CASES] + [(*case, True) for case in CASES if "layer" in case[1]]


@pytest.fixture(scope="module")
def hf_folders(tmp_path_factory):
    """A tfkit export of a 2-layer model of each family: the HF folders the cases damage."""
    root, out = tmp_path_factory.mktemp("declared"), {}
    for family, fields in FAMILIES.items():
        cfg = ModelConfig(vocab_size=300, d_model=32, n_layers=2, n_heads=4, max_seq_len=64, **fields).validate()
        torch.manual_seed(0)
        save_model(build_model(cfg), root / f"{family}-ckpt")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # no tokenizer: the export says so
            export_hf(root / f"{family}-ckpt", root / family)
        out[family] = root / family
    return out


def _damaged(source, tmp_path, key: str, value: int, pickled: bool):
    folder = tmp_path / "hf"
    folder.mkdir()
    config = json.loads((source / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, key: value}))
    if pickled:  # pytorch_model.bin: shapes known only once loaded, still before anything is built
        from safetensors.torch import load_file

        torch.save(load_file(str(source / "model.safetensors")), folder / "pytorch_model.bin")
    else:
        (folder / "model.safetensors").write_bytes((source / "model.safetensors").read_bytes())
    return folder


def _no_mapping(*args, **kwargs):
    raise AssertionError("the weights were mapped onto a model before the declared sizes were checked")


@pytest.mark.parametrize(("family", "key", "value", "pickled"), CASES,
                         ids=[f"{f}-{k}-{'pickled' if p else 'safetensors'}" for f, k, _, p in CASES])
def test_a_declared_size_the_weights_do_not_have_is_one_line(family, key, value, pickled, hf_folders, tmp_path,
                                                            monkeypatch):
    monkeypatch.setattr(hf_import, "_convert", _no_mapping)
    monkeypatch.setattr(hf_import, "build_model", _no_mapping)
    folder = _damaged(hf_folders[family], tmp_path, key, value, pickled)
    line = assert_one_line_error(cli(["import-hf", folder, "--out", tmp_path / "out"]), f"{key}={value}",
                                 "the weights hold", "config.json")
    assert "2 layers" in line or "layer" not in key
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("command", ["generate", "eval", "export-hf", "export-gguf", "pretrain-init-from"])
def test_a_tfkit_checkpoint_declaring_more_blocks_than_it_holds_is_one_line(command, tiny_run, copy_run, tmp_path,
                                                                            monkeypatch):
    """The same for tfkit's own config.json: `model.n_layers` against the blocks model.safetensors holds, read
    from its header before any model of it is built (on the meta device for a load or a model card's count of
    parameters, for real when a run starts from it)."""
    from tfkit.checkpoints import model_card, weights
    from tfkit.trainer import run as trainer_run

    pytest.importorskip("gguf") if command == "export-gguf" else None
    for module in (weights, model_card, trainer_run):
        monkeypatch.setattr(module, "build_model", _no_mapping)
    monkeypatch.setenv("TFKIT_CACHE", str(tmp_path / ".cache"))
    ckpt = copy_run() / "checkpoints" / "step-4"
    config = json.loads((ckpt / "config.json").read_text())
    config["model"]["n_layers"] = 1_000_000
    (ckpt / "config.json").write_text(json.dumps(config))
    text = tmp_path / "text.txt"
    text.write_text("Some text to read. " * 200)
    args = {"generate": ["generate", ckpt, "-p", "hi", "-n", "2"], "eval": ["eval", ckpt, "--data", text],
            "export-hf": ["export-hf", ckpt, "--out", tmp_path / "hf"],
            "export-gguf": ["export-gguf", ckpt, "--out", tmp_path / "m.gguf"],
            "pretrain-init-from": ["pretrain", tiny_run[0], "--run-dir", tmp_path / "new-run", "--set",
                                   f"train.init_from={ckpt}"]}[command]
    assert_one_line_error(cli(args), "model.n_layers=1000000", "holds 2 blocks")
