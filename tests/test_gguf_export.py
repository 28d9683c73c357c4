"""`export_gguf`: the file read back with gguf's own reader holds llama.cpp's metadata, tensor names, shapes
and values; a forward pass written here the way llama.cpp computes its Llama and GPT-2 graphs (adjacent-pair
RoPE, fused QKV), from nothing but the file's tensors, gives tfkit's logits; models llama.cpp cannot run,
unknown dtypes and existing outputs are refused in one line with nothing written."""

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from typer.testing import CliRunner

from tfkit.checkpoints.gguf_export import GGUFWarning, export_gguf, gguf_layout, permute
from tfkit.checkpoints.weights import save_model
from tfkit.cli.main import app
from tfkit.errors import ConfigError
from tfkit.models import ModelConfig, build_model
from tfkit.tokenization.train import TokenizerSpec, load_tokenizer, train_tokenizer

gguf = pytest.importorskip("gguf")  # the export extra; the test extra installs it

V, D, L, H, T_MAX = 300, 64, 2, 4, 64
BASE = dict(vocab_size=V, d_model=D, n_layers=L, n_heads=H, max_seq_len=T_MAX)
LLAMA = dict(arch="gpt", positions="rope", norm="rmsnorm", activation="swiglu", bias=False, norm_eps=1e-6)
GPT2 = dict(arch="gpt", positions="learned", activation="gelu_tanh")
TEXT = ["The quick brown fox jumps over the lazy dog.", "A lazy dog sleeps; the fox runs away!"] * 20
IDS = torch.randint(2, V, (1, 12), generator=torch.Generator().manual_seed(1))


@pytest.fixture(scope="module")
def bpe(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bpe")
    train_tokenizer(TokenizerSpec(kind="bpe", vocab_size=280, min_frequency=1), TEXT, folder, show_progress=False)
    return folder


def checkpoint(folder: Path, tokenizer: Path, **fields) -> tuple[torch.nn.Module, Path]:
    """A checkpoint whose every parameter (norms too) is moved off its init."""
    torch.manual_seed(0)
    model = build_model(ModelConfig(**{**BASE, **fields})).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    save_model(model, folder)
    load_tokenizer(tokenizer).save(folder)
    return model, folder


def read(path: Path) -> tuple[dict, dict[str, np.ndarray], dict[str, str]]:
    """(metadata, {name: float32 array in numpy's row-major shape}, {name: stored type}) via gguf's reader."""
    reader = gguf.GGUFReader(path)
    meta = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    arrays = {t.name: np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(
        [int(n) for n in reversed(t.shape)]) for t in reader.tensors}
    return meta, arrays, {t.name: t.tensor_type.name for t in reader.tensors}


def rope_adjacent(x: torch.Tensor, theta: float) -> torch.Tensor:
    """llama.cpp's rope (LLAMA_ROPE_TYPE_NORM): dimensions (2i, 2i+1) rotate together. x: (T, H, D)."""
    T, _, Dh = x.shape
    freqs = theta ** (-torch.arange(0, Dh, 2, dtype=torch.float64) / Dh)  # (D/2,)
    angle = torch.arange(T, dtype=torch.float64)[:, None] * freqs  # (T, D/2)
    cos, sin = angle.cos()[:, None, :], angle.sin()[:, None, :]  # (T, 1, D/2)
    x0, x1 = x[..., 0::2], x[..., 1::2]
    return torch.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], dim=-1).reshape(x.shape)


def attend(q, k, v, n_heads: int, n_kv: int):
    """Causal attention of (T, H, D) queries over (T, H_kv, D) keys/values, GQA by repetition; (T, H*D)."""
    k, v = (t.repeat_interleave(n_heads // n_kv, dim=1) for t in (k, v))
    scores = torch.einsum("thd,shd->hts", q, k) / math.sqrt(q.shape[-1])
    T = q.shape[0]
    scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    return torch.einsum("hts,shd->thd", scores.softmax(-1), v).reshape(T, -1)


def llama_cpp_llama(meta: dict, w: dict[str, np.ndarray], ids: list[int]) -> torch.Tensor:
    """The Llama graph as llama.cpp computes it, from the file alone; logits (T, V)."""
    t = {k: torch.tensor(v, dtype=torch.float64) for k, v in w.items()}
    H, H_kv = meta["llama.attention.head_count"], meta["llama.attention.head_count_kv"]
    eps, theta = meta["llama.attention.layer_norm_rms_epsilon"], meta["llama.rope.freq_base"]

    def rms(x, weight):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight

    def lin(x, name):
        return x @ t[f"{name}.weight"].T + (t[f"{name}.bias"] if f"{name}.bias" in t else 0)

    x = t["token_embd.weight"][ids]  # (T, D)
    T = len(ids)
    for i in range(meta["llama.block_count"]):
        h = rms(x, t[f"blk.{i}.attn_norm.weight"])
        q = rope_adjacent(lin(h, f"blk.{i}.attn_q").reshape(T, H, -1), theta)
        k = rope_adjacent(lin(h, f"blk.{i}.attn_k").reshape(T, H_kv, -1), theta)
        v = lin(h, f"blk.{i}.attn_v").reshape(T, H_kv, -1)
        x = x + lin(attend(q, k, v, H, H_kv), f"blk.{i}.attn_output")
        h = rms(x, t[f"blk.{i}.ffn_norm.weight"])
        x = x + lin(F.silu(lin(h, f"blk.{i}.ffn_gate")) * lin(h, f"blk.{i}.ffn_up"), f"blk.{i}.ffn_down")
    head = t["output.weight"] if "output.weight" in t else t["token_embd.weight"]
    return rms(x, t["output_norm.weight"]) @ head.T


def llama_cpp_gpt2(meta: dict, w: dict[str, np.ndarray], ids: list[int]) -> torch.Tensor:
    """GPT-2's graph as llama.cpp computes it (fused QKV split in thirds, tanh GELU); logits (T, V)."""
    t = {k: torch.tensor(v, dtype=torch.float64) for k, v in w.items()}
    H, eps = meta["gpt2.attention.head_count"], meta["gpt2.attention.layer_norm_epsilon"]

    def ln(x, name):
        return F.layer_norm(x, x.shape[-1:], t[f"{name}.weight"], t[f"{name}.bias"], eps)

    def lin(x, name):
        return x @ t[f"{name}.weight"].T + t[f"{name}.bias"]

    T = len(ids)
    x = t["token_embd.weight"][ids] + t["position_embd.weight"][:T]
    for i in range(meta["gpt2.block_count"]):
        q, k, v = lin(ln(x, f"blk.{i}.attn_norm"), f"blk.{i}.attn_qkv").reshape(T, 3, H, -1).unbind(1)
        x = x + lin(attend(q, k, v, H, H), f"blk.{i}.attn_output")
        x = x + lin(F.gelu(lin(ln(x, f"blk.{i}.ffn_norm"), f"blk.{i}.ffn_up"), approximate="tanh"), f"blk.{i}.ffn_down")
    head = t["output.weight"] if "output.weight" in t else t["token_embd.weight"]
    return ln(x, "output_norm") @ head.T


def tfkit_logits(model, ids=IDS) -> torch.Tensor:
    with torch.no_grad():
        return model(ids)[0].double()


LLAMA_CASES = {"gqa-tied": dict(LLAMA, n_kv_heads=2), "mqa-untied": dict(LLAMA, n_kv_heads=1, tie_embeddings=False),
               "mha-bias": dict(LLAMA, bias=True)}


@pytest.mark.parametrize("case", LLAMA_CASES)
def test_llama_layout_reads_back_and_computes_tfkit_logits_as_llama_cpp_would(case, bpe, tmp_path):
    model, folder = checkpoint(tmp_path / "ckpt", bpe, **LLAMA_CASES[case])
    cfg = model.config
    meta, w, types = read(export_gguf(folder, tmp_path / "m.gguf", dtype="f32"))
    assert meta["general.architecture"] == "llama"
    assert (meta["llama.block_count"], meta["llama.embedding_length"], meta["llama.context_length"]) == (L, D, T_MAX)
    assert (meta["llama.attention.head_count"], meta["llama.attention.head_count_kv"]) == (H, cfg.kv_heads)
    assert (meta["llama.feed_forward_length"], meta["llama.rope.dimension_count"]) == (cfg.ffn_dim, D // H)
    assert ("output.weight" in w) == (not cfg.tie_embeddings)
    assert ("blk.0.attn_q.bias" in w) == cfg.bias and ("blk.0.ffn_up.bias" in w) == cfg.bias
    assert w["blk.1.attn_k.weight"].shape == (cfg.kv_heads * D // H, D)
    assert set(types.values()) == {"F32"}
    state = model.state_dict()
    np.testing.assert_array_equal(w["token_embd.weight"], state["embed.tok.weight"].numpy())
    np.testing.assert_array_equal(w["blk.0.attn_k.weight"], permute(state["blocks.0.attn.k_proj.weight"], cfg.kv_heads).numpy())
    expected = tfkit_logits(model)
    torch.testing.assert_close(llama_cpp_llama(meta, w, IDS[0].tolist()), expected, atol=1e-5, rtol=1e-5)


def test_the_permutation_is_needed_for_llama_cpps_rope(bpe, tmp_path):
    """Without the converter's Q/K permutation, llama.cpp's adjacent-pair RoPE would compute another model:
    the reference above can tell them apart."""
    model, folder = checkpoint(tmp_path / "ckpt", bpe, **LLAMA)
    meta, w, _ = read(export_gguf(folder, tmp_path / "m.gguf", dtype="f32"))
    for i in range(L):
        for name in ("attn_q", "attn_k"):
            w[f"blk.{i}.{name}.weight"] = model.state_dict()[f"blocks.{i}.attn.{name[-1]}_proj.weight"].numpy()
    assert not torch.allclose(llama_cpp_llama(meta, w, IDS[0].tolist()), tfkit_logits(model), atol=1e-3)


@pytest.mark.parametrize("tied", [True, False])
def test_gpt2_layout_reads_back_and_computes_tfkit_logits_as_llama_cpp_would(tied, bpe, tmp_path):
    model, folder = checkpoint(tmp_path / "ckpt", bpe, **GPT2, tie_embeddings=tied)
    meta, w, types = read(export_gguf(folder, tmp_path / "m.gguf", dtype="f32"))
    assert meta["general.architecture"] == "gpt2"
    assert (meta["gpt2.block_count"], meta["gpt2.embedding_length"], meta["gpt2.attention.head_count"]) == (L, D, H)
    assert meta["gpt2.feed_forward_length"] == 4 * D and meta["gpt2.context_length"] == T_MAX
    assert w["blk.0.attn_qkv.weight"].shape == (3 * D, D) and w["position_embd.weight"].shape == (T_MAX, D)
    assert ("output.weight" in w) == (not tied)
    torch.testing.assert_close(llama_cpp_gpt2(meta, w, IDS[0].tolist()), tfkit_logits(model), atol=1e-5, rtol=1e-5)


def test_the_tokenizer_is_in_the_file_as_llama_cpps_gpt2_kind(bpe, tmp_path):
    _, folder = checkpoint(tmp_path / "ckpt", bpe, **LLAMA, vocab_size=V)
    meta, _, _ = read(export_gguf(folder, tmp_path / "m.gguf"))
    tok = load_tokenizer(folder)
    assert (meta["tokenizer.ggml.model"], meta["tokenizer.ggml.pre"]) == ("gpt2", "gpt-2")
    tokens, kinds = meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.token_type"]
    assert len(tokens) == len(kinds) == V  # the model's rows; those past the tokenizer are unused padding
    assert [tok.token_to_id(t) for t in tokens[:tok.vocab_size]] == list(range(tok.vocab_size))
    assert tokens[tok.vocab_size:] == [f"[PAD{i}]" for i in range(tok.vocab_size, V)]
    assert {kinds[i] for i in tok.special_ids} == {int(gguf.TokenType.CONTROL)}
    assert set(kinds[tok.vocab_size:]) == {int(gguf.TokenType.UNUSED)}
    merges = json.loads((folder / "tokenizer.json").read_text())["model"]["merges"]
    assert meta["tokenizer.ggml.merges"] == [" ".join(m) for m in merges]
    # a prompt is framed as tfkit frames it: after the token documents end with
    assert meta["tokenizer.ggml.add_bos_token"] is True
    assert meta["tokenizer.ggml.bos_token_id"] == tok.document_prefix()[0] == meta["tokenizer.ggml.eos_token_id"]


@pytest.mark.parametrize("dtype, stored, atol", [("f16", "F16", 1e-2), ("bf16", "BF16", 5e-2), ("q8_0", "Q8_0", 5e-2)])
def test_dtypes_store_the_matrices_and_keep_norms_and_positions_in_f32(dtype, stored, atol, bpe, tmp_path):
    model, folder = checkpoint(tmp_path / "ckpt", bpe, **GPT2)
    meta, w, types = read(export_gguf(folder, tmp_path / "m.gguf", dtype=dtype))
    assert types["blk.0.attn_qkv.weight"] == types["token_embd.weight"] == stored
    assert {types[n] for n in ("position_embd.weight", "output_norm.weight", "blk.0.attn_qkv.bias")} == {"F32"}
    file_type = {"f16": "MOSTLY_F16", "bf16": "MOSTLY_BF16", "q8_0": "MOSTLY_Q8_0"}[dtype]
    assert meta["general.file_type"] == int(gguf.LlamaFileType[file_type])
    torch.testing.assert_close(llama_cpp_gpt2(meta, w, IDS[0].tolist()), tfkit_logits(model), atol=atol, rtol=0)


REFUSED = {
    "alibi": (dict(arch="gpt", positions="alibi"), "model.positions=alibi: llama.cpp runs"),
    "sinusoidal": (dict(arch="gpt", positions="sinusoidal"), "model.positions=sinusoidal"),
    "post-norm": (dict(LLAMA, norm_placement="post"), "model.norm_placement=post: llama.cpp's Llama layout (rope positions) has pre-norm"),
    "batchnorm": (dict(GPT2, norm="batchnorm"), "model.norm=batchnorm: llama.cpp's GPT-2 layout (learned positions) has LayerNorm"),
    "gpt2-gqa": (dict(GPT2, n_kv_heads=2), "has multi-head attention only"),
    "bert": (dict(arch="bert", norm_placement="post"), "GGUF export covers the gpt family"),
}


@pytest.mark.parametrize("case", REFUSED)
def test_what_llama_cpp_cannot_run_is_refused_in_one_line_and_nothing_is_written(case, bpe, tmp_path):
    fields, message = REFUSED[case]
    _, folder = checkpoint(tmp_path / "ckpt", bpe, **fields)
    result = CliRunner().invoke(app, ["export-gguf", str(folder), "--out", str(tmp_path / "m.gguf")])
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert len(result.output.strip().splitlines()) == 1 and "Traceback" not in result.output
    assert not (tmp_path / "m.gguf").exists() and not (tmp_path / "m.README.md").exists()


def test_erf_gelu_exports_with_a_warning_that_llama_cpp_approximates_it():
    with pytest.warns(GGUFWarning, match="tanh approximation"):
        assert gguf_layout(ModelConfig(**BASE, **dict(GPT2, activation="gelu"))) == "gpt2"
    with pytest.raises(ConfigError, match="model.activation=relu"):
        gguf_layout(ModelConfig(**BASE, **dict(GPT2, activation="relu")))


def test_unknown_dtype_and_existing_outputs_are_refused_and_kept(bpe, tmp_path):
    _, folder = checkpoint(tmp_path / "ckpt", bpe, **LLAMA)
    out, runner = tmp_path / "m.gguf", CliRunner()
    bad = runner.invoke(app, ["export-gguf", str(folder), "--out", str(out), "--dtype", "q4_k"])
    assert bad.exit_code == 2 and "--dtype" in bad.output and len(bad.output.strip().splitlines()) == 1
    assert runner.invoke(app, ["export-gguf", str(folder), "--out", str(out)]).exit_code == 0
    before = out.read_bytes()
    again = runner.invoke(app, ["export-gguf", str(folder), "--out", str(out), "--dtype", "f32"])
    assert again.exit_code == 2 and "already exists; use --force" in again.output and out.read_bytes() == before
    assert runner.invoke(app, ["export-gguf", str(folder), "--out", str(out), "--dtype", "f32", "--force"]).exit_code == 0
    assert out.read_bytes() != before  # --force replaced the earlier export
    mine = tmp_path / "mine.gguf"
    mine.write_bytes(b"GGUF not tfkit's")
    kept = runner.invoke(app, ["export-gguf", str(folder), "--out", str(mine), "--force"])
    assert kept.exit_code == 2 and "not a GGUF file tfkit export-gguf wrote" in kept.output
    assert mine.read_bytes() == b"GGUF not tfkit's"
    inside = runner.invoke(app, ["export-gguf", str(folder), "--out", str(folder / "m.gguf")])
    assert inside.exit_code == 2 and "lies inside the input" in inside.output and not (folder / "m.gguf").exists()


def test_the_model_card_goes_beside_the_file_and_a_users_readme_is_kept(bpe, tmp_path):
    _, folder = checkpoint(tmp_path / "ckpt", bpe, **LLAMA)
    runner = CliRunner()
    assert runner.invoke(app, ["export-gguf", str(folder), "--out", str(tmp_path / "a" / "m.gguf")]).exit_code == 0
    card = (tmp_path / "a" / "m.README.md").read_text()  # one card per file: m.gguf -> m.README.md
    data = pytest.importorskip("huggingface_hub").ModelCard(card).data.to_dict()
    assert data["library_name"] == "gguf" and {"tfkit", "llama", "gguf"} <= set(data["tags"])
    assert "llama.cpp's `llama` architecture" in card and "llama-cli -m m.gguf" in card
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "m.README.md").write_text("my notes\n")
    result = runner.invoke(app, ["export-gguf", str(folder), "--out", str(tmp_path / "b" / "m.gguf")])
    assert result.exit_code == 0 and "tfkit did not write it" in result.output
    assert (tmp_path / "b" / "m.README.md").read_text() == "my notes\n" and (tmp_path / "b" / "m.gguf").is_file()


def test_without_the_gguf_package_the_line_names_the_extra(bpe, tmp_path, monkeypatch):
    _, folder = checkpoint(tmp_path / "ckpt", bpe, **LLAMA)
    monkeypatch.setitem(__import__("sys").modules, "gguf", None)  # `import gguf` raises ImportError
    result = CliRunner().invoke(app, ["export-gguf", str(folder), "--out", str(tmp_path / "m.gguf")])
    assert result.exit_code == 2 and 'pip install "tfkit[export]"' in result.output
    assert len(result.output.strip().splitlines()) == 1 and not (tmp_path / "m.gguf").exists()


def test_a_tokenizer_llama_cpp_would_split_differently_is_refused(tmp_path):
    folder = tmp_path / "wordpiece"
    train_tokenizer(TokenizerSpec(kind="wordpiece", vocab_size=120, min_frequency=1), TEXT, folder, show_progress=False)
    _, ckpt = checkpoint(tmp_path / "ckpt", folder, **LLAMA)
    result = CliRunner().invoke(app, ["export-gguf", str(ckpt), "--out", str(tmp_path / "m.gguf")])
    assert result.exit_code == 2 and "GGUF export writes byte-level BPE tokenizers" in result.output
    assert "WordPiece" in result.output and len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "m.gguf").exists()
