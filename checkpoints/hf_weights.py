"""A HuggingFace folder's weights: read (`read_hf_weights`: safetensors, a pickled state dict read as plain
data, or their sharded index), and the sizes its config.json declares checked against them before anything is
built.

A model is built (on the meta device, no memory) and its weights mapped one rule per tensor per layer, so
the work grows with what config.json declares, not with what the files hold: `n_layer: 1000000` beside the
weights of 2 layers took minutes and a gigabyte of Python objects to reach the refusal that the weights are
missing. Here every declared size with a tensor that shows it (layers, hidden size, vocabulary, intermediate
size, learned positions, segment types, key/value heads) is compared with the shapes the files hold, read from
the safetensors headers (`header_shapes`: the index and each shard's header, no tensor loaded) or from the
state dict of a pickled file, and a mismatch is one line naming the key, its value and what the weights hold.
"""

from __future__ import annotations

import re
from pathlib import Path

from torch import Tensor

from ..errors import CheckpointError
from ..jsonfile import member
from ..models.config import ModelConfig
from .hf_names import read_json
from .plain_pickle import load_plain_pickle, pickle_refusal

# Per family: the ModelConfig field -> the config.json key that declares it (as named in the refusal).
KEYS = {
    "bert": {"n_layers": "num_hidden_layers", "d_model": "hidden_size", "vocab_size": "vocab_size",
             "ffn_dim": "intermediate_size", "max_seq_len": "max_position_embeddings",
             "type_vocab_size": "type_vocab_size"},
    "gpt2": {"n_layers": "n_layer", "d_model": "n_embd", "vocab_size": "vocab_size", "ffn_dim": "n_inner",
             "max_seq_len": "n_positions"},
    "llama": {"n_layers": "num_hidden_layers", "d_model": "hidden_size", "vocab_size": "vocab_size",
              "ffn_dim": "intermediate_size", "kv_heads": "num_key_value_heads"},
}
LAYER = {"bert": r"encoder\.layer\.(\d+)\.", "gpt2": r"(?:^|\.)h\.(\d+)\.", "llama": r"(?:^|\.)layers\.(\d+)\."}
# (name suffix, the field each dimension shows); None: a dimension that shows nothing declared on its own
TENSORS = {
    "bert": [("embeddings.word_embeddings.weight", ("vocab_size", "d_model")),
             ("embeddings.position_embeddings.weight", ("max_seq_len", None)),
             ("embeddings.token_type_embeddings.weight", ("type_vocab_size", None)),
             ("layer.0.intermediate.dense.weight", ("ffn_dim", None))],
    "gpt2": [("wte.weight", ("vocab_size", "d_model")), ("wpe.weight", ("max_seq_len", None)),
             ("h.0.mlp.c_fc.weight", (None, "ffn_dim"))],  # Conv1D: (in, out)
    "llama": [("embed_tokens.weight", ("vocab_size", "d_model")), ("layers.0.mlp.up_proj.weight", ("ffn_dim", None)),
              ("layers.0.self_attn.k_proj.weight", ("kv_rows", None))],
}


def header_shapes(folder: Path) -> dict[str, tuple[int, ...]] | None:
    """{tensor name: shape} of a HF folder's safetensors weights, read from the headers alone (the
    `.index.json` and each shard's header); None for pickled weights (pytorch_model.bin), whose shapes are
    only known once loaded."""
    from safetensors import SafetensorError, safe_open

    index = folder / "model.safetensors.index.json"
    if (folder / "model.safetensors").is_file():
        files = [folder / "model.safetensors"]
    elif index.is_file():  # read_hf_weights' order: model.safetensors, its index, then pickled weights
        files = _shards(folder, index)
    else:
        return None
    shapes = {}
    for file in files:
        try:
            with safe_open(str(file), framework="pt") as f:
                shapes.update({name: tuple(f.get_slice(name).get_shape()) for name in f.keys()})
        except (SafetensorError, RuntimeError, OSError) as err:
            raise CheckpointError(f"{file}: cannot read the weights ({str(err).splitlines()[0]})") from None
    return shapes


def check_declared_sizes(family: str, cfg: ModelConfig, hf_config: dict, shapes: dict[str, tuple[int, ...]],
                         source: str | Path) -> None:
    """CheckpointError naming every size `source` (config.json) declares that the weights' `shapes` do not hold,
    e.g. `n_layer=1000000 (the weights hold 2 layers)`. Sizes no tensor shows are left to the mapping."""
    family = "llama" if family in ("qwen3", "mistral") else family
    keys = KEYS[family]
    declared = {field: getattr(cfg, field) for field in keys if field != "kv_heads"}
    held: dict[str, int] = {}
    layers = {int(m.group(1)) for name in shapes if (m := re.search(LAYER[family], name))}
    held["n_layers"] = len(layers)
    for suffix, fields in TENSORS[family]:
        shape = next((s for name, s in shapes.items() if name == suffix or name.endswith("." + suffix)), None)
        if shape is None or len(shape) != len(fields):
            continue  # absent or of another rank: the mapping names it
        held.update({field: size for field, size in zip(fields, shape) if field is not None})
    if "kv_rows" in held:  # rows of k_proj: key/value heads x head size
        declared["kv_heads"], held["kv_heads"] = cfg.kv_heads, held.pop("kv_rows") / cfg.head_dim
    problems = [f"{_declared(keys[field], field, declared[field], hf_config)} (the weights hold "
                f"{_held(field, held[field])})"
                for field in declared if field in held and held[field] != declared[field]]
    if problems:
        raise CheckpointError(f"{source}: declares sizes its weights do not have: {'; '.join(problems)}; the "
                              "config.json does not belong to these weights (or one of them is damaged)")


def _declared(key: str, field: str, value: int, hf_config: dict) -> str:
    """`key=value` as config.json spells it; a key it leaves out, with the default that gave the value."""
    if hf_config.get(key) is not None:
        return f"{key}={value}"
    default = {"kv_heads": "num_attention_heads", "ffn_dim": "4 x the hidden size"}.get(field, "its default")
    return f"{key} unset ({default}: {value})"


def _held(field: str, size: float) -> str:
    if field == "n_layers":
        return f"{size} layer{'s' * (size != 1)}"
    if field == "kv_heads":
        return f"{size:g} key/value heads of this head size"
    return f"{int(size):,}"


def _load_file(file: Path) -> dict[str, Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        if file.suffix == ".safetensors":
            return load_file(str(file))
    except (SafetensorError, RuntimeError, OSError, EOFError) as err:
        raise CheckpointError(f"{file}: cannot read the weights ({str(err).splitlines()[0]})") from None
    try:
        state = load_plain_pickle(file)  # pickle, but no code execution
    except Exception as err:  # noqa: BLE001 - a hostile or damaged pickle raises many types
        raise CheckpointError(f"{file}: {pickle_refusal(err, 'weights file')}") from None
    if not isinstance(state, dict) or not all(isinstance(k, str) and isinstance(v, Tensor) for k, v in state.items()):
        raise CheckpointError(f"{file}: expected a state dict (tensor names to tensors), got {type(state).__name__}")
    return state


def _shards(folder: Path, index: Path) -> list[Path]:
    """The files a sharded index's weight_map names, each inside `folder` (a downloaded folder may only
    read files inside itself: `../x.safetensors` or an absolute path is refused)."""
    weight_map = read_json(index).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointError(f"{index}: expected a 'weight_map' object of tensor names to shard files")
    return sorted({member(folder, name, index, CheckpointError) for name in weight_map.values()})


def read_hf_weights(folder: Path) -> dict[str, Tensor]:
    """The state dict of a HF folder: model.safetensors, pytorch_model.bin, or their sharded `.index.json`."""
    for name in ("model.safetensors", "pytorch_model.bin"):
        if (folder / name).is_file():
            return _load_file(folder / name)
        index = folder / f"{name}.index.json"
        if index.is_file():
            state: dict[str, Tensor] = {}
            for shard in _shards(folder, index):
                state.update(_load_file(shard))
            return state
    raise CheckpointError(f"{folder}: no model.safetensors or pytorch_model.bin (nor a sharded index)")
