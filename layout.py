"""The names of the files and folders tfkit writes, in one place for every layer that reads them.

A checkpoint folder holds the weights and config.json (+ the tokenizer files, + trainer_state.pt when a
training run wrote it). A run folder holds recipe.yaml, start.log, tokenizer/, metrics.jsonl and
checkpoints/step-<N>/. Output-folder checks (files.py) must recognise both without importing the trainer,
and an export-hf folder without importing the models.
"""

from __future__ import annotations

import re

WEIGHTS = "model.safetensors"
CONFIG = "config.json"
TRAINER_STATE = "trainer_state.pt"
# a checkpoint of several processes: torch.distributed.checkpoint's files (each rank's `__R_N.distcp`, then the
# `.metadata` rank 0 writes once every rank's are on disk) in place of model.safetensors (checkpoints/sharded.py)
SHARDS = "shards"
SHARDS_METADATA = ".metadata"
MODEL_CARD = "README.md"  # in an exported model: its HuggingFace-style model card (checkpoints/model_card.py)
CARD_MARK = "<!-- model card written by tfkit -->"  # its last line: a README.md the next export may replace
GGUF_CARD_SUFFIX = ".README.md"  # an export-gguf file's card beside it: a.gguf -> a.README.md (one per file)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
RECIPE_FILE = "recipe.yaml"
BEST = "best"  # in a run folder: the weights with the best validation loss (train.keep_best)
START_LOG = "start.log"  # in a run folder: the start-of-run block of every start (fresh, then each resume)
CHECKPOINTS = "checkpoints"
STEP_FOLDER = re.compile(r"^step-(\d+)$")  # excludes temp folders such as ".step-5.tmp"
# The HuggingFace class each family is exported as (checkpoints/hf_names.py), named in an export's config.json.
EXPORT_ARCHITECTURES = {"bert": "BertForMaskedLM", "gpt2": "GPT2LMHeadModel", "llama": "LlamaForCausalLM",
                        "qwen3": "Qwen3ForCausalLM", "mistral": "MistralForCausalLM"}
# ... and a classifier made by `tfkit finetune` (checkpoints/hf_classifier.py).
CLASSIFIER_EXPORT_ARCHITECTURES = {"bert": "BertForSequenceClassification", "gpt2": "GPT2ForSequenceClassification",
                                   "llama": "LlamaForSequenceClassification",
                                   "qwen3": "Qwen3ForSequenceClassification",
                                   "mistral": "MistralForSequenceClassification"}


def gguf_card_name(gguf_name: str) -> str:
    """The name of the model card beside a GGUF file: `a.gguf` -> `a.README.md` (several files, several cards)."""
    return gguf_name.removesuffix(".gguf") + GGUF_CARD_SUFFIX
