"""A HuggingFace tokenizer as a tfkit tokenizer folder (`tfkit import-hf` copies it beside the weights).

A fast tokenizer's tokenizer.json is copied as it is, with the special-token roles tfkit reads; a slow
tokenizer's vocabulary files (BERT's vocab.txt, GPT-2's vocab.json + merges.txt) are assembled into the
same pipeline transformers' converters build. A SentencePiece tokenizer.model alone cannot be read
without sentencepiece: the import warns and goes on without a tokenizer.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

from ..errors import DataError
from ..jsonfile import read_json as read_guarded
from ..tokenization.train import TfkitTokenizer, load_tokenizer, write_tokenizer_files
from .hf_names import HFInteropWarning, read_json


def _plain(config: dict) -> dict:
    """Special-token values as plain strings: older transformers save them as AddedToken dicts."""
    def text(v):
        return v.get("content", v) if isinstance(v, dict) else v

    out = {}
    for key, value in config.items():
        if key.endswith("_token"):
            value = text(value)
        elif key == "additional_special_tokens" and isinstance(value, list):
            value = [text(v) for v in value]
        out[key] = value
    return out


def _slow_tokenizer(src: Path, config: dict):
    """(kind, Tokenizer, roles) built from a slow tokenizer's files, as transformers' converters do, or None."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    if (src / "vocab.txt").is_file():  # BERT WordPiece
        defaults = {"unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]", "cls_token": "[CLS]",
                    "mask_token": "[MASK]"}
        roles = {k: config.get(k, v) for k, v in defaults.items()}
        tok = Tokenizer(models.WordPiece.from_file(str(src / "vocab.txt"), unk_token=roles["unk_token"]))
        tok.normalizer = normalizers.BertNormalizer(
            clean_text=True, handle_chinese_chars=config.get("tokenize_chinese_chars", True),
            strip_accents=config.get("strip_accents"), lowercase=config.get("do_lower_case", True))
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        cls, sep = roles["cls_token"], roles["sep_token"]
        tok.post_processor = processors.TemplateProcessing(
            single=f"{cls} $A {sep}", pair=f"{cls} $A {sep} $B:1 {sep}:1",
            special_tokens=[(cls, tok.token_to_id(cls) or 0), (sep, tok.token_to_id(sep) or 0)])
        tok.decoder = decoders.WordPiece(prefix="##")
        kind = "wordpiece"
    elif (src / "vocab.json").is_file() and (src / "merges.txt").is_file():  # GPT-2 byte-level BPE
        eot = "<|endoftext|>"
        roles = {k: config.get(k, eot) for k in ("bos_token", "eos_token", "unk_token")}
        tok = Tokenizer(models.BPE.from_file(str(src / "vocab.json"), str(src / "merges.txt")))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=config.get("add_prefix_space", False))
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
        tok.decoder = decoders.ByteLevel()
        kind = "bpe"
    else:
        return None
    roles = {k: v for k, v in roles.items() if isinstance(v, str) and tok.token_to_id(v) is not None}
    tok.add_special_tokens(sorted(set(roles.values())))
    return kind, tok, roles


def import_tokenizer(src: Path, dst: Path) -> TfkitTokenizer | None:
    """Copy the HF tokenizer files into `dst` (building tokenizer.json from vocab files when it is absent)
    and return them as tfkit's `load_tokenizer` reads them; None, with a warning, when there is nothing
    tfkit can read. A truncation or padding the HF tokenizer carries is reported: tfkit clears it when
    it loads the tokenizer (tokenization/tokenizer.py)."""
    config = _plain(read_json(src / "tokenizer_config.json")) if (src / "tokenizer_config.json").is_file() else {}
    if (src / "tokenizer.json").is_file():
        (dst / "tokenizer.json").write_bytes((src / "tokenizer.json").read_bytes())  # a full disk names `dst`
        specials_file = src / "special_tokens_map.json"
        specials = _plain(read_json(specials_file)) if specials_file.is_file() else {
            k: v for k, v in config.items() if k.endswith("_token") or k == "additional_special_tokens"}
        config = {**specials, **config}  # tokenizer_config.json has the roles tfkit reads
        (dst / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
        (dst / "special_tokens_map.json").write_text(json.dumps(specials, indent=2, ensure_ascii=False) + "\n")
        _note_length_settings(src / "tokenizer.json")  # the user's file, not the staging folder's copy
    elif (built := _slow_tokenizer(src, config)) is not None:
        kind, tok, roles = built
        write_tokenizer_files(tok, dst, kind, roles, (), None)
    else:
        what = "a sentencepiece tokenizer.model (save it with transformers to get tokenizer.json)" \
            if (src / "tokenizer.model").is_file() else "no tokenizer files"
        warnings.warn(f"{src}: {what}; the checkpoint has no tokenizer", HFInteropWarning, stacklevel=3)
        return None
    return load_tokenizer(dst)


def _note_length_settings(file: Path) -> None:
    """Warn that a tokenizer.json's truncation / padding (a sentence-transformers model's 128 tokens) is not
    used: tfkit packs whole documents, so keeping it would cut every document of a corpus. Only a file copied
    from the HF folder can carry them (one built from vocab files has neither), and the warning names that
    file: the copy is in a staging folder that is renamed away before the user reads the line."""
    data = read_guarded(file, DataError, max_depth=None)
    found = [f"{key} {json.dumps(data[key])}" for key in ("truncation", "padding") if data.get(key) is not None]
    if found:
        warnings.warn(f"{file}: {' and '.join(found)} not used: tfkit tokenizes whole documents and frames them "
                      "itself (cleared whenever tfkit loads this tokenizer)", HFInteropWarning, stacklevel=3)
