"""Export a tfkit decoder as one GGUF file that llama.cpp runs (`tfkit export-gguf`).

The file is written with `gguf`, the package llama.cpp's authors publish for the format (the optional
`export` extra), and laid out as llama.cpp's own `convert_hf_to_gguf.py` lays out the HuggingFace model
`export-hf` writes for the same checkpoint, so the tensors start from that already-tested mapping
(`hf_state.tfkit_to_hf`) and take the converter's steps from there:
- the Llama layout (rope, RMSNorm, SwiGLU, any n_kv_heads, tied or untied head, biases or none): Q and K
  rows permuted from HF's rotate-half RoPE (pairs i, i + D/2) to llama.cpp's adjacent pairs (2i, 2i+1),
  per head (`permute`, the converter's `LlamaModel.permute`);
- GPT-2's (learned positions, pre-LN LayerNorm, GELU, biases, MHA): the Conv1D (in, out) weights
  transposed back to (out, in);
- names from gguf's own `TensorNameMap` (`token_embd`, `blk.N.attn_q`, ...); 1-D tensors, norms and the
  position table stay F32, the matrices take `dtype` (Q8_0 falls back to F16 for a row that is not a
  multiple of 32 values, as the converter does);
- the tokenizer as llama.cpp's `gpt2` kind (byte-level BPE, the GPT-2 pre-tokenizer): every token,
  its type (normal, control for special tokens, unused padding rows), the merges, the special ids, and
  the document framing tfkit trained with (`add_bos_token` with the token a document starts after, as
  `tfkit generate` frames a prompt).
What llama.cpp cannot run (ALiBi, sinusoidal or no positions, post-norm, BatchNorm, ...) is a ConfigError
naming every field and why, raised before anything is written.

The model card belongs to its file. HuggingFace's GGUF repositories keep one README.md per repository for
the several quantisations of one model, which several exports into one folder (of one checkpoint or of
several) cannot share without overwriting each other's: the card of `a.gguf` is `a.README.md`
(`layout.gguf_card_name`), and the card is also inside the file (`tfkit.model_card`), so the two are one
unit: a kill at any moment leaves `a.gguf` old or new with its own card inside, and beside it that card
or none, never another file's (the old card is removed before the new file is renamed into place, the new
card written after). A card a user wrote there (no tfkit mark) is kept, with a warning.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from .. import __version__
from ..errors import CheckpointError, ConfigError, DataError
from ..files import atomic_file, write_atomic, write_problem
from ..replacing import check_not_an_input
from ..layout import CARD_MARK, gguf_card_name
from ..models.config import ModelConfig
from ..tokenization.tokenizer import TfkitTokenizer, load_tokenizer
from .folders import resolve_checkpoint
from .hf_state import tfkit_to_hf
from .weights import load_model

EXTRA = 'pip install "tfkit[export]"'
# --dtype -> (gguf's GGMLQuantizationType of the matrices, its LlamaFileType for general.file_type)
DTYPES = {"f32": ("F32", "ALL_F32"), "f16": ("F16", "MOSTLY_F16"), "bf16": ("BF16", "MOSTLY_BF16"),
          "q8_0": ("Q8_0", "MOSTLY_Q8_0")}
MARK_KEY = "tfkit.version"  # in files this exporter wrote: what --force may replace
CARD_KEY = "tfkit.model_card"  # the file's model card, the text of the card beside it
SCALED = ("attn_scale", ("sqrt_d",), "attention scores scaled by 1/sqrt(head size)")
STANDARD = (SCALED, ("attn_score", ("dot",), "dot-product attention scores"),
            ("shared_qk", (False,), "separate query and key projections"),
            ("shared_kv", (False,), "separate key and value projections"),
            ("pad_fill", ("-inf",), "padding masked out exactly"), ("residual", (True,), "residual connections"),
            ("share_layers", (False,), "weights of its own in every block"))
NEEDS = {  # what each llama.cpp graph computes, as (field, allowed values, what the graph has)
    "llama": [("norm", ("rmsnorm",), "RMSNorm"), ("norm_placement", ("pre",), "pre-norm blocks"),
              ("activation", ("swiglu",), "a SwiGLU feed-forward"),
              ("scale_embeddings", (False,), "unscaled token embeddings"), *STANDARD],
    "gpt2": [("norm", ("layernorm",), "LayerNorm"), ("norm_placement", ("pre",), "pre-norm blocks"),
             ("activation", ("gelu_tanh", "gelu"), "a GELU feed-forward"), ("bias", (True,), "biases everywhere"),
             ("scale_embeddings", (False,), "unscaled token embeddings"), *STANDARD],
}
LAYOUT_NAME = {"llama": "Llama layout (rope positions)", "gpt2": "GPT-2 layout (learned positions)"}


class GGUFWarning(UserWarning):
    """A GGUF export that llama.cpp computes slightly differently (shown as one yellow line by the CLI)."""


def gguf_layout(cfg: ModelConfig) -> str:
    """The llama.cpp architecture a config runs as (llama, gpt2); ConfigError naming every field that
    llama.cpp's graphs cannot compute, and why."""
    if cfg.arch != "gpt":
        raise ConfigError(f"model.arch={cfg.arch}: GGUF export covers the gpt family (decoders) only")
    if cfg.positions not in ("rope", "learned"):
        raise ConfigError(f"model.positions={cfg.positions}: llama.cpp runs tfkit decoders with rope positions "
                          f"(its Llama layout) or learned ones (GPT-2's), and {cfg.positions} is neither")
    layout = "llama" if cfg.positions == "rope" else "gpt2"
    problems = [f"model.{name}={getattr(cfg, name)}: llama.cpp's {LAYOUT_NAME[layout]} has {what}"
                for name, allowed, what in NEEDS[layout] if getattr(cfg, name) not in allowed]
    if layout == "gpt2" and cfg.kv_heads != cfg.n_heads:
        problems.append(f"model.n_kv_heads={cfg.n_kv_heads}: llama.cpp's {LAYOUT_NAME[layout]} has multi-head "
                        f"attention only (`tfkit convert-mqa-to-gqa CHECKPOINT --kv-heads {cfg.n_heads}` regroups "
                        "it to MHA, the same function)")
    if problems:
        raise ConfigError("; ".join(problems) + "; llama.cpp cannot run this model")
    if layout == "gpt2" and cfg.activation == "gelu":
        warnings.warn("model.activation=gelu: llama.cpp's GPT-2 graph computes GELU with its tanh approximation "
                      "(gelu_tanh), so its logits differ slightly from tfkit's", GGUFWarning, stacklevel=2)
    return layout


def permute(weight: Tensor, n_heads: int) -> Tensor:
    """Q or K rows (weight or bias) from rotate-half RoPE pairs (i, i + D/2) to adjacent pairs (2i, 2i+1),
    per head: convert_hf_to_gguf.py's `LlamaModel.permute`."""
    return (weight.reshape(n_heads, 2, weight.shape[0] // n_heads // 2, *weight.shape[1:])  # (H, 2, D/2, ...)
            .swapaxes(1, 2).reshape(weight.shape))  # (H, D/2, 2, ...) -> rows 0, D/2, 1, D/2+1, ...


def gguf_tensors(cfg: ModelConfig, state: dict[str, Tensor], layout: str) -> dict[str, np.ndarray]:
    """{GGUF name: float32 array} of the model, in llama.cpp's layout and names."""
    gguf = _gguf()
    _, hf_state = tfkit_to_hf(cfg, state)
    arch = gguf.MODEL_ARCH.LLAMA if layout == "llama" else gguf.MODEL_ARCH.GPT2
    names = gguf.get_tensor_name_map(arch, cfg.n_layers)
    out = {}
    for hf_name, tensor in hf_state.items():
        tensor = tensor.detach().to(torch.float32)
        if layout == "llama" and hf_name.endswith(("q_proj.weight", "q_proj.bias")):
            tensor = permute(tensor, cfg.n_heads)
        elif layout == "llama" and hf_name.endswith(("k_proj.weight", "k_proj.bias")):
            tensor = permute(tensor, cfg.kv_heads)
        elif layout == "gpt2" and hf_name.endswith((".c_attn.weight", ".c_proj.weight", ".c_fc.weight")):
            tensor = tensor.T  # Conv1D (in, out) -> (out, in)
        name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if name is None:  # a tensor the mapping does not produce: a bug, not a user mistake
            raise KeyError(f"{hf_name} has no GGUF name for {layout}")
        out[name] = tensor.contiguous().numpy()
    return out


def tensor_type(name: str, array: np.ndarray, dtype: str):
    """The GGMLQuantizationType a tensor is stored as: F32 for 1-D tensors, norms, biases and the position
    table (as the converter keeps them), `dtype` for the other matrices."""
    gguf = _gguf()
    keep = (array.ndim <= 1 or name.endswith("_norm.weight") or not name.endswith(".weight")
            or name.startswith("position_embd"))
    return gguf.GGMLQuantizationType.F32 if keep else gguf.GGMLQuantizationType[DTYPES[dtype][0]]


def gguf_vocab(tok: TfkitTokenizer, vocab_size: int, source: Path) -> tuple[list[str], list[int], list[str]]:
    """(tokens, token types, merges) as llama.cpp's `gpt2` tokenizer reads them; DataError for a tokenizer
    it would split text differently with (not byte-level BPE, or a normalizer before it)."""
    gguf = _gguf()
    spec = json.loads(tok.tokenizer.to_str())
    pre, model = spec.get("pre_tokenizer") or {}, spec.get("model") or {}
    if (model.get("type") != "BPE" or pre.get("type") != "ByteLevel" or not pre.get("use_regex", True)
            or pre.get("add_prefix_space") or spec.get("normalizer")):
        what = (f"{model.get('type')} with a {pre.get('type')} pre-tokenizer"
                + (" and a normalizer" if spec.get("normalizer") else ""))
        raise DataError(f"{source / 'tokenizer.json'}: GGUF export writes byte-level BPE tokenizers (llama.cpp's "
                        f"gpt2 kind, the GPT-2 pre-tokenizer, no normalizer); this one is {what}, which llama.cpp "
                        "would split text differently with")
    if tok.vocab_size > vocab_size:
        raise ConfigError(f"the checkpoint's tokenizer has {tok.vocab_size} tokens but model.vocab_size is "
                          f"{vocab_size}; the exported model could not embed every id")
    by_id = {i: t for t, i in tok.tokenizer.get_vocab(with_added_tokens=True).items()}
    added = tok.tokenizer.get_added_tokens_decoder()
    tokens, types = [], []
    for i in range(vocab_size):  # rows past the tokenizer (a padded vocabulary) are unused, as the converter names them
        token = by_id.get(i)
        tokens.append(f"[PAD{i}]" if token is None else token)
        types.append(gguf.TokenType.UNUSED if token is None else gguf.TokenType.NORMAL if i not in added
                     else gguf.TokenType.CONTROL if added[i].special else gguf.TokenType.USER_DEFINED)
    merges = [m if isinstance(m, str) else " ".join(p.replace(" ", chr(ord(" ") + 256)) for p in m)
              for m in model.get("merges", [])]  # gguf.SpecialVocab's encoding of a space inside a merge
    return tokens, [int(t) for t in types], merges


def check_new_file(out: Path, source: Path, force: bool) -> None:
    """Before any work: `out` and its card are not the input nor inside it, can be written, and `out`
    replaces (with force only) a GGUF file this exporter wrote, never another file or a folder."""
    target = out.resolve()
    card = out.with_name(gguf_card_name(out.name))
    for path in (out, card):
        check_not_an_input(path, [source], "out", CheckpointError)
    if card.is_dir():
        raise CheckpointError(f"out {out}: its model card's path {card} is a folder; choose another name",
                              params=("out", "force"))
    problem = write_problem(out)
    if problem:
        raise CheckpointError(f"out {out}: {problem}", params=("out", "force"))
    if target.is_dir():
        raise CheckpointError(f"out {out}: is a folder; out names the .gguf file to write", params=("out", "force"))
    if target.exists() and not force:
        raise CheckpointError(f"out {out}: already exists; use force to replace it", params=("out", "force"))
    if target.exists() and not _written_here(target):
        raise CheckpointError(f"out {out}: exists and is not a GGUF file tfkit export-gguf wrote; force "
                              "replaces only that, so it is kept: remove it yourself or choose another path",
                              params=("out", "force"))


def _written_here(path: Path) -> bool:
    try:
        return _gguf().GGUFReader(path).get_field(MARK_KEY) is not None
    except (ValueError, OSError, IndexError, OverflowError):  # not a GGUF file, or a truncated one
        return False


def export_gguf(ckpt: str | Path, out: str | Path, *, dtype: str = "f16", force: bool = False,
                name: str | None = None, license: str | None = None, card: str | None = None) -> Path:
    """Write the GGUF file of a tfkit checkpoint or run folder to `out`, with `card` inside it and as
    `a.README.md` beside `a.gguf` (unless a card that tfkit did not write is there; module docstring);
    returns `out`."""
    if dtype not in DTYPES:
        raise ConfigError(f"dtype {dtype!r}: expected one of {', '.join(DTYPES)}")
    gguf = _gguf()
    folder, out = resolve_checkpoint(ckpt), Path(out)
    check_new_file(out, folder, force)
    model, cfg = load_model(folder)
    layout = gguf_layout(cfg)  # a model llama.cpp cannot run fails before anything is written
    if not (folder / "tokenizer.json").is_file():
        raise CheckpointError(f"{folder}: has no tokenizer.json; llama.cpp needs the tokenizer in the GGUF file")
    tok = load_tokenizer(folder)
    vocab = gguf_vocab(tok, cfg.vocab_size, folder)
    tensors = gguf_tensors(cfg, model.state_dict(), layout)
    out.parent.mkdir(parents=True, exist_ok=True)
    beside = out.with_name(gguf_card_name(out.name))
    ours = card is not None and _card_is_ours(beside)
    with atomic_file(out) as tmp:
        writer = gguf.GGUFWriter(tmp, layout)
        _write_metadata(writer, cfg, layout, dtype, name or folder.name, license)
        if card is not None:
            writer.add_string(CARD_KEY, card)
        _write_vocab(writer, tok, vocab)
        for tensor_name, array in tensors.items():
            _add_tensor(writer, tensor_name, array, dtype)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        if ours:  # the old file's card goes before the new file takes the name: never beside the wrong file
            beside.unlink(missing_ok=True)
    if ours:
        write_atomic(beside, card)
    return out


def _add_tensor(writer, name: str, array: np.ndarray, dtype: str) -> None:
    gguf = _gguf()
    qtype = tensor_type(name, array, dtype)
    try:
        data = gguf.quants.quantize(array, qtype)
    except gguf.QuantError:  # a row that is not a whole number of Q8_0 blocks: F16, as the converter does
        qtype = gguf.GGMLQuantizationType.F16
        data = gguf.quants.quantize(array, qtype)
    writer.add_tensor(name, data, raw_dtype=qtype)


def _write_metadata(writer, cfg: ModelConfig, layout: str, dtype: str, name: str, license: str | None) -> None:
    """The hyperparameters convert_hf_to_gguf.py writes for the layout, and the general.* keys."""
    gguf = _gguf()
    writer.add_type(gguf.GGUFType.MODEL)
    writer.add_name(name)
    if license:
        writer.add_license(license)
    writer.add_string(MARK_KEY, __version__)
    writer.add_block_count(cfg.n_layers)
    writer.add_context_length(cfg.max_seq_len)
    writer.add_embedding_length(cfg.d_model)
    writer.add_feed_forward_length(cfg.ffn_dim)
    writer.add_head_count(cfg.n_heads)
    if layout == "llama":
        writer.add_head_count_kv(cfg.kv_heads)
        writer.add_rope_freq_base(cfg.rope_theta)
        writer.add_layer_norm_rms_eps(cfg.norm_eps)
        writer.add_vocab_size(cfg.vocab_size)
        writer.add_rope_dimension_count(cfg.head_dim)
    else:
        writer.add_layer_norm_eps(cfg.norm_eps)
    writer.add_file_type(gguf.LlamaFileType[DTYPES[dtype][1]])
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)


def _write_vocab(writer, tok: TfkitTokenizer, vocab: tuple[list[str], list[int], list[str]]) -> None:
    tokens, types, merges = vocab
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")  # the GPT-2 regex, which tokenizers' ByteLevel(use_regex=True) applies
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    prefix = tok.document_prefix()  # what `tfkit generate` puts before a prompt: llama.cpp's BOS, added
    if prefix:
        writer.add_bos_token_id(prefix[0])
    writer.add_add_bos_token(bool(prefix))
    for role, add in (("eos", writer.add_eos_token_id), ("unk", writer.add_unk_token_id),
                      ("pad", writer.add_pad_token_id)):
        if (token_id := getattr(tok, f"{role}_id")) is not None:
            add(token_id)


def _card_is_ours(path: Path) -> bool:
    """Whether the card beside the GGUF file may be (re)written: absent, or written by tfkit; one a user
    wrote is kept, with a warning (the card is still inside the file)."""
    if path.exists() and CARD_MARK not in path.read_text(encoding="utf-8", errors="replace"):
        warnings.warn(f"{path}: exists and tfkit did not write it, so it is kept and the model card is only "
                      f"inside the GGUF file ({CARD_KEY})", GGUFWarning, stacklevel=3)
        return False
    return True


def _gguf():
    """The gguf package, imported on use: it is the optional `export` extra."""
    try:
        import gguf
    except ImportError:
        raise ConfigError(f"export-gguf needs the gguf package: {EXTRA}") from None
    return gguf
