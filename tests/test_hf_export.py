"""`export_hf`: every tfkit configuration with a HuggingFace equivalent loads with transformers' Auto
classes (no missing or unexpected weights) and computes the same logits; the tokenizer loads with
AutoTokenizer and its special tokens; configurations without an equivalent are refused by field."""

import json
import logging
import warnings
from pathlib import Path

import pytest
import torch

from tfkit.checkpoints.hf_export import export_hf
from tfkit.checkpoints.hf_state import tfkit_to_hf
from tfkit.checkpoints.hf_names import HFInteropWarning
from tfkit.checkpoints.weights import save_model
from tfkit.errors import CheckpointError, ConfigError
from tfkit.models import ModelConfig, build_model
from tfkit.tokenization.train import TokenizerSpec, load_tokenizer, train_tokenizer

transformers = pytest.importorskip("transformers")

V, D, L, H, T_MAX = 300, 64, 2, 4, 64
ATOL = 1e-5
BASE = dict(vocab_size=V, d_model=D, n_layers=L, n_heads=H, max_seq_len=T_MAX)
BERT = dict(arch="bert", norm_placement="post", norm_eps=1e-12)
GPT2 = dict(arch="gpt", positions="learned")
LLAMA = dict(arch="gpt", positions="rope", norm="rmsnorm", activation="swiglu", bias=False, norm_eps=1e-6)
TEXT = ["The quick brown fox jumps over the lazy dog.", "A lazy dog sleeps; the fox runs away!"] * 20
IDS = torch.randint(5, V, (2, 16), generator=torch.Generator().manual_seed(1))


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory):
    """A byte-level BPE (GPT-2 / Llama checkpoints) and a WordPiece (BERT) tokenizer, trained once."""
    out = {}
    for kind, size in (("bpe", 300), ("wordpiece", 120)):
        folder = tmp_path_factory.mktemp(kind)
        train_tokenizer(TokenizerSpec(kind=kind, vocab_size=size, min_frequency=1), TEXT, folder, show_progress=False)
        out[kind] = folder
    return out


def checkpoint(folder: Path, tokenizer: Path | None = None, seed: int = 0, **fields) -> tuple[torch.nn.Module, Path]:
    """A tfkit checkpoint whose every parameter is moved off its init (norm weights too)."""
    torch.manual_seed(seed)
    model = build_model(ModelConfig(**{**BASE, **fields})).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.add_(0.1 * torch.randn_like(p))
    save_model(model, folder)
    if tokenizer is not None:
        load_tokenizer(tokenizer).save(folder)
    return model, folder


def load_hf(folder: Path, arch: str):
    """from_pretrained with loading info, failing on any warning transformers logs while loading."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append
    logger = logging.getLogger("transformers")
    logger.addHandler(handler)
    try:
        auto = transformers.AutoModelForMaskedLM if arch == "bert" else transformers.AutoModelForCausalLM
        model, info = auto.from_pretrained(folder, output_loading_info=True)
    finally:
        logger.removeHandler(handler)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs")), info
    assert not [r.getMessage() for r in records]  # e.g. the LOAD REPORT, or a tie it could not make
    return model.eval()


CONFIGS = {
    "bert": BERT,
    "bert-relu-untied": {**BERT, "activation": "relu", "tie_embeddings": False},
    "bert-no-segments": {**BERT, "type_vocab_size": 0},
    "gpt2": GPT2,
    "gpt2-untied-relu-dff": {**GPT2, "tie_embeddings": False, "activation": "relu", "d_ff": 96},
    "llama-mha": LLAMA,
    "llama-gqa": {**LLAMA, "n_kv_heads": 2},
    "llama-mqa-tied": {**LLAMA, "n_kv_heads": 1, "tie_embeddings": True, "rope_theta": 500.0},
    "llama-gqa-bias": {**LLAMA, "n_kv_heads": 2, "bias": True, "tie_embeddings": False},
    "llama-rope-linear": {**LLAMA, "rope_scaling": "linear", "rope_factor": 4.0},
    "llama-rope-yarn": {**LLAMA, "rope_scaling": "yarn", "rope_factor": 4.0, "n_kv_heads": 2},
    "qwen3-gqa": {**LLAMA, "qk_norm": True, "n_kv_heads": 2},
    "qwen3-mqa-tied": {**LLAMA, "qk_norm": True, "n_kv_heads": 1, "tie_embeddings": True},
    "mistral-window": {**LLAMA, "window": 5, "n_kv_heads": 2},
}


@pytest.mark.parametrize("name", CONFIGS)
def test_export_loads_without_missing_weights_and_logits_match(tmp_path, name):
    ours, ckpt = checkpoint(tmp_path / "ckpt", **CONFIGS[name])
    with pytest.warns(HFInteropWarning, match="no tokenizer"):
        export_hf(ckpt, tmp_path / "hf")
    hf = load_hf(tmp_path / "hf", ours.config.arch)
    mask = torch.ones(2, 16, dtype=torch.bool)
    mask[1, 12:] = False
    kwargs = {"attention_mask": mask.long()}
    if ours.config.arch == "bert" and ours.config.type_vocab_size:
        kwargs["token_type_ids"] = torch.tensor([[0] * 8 + [1] * 8] * 2)
    with torch.no_grad():
        expected = hf(IDS, **kwargs).logits
        got = ours(IDS, attention_mask=mask, **({"token_type_ids": kwargs["token_type_ids"]}
                                                if "token_type_ids" in kwargs else {}))
    assert expected.std() > 0.5  # logits are O(1): the tolerance is tight
    torch.testing.assert_close(got[mask], expected[mask], atol=ATOL, rtol=0)  # padding rows are unused


@pytest.mark.parametrize("kind, fields", [("bpe", GPT2), ("bpe", {**LLAMA, "n_kv_heads": 2}), ("wordpiece", BERT)])
def test_autotokenizer_loads_the_same_ids_and_special_tokens(tmp_path, tokenizers, kind, fields):
    ours, ckpt = checkpoint(tmp_path / "ckpt", tokenizers[kind], **fields)
    with warnings.catch_warnings():
        warnings.simplefilter("error", HFInteropWarning)  # with a tokenizer nothing is approximated
        export_hf(ckpt, tmp_path / "hf")
    tok, hf_tok = load_tokenizer(ckpt), transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    text = "The lazy fox sleeps."
    encoded = hf_tok(text)
    if kind == "wordpiece":
        assert encoded["input_ids"] == tok.encode(text, add_special_tokens=True)
    else:  # a decoder's prompt framed as tfkit's training documents were, and as `tfkit generate` feeds it
        assert encoded["input_ids"] == tok.document_prefix() + tok.encode(text)
    for role, token in tok.roles.items():
        assert getattr(hf_tok, role) == token
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    if kind == "bpe":  # causal LMs: no token_type_ids, which GPT-2 would add through its embeddings
        assert "token_type_ids" not in encoded
        assert config["bos_token_id"] == config["eos_token_id"] == tok.eos_id
    else:
        assert hf_tok.mask_token_id == tok.mask_id and hf_tok.pad_token_id == tok.pad_id == config["pad_token_id"]
    hf = load_hf(tmp_path / "hf", fields["arch"])
    with torch.no_grad():
        batch = hf_tok([text, "A dog runs away from the quick brown fox!"], return_tensors="pt", padding=True)
        mask = batch["attention_mask"].bool()
        got = ours(batch["input_ids"], attention_mask=mask, **({"token_type_ids": batch["token_type_ids"]}
                                                                if kind == "wordpiece" else {}))
        torch.testing.assert_close(got[mask], hf(**batch).logits[mask], atol=ATOL, rtol=0)


@pytest.mark.parametrize("fields, named", [
    ({"arch": "gpt", "positions": "alibi"}, "model.positions=alibi has no HuggingFace equivalent for gpt"),
    ({"arch": "gpt", "positions": "sinusoidal"}, "model.positions=sinusoidal has no HuggingFace equivalent for gpt"),
    ({"arch": "transformer"}, "model.arch=transformer has no HuggingFace equivalent"),
    ({**GPT2, "n_kv_heads": 2}, "model.n_kv_heads=2 has no HuggingFace equivalent for gpt with learned positions"),
    ({**GPT2, "norm": "rmsnorm"}, "model.norm=rmsnorm has no HuggingFace equivalent for gpt with learned positions"),
    ({**GPT2, "bias": False}, "model.bias=False"),
    ({**LLAMA, "norm": "layernorm"}, "model.norm=layernorm has no HuggingFace equivalent for gpt with rope"),
    ({**LLAMA, "activation": "gelu"}, "model.activation=gelu"),
    ({**BERT, "norm_placement": "pre"}, "model.norm_placement=pre has no HuggingFace equivalent for bert"),
    ({**BERT, "positions": "rope"}, "model.positions=rope"),
    ({**BERT, "n_kv_heads": 1}, "model.n_kv_heads=1"),
    ({**BERT, "scale_embeddings": True}, "model.scale_embeddings=True"),
])
def test_configurations_without_an_equivalent_are_refused_by_field(tmp_path, fields, named):
    cfg = ModelConfig(**{**BASE, **fields})
    with pytest.raises(ConfigError, match="has no HuggingFace equivalent") as err:
        tfkit_to_hf(cfg, {})
    assert named in str(err.value)
    _, ckpt = checkpoint(tmp_path / "ckpt", **fields)
    with pytest.raises(ConfigError):
        export_hf(ckpt, tmp_path / "hf")
    assert not (tmp_path / "hf").exists() and [p.name for p in tmp_path.iterdir()] == ["ckpt"]


def test_every_field_without_an_equivalent_is_named_at_once():
    cfg = ModelConfig(**{**BASE, **GPT2, "norm": "rmsnorm", "activation": "swiglu", "n_kv_heads": 1})
    with pytest.raises(ConfigError) as err:
        tfkit_to_hf(cfg, {})
    assert all(f"model.{f}=" in str(err.value) for f in ("norm", "activation", "n_kv_heads"))


def test_export_never_overwrites_without_force(tmp_path):
    _, ckpt = checkpoint(tmp_path / "ckpt", **GPT2)
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "keep.txt").write_text("mine")
    with pytest.raises(CheckpointError, match="already exists; use --force"):
        export_hf(ckpt, tmp_path / "hf")
    with pytest.raises(CheckpointError, match="is not a model folder"):  # --force replaces earlier outputs only
        export_hf(ckpt, tmp_path / "hf", force=True)
    assert (tmp_path / "hf" / "keep.txt").read_text() == "mine"
    with pytest.warns(HFInteropWarning):
        export_hf(ckpt, tmp_path / "earlier")
    with pytest.warns(HFInteropWarning):
        export_hf(ckpt, tmp_path / "earlier", force=True)
    assert sorted(p.name for p in (tmp_path / "earlier").iterdir()) == ["config.json", "model.safetensors"]
    for target in (ckpt, tmp_path):  # even --force never deletes the input
        with pytest.raises(CheckpointError, match="is or contains the input"):
            export_hf(ckpt, target, force=True)
    assert (ckpt / "model.safetensors").is_file()


def test_hf_generate_on_the_export_continues_as_tfkit_generate(tmp_path, tokenizers):
    """The export carries tfkit's prompt framing, so greedy decoding agrees token for token."""
    from tfkit.models.generation import generate

    ours, ckpt = checkpoint(tmp_path / "ckpt", tokenizers["bpe"], **GPT2)
    export_hf(ckpt, tmp_path / "hf")
    tok, hf_tok = load_tokenizer(ckpt), transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    hf = load_hf(tmp_path / "hf", "gpt")
    prompt = "The lazy fox"
    batch = hf_tok(prompt, return_tensors="pt")
    with torch.no_grad():
        hf_ids = hf.generate(**batch, max_new_tokens=12, do_sample=False, pad_token_id=tok.pad_id)[0].tolist()
    new = hf_ids[batch["input_ids"].shape[1]:]
    new = new[: new.index(tok.eos_id)] if tok.eos_id in new else new  # tfkit leaves the end-of-text token out
    ours_ids = generate(ours.eval(), [tok.document_prefix() + tok.encode(prompt)], 12, temperature=0,
                        eos_id=tok.eos_id)[0]
    assert ours_ids == new and len(new) > 0
