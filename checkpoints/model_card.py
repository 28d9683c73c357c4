"""The README.md model card of an exported model, written from what its run recorded (`run_record.py`).

HuggingFace's model-card layout: YAML front matter (`library_name`, `tags`, `license` when the user gave
one, `datasets`, `model-index` with the validation tfkit measured), then sections in prose. Each line
states a recorded fact; a fact the checkpoint and its run did not record is left out, never guessed (a
checkpoint outside a run folder has no corpus, seed or tokens to tell). `tfkit export-hf` writes it as the
folder's README.md, `tfkit export-gguf` inside the file and beside it as `a.README.md` for `a.gguf`.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from ..layout import CARD_MARK, CLASSIFIER_EXPORT_ARCHITECTURES, EXPORT_ARCHITECTURES
from ..models import build_model
from ..models.config import ModelConfig
from ..tokenization.tokenizer import load_tokenizer
from .folders import resolve_checkpoint
from .meta import parameters_on_meta
from .run_record import RunRecord, read_run_record
from .weights import check_depth, refuse_classifier

TASK = {"clm": ("text-generation", "Causal language modeling"), "mlm": ("fill-mask", "Masked language modeling")}
CLASSIFY = ("text-classification", "Text classification")  # a `tfkit finetune` classifier or regressor
TOKENIZER_KIND = {"bpe": "byte-level BPE", "wordpiece": "WordPiece", "unigram": "Unigram (SentencePiece-style)"}


def model_card(path: str | Path, family: str, export: str, license: str | None = None,
               gguf_name: str = "model.gguf") -> str:
    """The README.md text for the checkpoint (or run folder) `path`, exported as `family` (bert, gpt2,
    llama) in `export` form (hf: a transformers folder, gguf: one llama.cpp file, `gguf_name`)."""
    record = read_run_record(path)
    folder = resolve_checkpoint(path)
    check_depth(record.checkpoint.model, folder)  # before the count of parameters builds the model (meta)
    tokenizer = load_tokenizer(folder) if (folder / "tokenizer.json").is_file() else None
    trained = record if record.run_dir is not None or record.source is None else record.source
    front = _front_matter(record, family, export, license, trained.train_corpus)
    body = [f"# {record.name}", "",
            f"A {_model_kind(record)} trained with tfkit and exported "
            f"{'as a HuggingFace transformers folder' if export == 'hf' else 'as GGUF for llama.cpp'}.", "",
            "## Model", "", *_model_lines(record, family, export), ""]
    if tokenizer is not None:
        specials = ", ".join(f"`{t}`" for t in sorted({v for v in tokenizer.roles.values() if isinstance(v, str)}))
        body += ["## Tokenizer", "", f"- {TOKENIZER_KIND.get(tokenizer.kind, tokenizer.kind)}, "
                 f"{tokenizer.vocab_size:,} tokens" + (f"; special tokens {specials}" if specials else ""), ""]
    training = "Training" if trained is record else "Training (of the model it was converted from)"
    for title, lines in ((training, _training_lines(trained)), ("Evaluation", _evaluation_lines(record)),
                         ("Provenance", _provenance_lines(record))):
        if lines:
            body += [f"## {title}", "", *lines, ""]
    body += ["## How to use", "", *_usage(family, export, gguf_name, record.checkpoint.is_classifier), "", CARD_MARK]
    return "---\n" + yaml.safe_dump(front, sort_keys=False, allow_unicode=True) + "---\n\n" + "\n".join(body) + "\n"


def _task(record: RunRecord) -> tuple[str, str]:
    """(pipeline tag, task name) of what the checkpoint was trained for."""
    if record.checkpoint.is_classifier:
        return CLASSIFY
    return TASK.get(record.checkpoint.objective, TASK["mlm" if record.checkpoint.model.arch == "bert" else "clm"])


def _model_kind(record: RunRecord) -> str:
    if record.checkpoint.is_classifier:
        return f"{record.checkpoint.model.arch} sequence classifier (fine-tuned with `tfkit finetune`)"
    return {"gpt": "decoder-only Transformer language model", "bert": "BERT-style masked language model",
            "transformer": "encoder-decoder Transformer"}[record.checkpoint.model.arch]


def _front_matter(record: RunRecord, family: str, export: str, license: str | None, corpus: str | None) -> dict:
    """HF's card metadata; `corpus` is the training corpus (a converted model's is its source's)."""
    task = _task(record)
    front: dict = {"library_name": "transformers" if export == "hf" else "gguf"}
    if license:
        front["license"] = license
    front["tags"] = ["tfkit", family, *(["gguf"] if export == "gguf" else [])]
    front["pipeline_tag"] = task[0]
    if corpus:
        front["datasets"] = [corpus]
    v = record.validation
    if v is not None:
        metrics = [{"type": "loss", "value": round(v.loss, 4), "name": "validation loss (nats / token)"}]
        if v.perplexity is not None:
            metrics.append({"type": "perplexity", "value": round(v.perplexity, 2), "name": "validation perplexity"})
        if v.accuracy is not None:
            name = {"text-generation": "validation next-token accuracy", "fill-mask": "validation masked-token "
                    "accuracy"}.get(task[0], "validation accuracy")
            metrics.append({"type": "accuracy", "value": round(v.accuracy, 4), "name": name})
        corpus = v.corpus or "validation"
        front["model-index"] = [{"name": record.name, "results": [{
            "task": {"type": task[0], "name": task[1]},
            "dataset": {"type": corpus, "name": corpus, "split": "validation"}, "metrics": metrics}]}]
    return front


def _attention(cfg: ModelConfig) -> str:
    kind = "MHA" if cfg.kv_heads == cfg.n_heads else "MQA" if cfg.kv_heads == 1 else "GQA"
    return f"{cfg.n_heads} query heads / {cfg.kv_heads} key-value heads ({kind}), head size {cfg.head_dim}"


def _model_lines(record: RunRecord, family: str, export: str) -> list[str]:
    cfg = record.checkpoint.model
    with parameters_on_meta():
        params = build_model(cfg).num_params()
    positions = f"RoPE (theta {cfg.rope_theta:g})" if cfg.positions == "rope" else f"{cfg.positions} positions"
    classes = CLASSIFIER_EXPORT_ARCHITECTURES if record.checkpoint.is_classifier else EXPORT_ARCHITECTURES
    target = f"transformers' `{classes[family]}`" if export == "hf" else f"llama.cpp's `{family}` architecture"
    lines = [f"- Architecture: tfkit `{cfg.arch}`, exported as {target}: "
             f"{cfg.n_layers} layer{'s' * (cfg.n_layers != 1)}, d_model {cfg.d_model}, {_attention(cfg)}",
             f"- Feed-forward: {cfg.activation}, hidden size {cfg.ffn_dim}; {cfg.norm} ({cfg.norm_placement}-norm); "
             f"{positions}; context {cfg.max_seq_len} tokens; "
             f"{'tied' if cfg.tie_embeddings else 'untied'} input and output embeddings"]
    if record.checkpoint.is_classifier:  # the export drops the body's language-model head: its count would be wrong
        labels = record.checkpoint.head.labels
        return lines + [f"- Head: {', '.join(labels) or 'one regression output'}"]
    return lines + [f"- Parameters: {params:,}"]


def _training_lines(record: RunRecord) -> list[str]:
    lines = []
    if record.train_corpus:
        size = f", {record.train_corpus_tokens:,} tokens" if record.train_corpus_tokens else ""
        epochs = f"; {record.epochs:.3g} epochs seen" if record.epochs is not None else ""
        lines.append(f"- Corpus: `{record.train_corpus}`{size}{epochs}")
    if record.recipe_sha256:
        seed = f", seed {record.seed}" if record.seed is not None else ""
        lines.append(f"- Recipe: `{record.name}` (sha256 of its recipe.yaml `{record.recipe_sha256[:16]}`){seed}")
    step, prior = record.checkpoint.step, record.checkpoint.prior_steps
    if step is not None:
        before = f" (after {prior:,} steps of the weights it started from)" if prior else ""
        lines.append(f"- Steps: {step:,}{before}")
    elif prior:  # a converted or imported model: the steps are its source's
        lines.append(f"- Steps: {prior:,}, all before the conversion")
    if record.tokens is not None:
        lines.append(f"- Tokens: {record.tokens:,} by step {record.tokens_step:,}")
    return lines + hardware_lines(record)


def _evaluation_lines(record: RunRecord) -> list[str]:
    v = record.validation
    if v is None:
        return []
    where = f" on `{v.corpus}`" if v.corpus else ""
    scores = [f"loss {v.loss:.4f} nats / token"]
    if v.perplexity is not None:
        scores.append(f"perplexity {v.perplexity:.2f}")
    if v.accuracy is not None:
        scores.append(f"accuracy {100 * v.accuracy:.2f}%")
    return [f"- Validation at step {v.step:,}{where}: {', '.join(scores)}"]


def _provenance_lines(record: RunRecord) -> list[str]:
    """What the weights went through, latest first: uptraining, conversions, an import."""
    lines = []
    while record is not None:
        if record.initialised_from:
            lines.append(f"- Trained on (uptrained) from the weights of `{record.initialised_from}`")
        lines += [f"- {line[0].upper()}{line[1:]}" for line in record.lineage]
        record = record.source
    return lines


def _usage(family: str, export: str, gguf_name: str, classifier: bool = False) -> list[str]:
    if export == "gguf":
        return ["With llama.cpp:", "", "```sh", f'llama-cli -m {gguf_name} -p "Once upon a time" -n 64', "```"]
    auto = ("AutoModelForSequenceClassification" if classifier else
            "AutoModelForMaskedLM" if family == "bert" else "AutoModelForCausalLM")
    return ["With transformers:", "", "```python", f"from transformers import AutoTokenizer, {auto}", "",
            'tokenizer = AutoTokenizer.from_pretrained("path/to/this/folder")',
            f'model = {auto}.from_pretrained("path/to/this/folder")', "```"]


def export_hf_with_card(ckpt: str | Path, out: str | Path, *, force: bool = False, license: str | None = None) -> Path:
    """`hf_export.export_hf` with the model card of the checkpoint's run as the folder's README.md."""
    from .hf_export import export_hf
    from .hf_state import export_family

    record = read_run_record(ckpt)
    family = export_family(record.checkpoint.model)  # a model without an HF equivalent fails before the card is written
    return export_hf(ckpt, out, force=force, card=model_card(ckpt, family, "hf", license))


def export_gguf_with_card(ckpt: str | Path, out: str | Path, *, dtype: str = "f16", force: bool = False,
                          license: str | None = None) -> Path:
    """`gguf_export.export_gguf` with the model card of the checkpoint's run inside the file and beside it
    (`a.gguf` -> `a.README.md`: gguf_export's docstring says why)."""
    from .gguf_export import export_gguf

    record = read_run_record(ckpt)
    refuse_classifier(resolve_checkpoint(ckpt), record.checkpoint)
    layout = "llama" if record.checkpoint.model.positions == "rope" else "gpt2"  # export_gguf refuses what llama.cpp cannot run
    card = model_card(ckpt, layout, "gguf", license, gguf_name=Path(out).name)
    return export_gguf(ckpt, out, dtype=dtype, force=force, name=record.name, license=license, card=card)


def hardware_lines(record: RunRecord) -> list[str]:
    """The precision and the machine a run trained on, as its start.log and config.json recorded them."""
    lines = []
    precision = record.checkpoint.precision
    if precision is not None and record.run_dir is not None:
        lines.append(f"- Precision: {precision}")
    if record.device:
        threads = f", {record.threads} CPU thread{'s' * (record.threads != 1)}" if record.threads else ""
        lines.append(f"- Hardware: {record.device}{threads}")
    return lines
