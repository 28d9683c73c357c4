"""Tokenizers through import-hf: a HF folder's tokenizer (tokenizer.json, or a slow tokenizer's vocab files)
ends up in the checkpoint in a form tfkit's `load_tokenizer` reads, with the same ids as transformers'
AutoTokenizer on the original folder and the same special-token roles."""

import json
import warnings
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from tfkit.checkpoints.hf_import import import_hf
from tfkit.checkpoints.hf_names import HFInteropWarning
from tfkit.tokenization.train import load_tokenizer

transformers = pytest.importorskip("transformers")

TEXT = ["The quick brown fox jumps over the lazy dog.", "A lazy dog sleeps; the fox runs away!"] * 20
PROBE = "The lazy fox sleeps [MASK] <|endoftext|> é!"


def byte_level_bpe() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(TEXT, trainers.BpeTrainer(vocab_size=290, special_tokens=["<|endoftext|>"],
                            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    return tok


def wordpiece() -> Tokenizer:
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.train_from_iterator(TEXT, trainers.WordPieceTrainer(
        vocab_size=120, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"], show_progress=False))
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
                                                       special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    tok.decoder = decoders.WordPiece()
    return tok


def hf_model_folder(folder: Path, family: str) -> Path:
    """A tiny randomly initialised model saved by transformers (the tokenizer is added by each test)."""
    if family == "bert":
        model = transformers.BertForMaskedLM(transformers.BertConfig(
            vocab_size=128, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64))
    else:
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
            vocab_size=300, n_embd=32, n_layer=1, n_head=2, bos_token_id=0, eos_token_id=0, activation_function="gelu"))
    model.save_pretrained(folder)
    return folder


def import_quietly(src: Path, out: Path) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import_hf(src, out)
    return [str(w.message) for w in caught if issubclass(w.category, HFInteropWarning)]


def test_a_tokenizer_saved_by_transformers_is_copied_and_loads(tmp_path):
    src = hf_model_folder(tmp_path / "hf", "bert")
    hf_tok = transformers.PreTrainedTokenizerFast(tokenizer_object=wordpiece(), unk_token="[UNK]", pad_token="[PAD]",
                                                  cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]")
    hf_tok.save_pretrained(src)
    import_quietly(src, tmp_path / "ckpt")
    ours = load_tokenizer(tmp_path / "ckpt")
    assert ours.encode(PROBE, add_special_tokens=True) == hf_tok(PROBE)["input_ids"]
    assert (ours.pad_id, ours.unk_id, ours.cls_id, ours.sep_id, ours.mask_id) == (0, 1, 2, 3, 4)
    assert ours.special_ids == [0, 1, 2, 3, 4]


def test_added_token_dicts_of_older_transformers_become_plain_roles(tmp_path):
    src = hf_model_folder(tmp_path / "hf", "gpt2")
    byte_level_bpe().save(str(src / "tokenizer.json"))
    added = {"__type": "AddedToken", "content": "<|endoftext|>", "lstrip": False, "rstrip": False}
    (src / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "GPT2Tokenizer", "bos_token": added, "eos_token": added, "unk_token": added}))
    import_quietly(src, tmp_path / "ckpt")
    ours = load_tokenizer(tmp_path / "ckpt")
    assert (ours.bos_id, ours.eos_id) == (0, 0)
    assert json.loads((tmp_path / "ckpt" / "tokenizer_config.json").read_text())["eos_token"] == "<|endoftext|>"


def test_gpt2_vocab_and_merges_are_converted_like_transformers_does(tmp_path):
    src = hf_model_folder(tmp_path / "hf", "gpt2")
    byte_level_bpe().model.save(str(src))  # vocab.json + merges.txt, as a slow GPT2Tokenizer saves them
    (src / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "GPT2Tokenizer"}))
    reference = transformers.AutoTokenizer.from_pretrained(src)
    import_quietly(src, tmp_path / "ckpt")
    ours = load_tokenizer(tmp_path / "ckpt")
    assert ours.encode(PROBE, add_special_tokens=True) == reference(PROBE)["input_ids"]
    assert ours.decode(ours.encode(PROBE), skip_special_tokens=False) == PROBE
    assert (ours.kind, ours.eos_id, ours.bos_id) == ("bpe", 0, 0)


def test_bert_vocab_txt_is_converted_like_transformers_does(tmp_path):
    src = hf_model_folder(tmp_path / "hf", "bert")
    wordpiece().model.save(str(src))  # vocab.txt
    (src / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "BertTokenizer", "do_lower_case": True}))
    reference = transformers.AutoTokenizer.from_pretrained(src)
    import_quietly(src, tmp_path / "ckpt")
    ours = load_tokenizer(tmp_path / "ckpt")
    text = "The LAZY fox sleeps [MASK] a dog, éh?"
    assert ours.encode(text, add_special_tokens=True) == reference(text)["input_ids"]
    assert (ours.kind, ours.mask_id, ours.cls_id, ours.sep_id) == ("wordpiece", 4, 2, 3)


def test_a_folder_without_a_readable_tokenizer_imports_with_a_warning(tmp_path):
    src = hf_model_folder(tmp_path / "hf", "gpt2")
    (src / "tokenizer.model").write_bytes(b"\x00sentencepiece")
    messages = import_quietly(src, tmp_path / "ckpt")
    assert any("sentencepiece" in m and "no tokenizer" in m for m in messages)
    assert not (tmp_path / "ckpt" / "tokenizer.json").exists()


def sentence_transformers_folder(folder: Path) -> Path:
    """A folder as sentence-transformers saves an encoder (all-MiniLM-L6-v2's layout): a bare `BertModel` (its
    pooler, no MLM head), its modules.json / 1_Pooling / sentence_bert_config.json beside it, and a
    tokenizer.json carrying `truncation: {max_length: 128}` and `padding: {Fixed: 128}`."""
    transformers.BertModel(transformers.BertConfig(
        vocab_size=128, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
    ).save_pretrained(folder)
    src = folder
    (src / "1_Pooling").mkdir()
    (src / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 32,
                                                               "pooling_mode_mean_tokens": True}))
    (src / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]))
    (src / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 128, "do_lower_case": False}))
    tok = wordpiece()
    tok.enable_truncation(max_length=128)
    tok.enable_padding(length=128, pad_id=0, pad_token="[PAD]")
    tok.save(str(src / "tokenizer.json"))
    (src / "tokenizer_config.json").write_text(json.dumps({"pad_token": "[PAD]", "unk_token": "[UNK]",
                                                           "cls_token": "[CLS]", "sep_token": "[SEP]"}))
    return src


def test_an_hf_tokenizers_truncation_and_padding_are_not_used(tmp_path):
    """Imported as they were, every document of a corpus was cut (or padded) to 128 tokens. The import says
    they are not used, and every load clears them, also of a folder imported before (the file as it was)."""
    src = sentence_transformers_folder(tmp_path / "hf")
    assert json.loads((src / "tokenizer.json").read_text())["truncation"]["max_length"] == 128
    messages = import_quietly(src, tmp_path / "ckpt")
    assert any("truncation" in m and "padding" in m and "not used" in m for m in messages), messages
    # the line names the user's file, not the copy in the staging folder that no longer exists
    assert any(m.startswith(f"{src / 'tokenizer.json'}: truncation") for m in messages), messages
    long_text = " ".join(TEXT)  # about 400 tokens
    for folder in (tmp_path / "ckpt", src):  # the import, and a folder with the settings still in its file
        ours = load_tokenizer(folder)
        ids = ours.encode(long_text)
        assert len(ids) > 300 and 0 not in ids, len(ids)  # not cut, and no [PAD]
        assert [len(x) for x in ours.encode_batch([long_text, "a dog"])] == [len(ids), len(ours.encode("a dog"))]


def test_a_sentence_transformers_folder_imports_as_an_encoder_with_its_pooler(tmp_path):
    """What a user downloads as a sentence-transformers model imports with exactly two warnings (the MLM
    head it never had, the tokenizer's length settings), keeps the file's pooler, ignores the
    sentence-transformers files, and computes BertModel's hidden states and pooled vector."""
    from tfkit.checkpoints.weights import load_model

    src = sentence_transformers_folder(tmp_path / "hf")
    messages = import_quietly(src, tmp_path / "ckpt")
    assert len(messages) == 2, messages
    assert "has no MLM head" in messages[0] and "not used" in messages[1], messages
    ours, _ = load_model(tmp_path / "ckpt")
    hf = transformers.BertModel.from_pretrained(src).eval()
    ids = torch.tensor([[2, 17, 40, 9, 3, 0]])  # (1, T) with a padding position
    mask = ids != 0  # (1, T)
    with torch.no_grad():
        expected = hf(input_ids=ids, attention_mask=mask.long())
        hidden = ours.eval().encode(ids, mask)  # (1, T, C)
        torch.testing.assert_close(hidden[mask], expected.last_hidden_state[mask], atol=1e-5, rtol=0)
        torch.testing.assert_close(ours.pooled(hidden), expected.pooler_output, atol=1e-5, rtol=0)
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == [
        "config.json", "model.safetensors", "special_tokens_map.json", "tokenizer.json", "tokenizer_config.json"]


def test_a_tokenizer_larger_than_the_models_vocabulary_is_refused_at_import(tmp_path):
    from tfkit.errors import ConfigError

    src = hf_model_folder(tmp_path / "hf", "bert")  # vocab_size 128
    byte_level_bpe().save(str(src / "tokenizer.json"))  # 290 tokens
    with pytest.raises(ConfigError, match=r"tokenizer has 290 tokens, more than the model's vocab_size 128"):
        import_quietly(src, tmp_path / "ckpt")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]
