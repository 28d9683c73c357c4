"""Export a tfkit checkpoint as a HuggingFace folder (`tfkit export-hf`).

A tfkit config is exported only when transformers has a class that computes the *same function*:
- bert arch (learned positions, post-LN LayerNorm, gelu/relu, biases, MHA) -> `BertForMaskedLM`;
- gpt arch with learned positions (pre-LN LayerNorm, gelu/relu, biases, MHA) -> `GPT2LMHeadModel`
  (`activation_function`: gelu, or gelu_new for tfkit's gelu_tanh, GPT-2's own approximation);
- gpt arch with RoPE (pre-LN RMSNorm, SwiGLU, any n_kv_heads, biases or none) -> `LlamaForCausalLM`;
  the same with `qk_norm` and no biases -> `Qwen3ForCausalLM` (per-head RMSNorm on q and k before RoPE);
  the same with a `window` on every layer and no biases -> `MistralForCausalLM` (its `sliding_window`).
A classifier made by `tfkit finetune` is exported as the family's `*ForSequenceClassification` instead
(hf_classifier.py). Anything else is a ConfigError naming each field that has no equivalent, never a
silently different model.
The folder loads with `AutoModelForMaskedLM` / `AutoModelForCausalLM.from_pretrained` with no missing or
unexpected weights, and with `AutoTokenizer` when the checkpoint has a tokenizer. transformers itself is
never imported: the config is written as the dict its `config.json` holds.

BERT's pooler is not exported with the language model: `BertForMaskedLM` has none, and transformers would
report it as an unexpected weight (tfkit's MLM pretraining does not train it either); a classifier's is.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

from safetensors.torch import save_file
from tokenizers import Tokenizer, processors

from ..errors import ConfigError
from ..files import staged_folder
from ..layout import MODEL_CARD
from ..models.config import ModelConfig
from ..replacing import TFKIT_EXPORT, check_new_folder
from ..tokenization.train import load_tokenizer
from .folders import resolve_checkpoint
from .hf_classifier import classifier_to_hf
from .hf_names import HFInteropWarning, read_json
from .hf_state import export_family, tfkit_to_hf
from .record import CheckpointRecord
from .weights import load_classifier, load_model, safetensors_writes

def _export_tokenizer(ckpt: Path, dst: Path, family: str, cfg: ModelConfig) -> dict[str, int | None]:
    """Copy the tokenizer with a tokenizer_config.json AutoTokenizer reads (special tokens, max length,
    model inputs); returns the special token ids for the model's config.json."""
    tok = load_tokenizer(ckpt)
    if tok.vocab_size > cfg.vocab_size:
        raise ConfigError(f"the checkpoint's tokenizer has {tok.vocab_size} tokens but model.vocab_size is "
                          f"{cfg.vocab_size}; the exported model could not embed every id")
    (dst / "tokenizer.json").write_text(_framing_tokenizer(ckpt, tok, family), encoding="utf-8")
    config = read_json(ckpt / "tokenizer_config.json") if (ckpt / "tokenizer_config.json").is_file() else {}
    config.setdefault("tokenizer_class", "PreTrainedTokenizerFast")
    config.update(tok.roles, model_max_length=cfg.max_seq_len)
    # BERT takes segments; GPT-2 would add token_type_ids through its word embeddings and Llama rejects them.
    segments = ["token_type_ids"] if family == "bert" else []
    config["model_input_names"] = ["input_ids", *segments, "attention_mask"]
    specials = {**tok.roles, "additional_special_tokens": tok.extra_specials}
    (dst / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    (dst / "special_tokens_map.json").write_text(json.dumps(specials, indent=2, ensure_ascii=False) + "\n")
    return {"bos_token_id": tok.bos_id, "eos_token_id": tok.eos_id, "pad_token_id": tok.pad_id}


def _framing_tokenizer(ckpt: Path, tok, family: str) -> str:
    """The checkpoint's tokenizer.json, with the document framing tfkit's decoders were trained with made
    the post-processor's: tfkit packs `doc EOS doc EOS ...`, so a decoder's prompt starts after an EOS
    (`tfkit generate` feeds `<|endoftext|> To be`). HuggingFace adds nothing to `tokenizer("To be")`, and
    greedy continuations differed until the user found the convention; now `tokenizer(text)` gives the ids
    tfkit feeds. Tokenizers that begin documents with their own BOS (Llama's `<s>`) already do."""
    text = (ckpt / "tokenizer.json").read_text(encoding="utf-8")
    prefix = tok.document_prefix()
    if family == "bert" or not prefix or tok.doc_start_id is not None:
        return text
    tokenizer = Tokenizer.from_str(text)
    name = tok.id_to_token(prefix[0])
    frame = processors.TemplateProcessing(single=f"{name} $A", pair=f"{name} $A {name} $B:1",
                                          special_tokens=[(name, prefix[0])])
    current = tokenizer.post_processor
    tokenizer.post_processor = frame if current is None else processors.Sequence([current, frame])
    return tokenizer.to_str(pretty=True)


def export_hf(ckpt: str | Path, out_dir: str | Path, *, force: bool = False, card: str | None = None) -> Path:
    """Write the HF folder (config.json, model.safetensors, tokenizer files, and `card` as README.md when
    given: `model_card.py`) of a tfkit checkpoint or run folder into `out_dir`; returns `out_dir`.
    A classifier made by `tfkit finetune` is exported as its family's `*ForSequenceClassification`
    (hf_classifier.py).
    An existing non-empty `out_dir` needs force=True."""
    folder, out = resolve_checkpoint(ckpt), Path(out_dir)
    check_new_folder(out, [folder], force, replaces=(TFKIT_EXPORT,))
    head = CheckpointRecord.read(folder).head
    model, cfg = load_classifier(folder) if head is not None else load_model(folder)
    family = export_family(cfg)  # a config without an HF equivalent fails before anything is written
    tokenizer = load_tokenizer(folder) if (folder / "tokenizer.json").is_file() else None
    if head is not None:  # a fine-tuned classifier: its rows were padded with the tokenizer's pad id
        pad_id, row_end = (tokenizer.pad_id, tokenizer.separator_id) if tokenizer else (cfg.pad_token_id, None)
        hf_config, hf_state = classifier_to_hf(family, cfg, model.head_config, model.state_dict(), pad_id, row_end)
    else:
        hf_config, hf_state = tfkit_to_hf(cfg, model.state_dict())
    with staged_folder(out) as tmp:  # check_new_folder decided whether an existing `out` may be replaced
        if tokenizer is not None:
            ids = _export_tokenizer(folder, tmp, family, cfg)
            hf_config.update({k: v for k, v in ids.items() if k in hf_config and hf_config[k] is None})
        else:
            warnings.warn(f"{folder} has no tokenizer: the export has none either", HFInteropWarning, stacklevel=2)
        with safetensors_writes(out / "model.safetensors"):
            save_file(hf_state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(hf_config, indent=2) + "\n")
        if card is not None:
            (tmp / MODEL_CARD).write_text(card, encoding="utf-8")
    return out
