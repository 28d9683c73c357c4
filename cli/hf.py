"""`tfkit import-hf` and `tfkit export-hf`: move models between tfkit and HuggingFace transformers folders.

Thin on purpose: the conversion lives in `tfkit.checkpoints.hf_import` / `hf_export` (one call from Python).
Conversions that are not a pure copy (an initialised head, an approximated activation) are reported as
one yellow `warning:` line each on stderr, as is the command that continues pretraining an imported model;
stdout carries only the output folder, so the commands pipe.
"""

from __future__ import annotations

import shlex
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from ..jsonfile import read_json

if TYPE_CHECKING:
    from ..models.config import ModelConfig

err = Console(stderr=True, highlight=False, soft_wrap=True)

Force = Annotated[bool, typer.Option("--force", help="Replace an earlier output of this command (nothing else).")]
PRETRAIN_RECIPE = {"gpt": "gpt-tiny", "bert": "bert-tiny"}  # the recipe the follow-up command continues with

License = Annotated[str | None, typer.Option(
    "--license", help="License id for the model card (mit, apache-2.0, ...); the card names none without it.")]


class GGUFDtype(str, Enum):
    """`--dtype` of export-gguf: checkpoints.gguf_export.DTYPES, named here so the help needs no import of it."""
    f32 = "f32"
    f16 = "f16"
    bf16 = "bf16"
    q8_0 = "q8_0"


def import_hf(
    src: Annotated[Path, typer.Argument(help="HuggingFace model folder (config.json + weights + tokenizer files).")],
    out: Annotated[Path, typer.Option("--out", "-o", help="tfkit checkpoint folder to write.")],
    force: Force = False,
) -> None:
    """Import a HuggingFace BERT, GPT-2 or Llama folder as a tfkit checkpoint.

    Supported: BertModel / BertForMaskedLM / BertForPreTraining, GPT2Model / GPT2LMHeadModel,
    LlamaModel / LlamaForCausalLM (MHA, GQA, MQA) and Mistral without a sliding window, and the
    *ForSequenceClassification of each as a classifier `tfkit predict` and `tfkit eval --data` take. A bare model's
    missing head is initialised, with a warning. Options tfkit cannot reproduce (rope scaling, relative
    positions, ...) are refused by name.
    """
    from ..checkpoints.hf_import import import_hf as convert
    from ..checkpoints.record import CheckpointRecord

    path = convert(src, out, force=force)  # its warnings: one line each, by cli.main's showwarning
    record = CheckpointRecord.read(path)
    model = record.model
    err.print(f"imported {record.hf_architecture} as {model.arch} "
              f"({model.n_layers} layers, d_model {model.d_model}, {model.positions} positions)")
    if record.is_classifier:  # a *ForSequenceClassification: a classifier, as `tfkit finetune` writes
        err.print(f"label rows with: tfkit predict {shlex.quote(str(path))} --data FILE; score it with: tfkit eval "
                  f"{shlex.quote(str(path))} --data LABELLED", markup=False)
    else:
        err.print(f"continue pretraining it with: {pretrain_command(path, model)}", markup=False)
    typer.echo(str(path))


def pretrain_command(checkpoint: Path, model: ModelConfig) -> str:
    """`tfkit pretrain RECIPE --set train.init_from=CHECKPOINT`: the run takes the checkpoint's model shape and
    tokenizer, the recipe the rest; its sequences are cut to the checkpoint's max_seq_len when longer."""
    from ..trainer.recipe import load_recipe

    recipe = PRETRAIN_RECIPE[model.arch]
    sets = [f"train.init_from={checkpoint}"]
    if load_recipe(recipe).data.seq_len > model.max_seq_len:
        sets.append(f"data.seq_len={model.max_seq_len}")
    return " ".join(["tfkit pretrain", recipe, *(f"--set {shlex.quote(item)}" for item in sets)])


def export_hf(
    ckpt: Annotated[Path, typer.Argument(help="tfkit checkpoint folder, or a run folder (its latest checkpoint).")],
    out: Annotated[Path, typer.Option("--out", "-o", help="HuggingFace folder to write.")],
    force: Force = False,
    license: License = None,
) -> None:
    """Export a tfkit checkpoint as a HuggingFace folder that transformers' Auto classes load.

    bert -> BertForMaskedLM; gpt with learned positions -> GPT2LMHeadModel; gpt with rope + rmsnorm +
    swiglu -> LlamaForCausalLM (any n_kv_heads); a `tfkit finetune` classifier as the family's
    *ForSequenceClassification. Other configurations are refused, naming the field.
    The folder's README.md is a model card written from what the run recorded.
    """
    from ..checkpoints.model_card import export_hf_with_card

    path = export_hf_with_card(ckpt, out, force=force, license=license)
    architecture = read_json(path / "config.json")["architectures"][0]  # what export_hf has just written
    err.print(f"exported {ckpt} as {architecture}")
    typer.echo(str(path))


def export_gguf(
    ckpt: Annotated[Path, typer.Argument(help="tfkit checkpoint folder, or a run folder (its latest checkpoint).")],
    out: Annotated[Path, typer.Option("--out", "-o", help="GGUF file to write; its model card goes inside it and beside it, a.gguf -> a.README.md (one card per file: several exports share a folder).")],
    dtype: Annotated[GGUFDtype, typer.Option(
        "--dtype", help="Type of the weight matrices (norms, biases and positions stay f32).")] = GGUFDtype.f16,
    force: Force = False,
    license: License = None,
) -> None:
    """Export a tfkit decoder as one GGUF file for llama.cpp (needs the gguf package, tfkit's export extra).

    gpt with rope + rmsnorm + swiglu -> llama.cpp's Llama layout (any n_kv_heads, tied or untied head);
    gpt with learned positions + layernorm + gelu -> GPT-2's. The byte-level BPE tokenizer goes into the
    file. What llama.cpp cannot run (ALiBi, post-norm, BatchNorm, sinusoidal positions) is refused, saying why.
    """
    from ..checkpoints.model_card import export_gguf_with_card

    path = export_gguf_with_card(ckpt, out, dtype=dtype.value, force=force, license=license)
    err.print(f"exported {ckpt} as GGUF ({dtype.value})")
    typer.echo(str(path))
