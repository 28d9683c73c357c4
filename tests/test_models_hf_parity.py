"""Logits parity with the HuggingFace implementations (litgpt style): copy the weights of a randomly
initialised `transformers` GPT-2 / BERT into tfkit's model and compare the outputs. An independent
reference for the whole forward: embeddings, pre/post-LN placement, attention, MLP, tied heads."""

import pytest
import torch

from tfkit.models import ModelConfig, build_model

transformers = pytest.importorskip("transformers")

V, D, L, H, T_MAX = 61, 32, 2, 4, 32


def gpt2_state_dict(hf: dict) -> dict:
    """HF GPT-2 (Conv1D weights stored (in, out), fused c_attn) -> tfkit names and (out, in) layout."""
    out = {"embed.tok.weight": hf["transformer.wte.weight"], "embed.pos.weight": hf["transformer.wpe.weight"],
           "ln_f.weight": hf["transformer.ln_f.weight"], "ln_f.bias": hf["transformer.ln_f.bias"],
           "lm_head.weight": hf["lm_head.weight"]}
    for i in range(L):
        src, dst = f"transformer.h.{i}.", f"blocks.{i}."
        for name, weight in zip("qkv", hf[src + "attn.c_attn.weight"].t().chunk(3)):
            out[dst + f"attn.{name}_proj.weight"] = weight
        for name, bias in zip("qkv", hf[src + "attn.c_attn.bias"].chunk(3)):
            out[dst + f"attn.{name}_proj.bias"] = bias
        pairs = {"attn.c_proj": "attn.o_proj", "mlp.c_fc": "ffn.up", "mlp.c_proj": "ffn.down"}
        for a, b in pairs.items():
            out[dst + b + ".weight"] = hf[src + a + ".weight"].t()
            out[dst + b + ".bias"] = hf[src + a + ".bias"]
        for a, b in {"ln_1": "norm_attn", "ln_2": "norm_ffn"}.items():
            out[dst + b + ".weight"], out[dst + b + ".bias"] = hf[src + a + ".weight"], hf[src + a + ".bias"]
    return out


def bert_state_dict(hf: dict) -> dict:
    names = {"bert.embeddings.word_embeddings": "embed.tok", "bert.embeddings.position_embeddings": "embed.pos",
             "bert.embeddings.token_type_embeddings": "embed.seg", "bert.embeddings.LayerNorm": "embed.norm",
             "cls.predictions.transform.dense": "mlm.dense", "cls.predictions.transform.LayerNorm": "mlm.norm",
             "cls.predictions.decoder": "mlm.decoder"}
    for i in range(L):
        src, dst = f"bert.encoder.layer.{i}.", f"blocks.{i}."
        names.update({src + "attention.self.query": dst + "attn.q_proj",
                      src + "attention.self.key": dst + "attn.k_proj",
                      src + "attention.self.value": dst + "attn.v_proj",
                      src + "attention.output.dense": dst + "attn.o_proj",
                      src + "attention.output.LayerNorm": dst + "norm_attn",
                      src + "intermediate.dense": dst + "ffn.up", src + "output.dense": dst + "ffn.down",
                      src + "output.LayerNorm": dst + "norm_ffn"})
    out = {}
    for key, value in hf.items():
        module, _, param = key.rpartition(".")
        if module in names:
            out[f"{names[module]}.{param}"] = value
    return out


@pytest.mark.parametrize("attention", ["flash", "naive"])
def test_gpt_matches_huggingface_gpt2(attention):
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=V, n_positions=T_MAX, n_embd=D, n_layer=L, n_head=H, activation_function="gelu",
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)).eval()
    ours = build_model(ModelConfig(arch="gpt", vocab_size=V, d_model=D, n_layers=L, n_heads=H, max_seq_len=T_MAX,
                                   activation="gelu", attention=attention)).eval()
    ours.load_state_dict(gpt2_state_dict(hf.state_dict()), strict=True)
    ids = torch.randint(0, V, (2, 12))
    torch.testing.assert_close(ours(ids), hf(ids).logits, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("attention", ["flash", "naive"])
def test_bert_matches_huggingface_bert_for_masked_lm(attention):
    hf = transformers.BertForMaskedLM(transformers.BertConfig(
        vocab_size=V, hidden_size=D, num_hidden_layers=L, num_attention_heads=H, intermediate_size=4 * D,
        max_position_embeddings=T_MAX, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)).eval()
    ours = build_model(ModelConfig(arch="bert", vocab_size=V, d_model=D, n_layers=L, n_heads=H, max_seq_len=T_MAX,
                                   norm_placement="post", norm_eps=1e-12, attention=attention)).eval()
    missing, unexpected = ours.load_state_dict(bert_state_dict(hf.state_dict()), strict=False)
    assert sorted(missing) == ["pooler.bias", "pooler.weight"] and not unexpected  # BertForMaskedLM has none
    ids = torch.randint(0, V, (2, 10))
    segments = torch.tensor([[0] * 5 + [1] * 5] * 2)
    mask = torch.ones(2, 10, dtype=torch.bool)
    mask[1, 7:] = False
    expected = hf(input_ids=ids, attention_mask=mask.long(), token_type_ids=segments).logits
    got = ours(ids, attention_mask=mask, token_type_ids=segments)
    torch.testing.assert_close(got[mask], expected[mask], atol=1e-5, rtol=1e-4)  # padding rows are unused
