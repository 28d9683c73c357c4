"""The README.md model card of a fine-tuned checkpoint (`tfkit finetune`), written from what its run recorded.

The layout is HuggingFace's, as for an export (`model_card.py`): YAML front matter (`library_name`, `tags`,
`pipeline_tag` text-classification, `datasets`, `model-index` with the validation scores of metrics.jsonl),
then sections. Every line is read from a file the run wrote: config.json (the head's labels, how text was
read, the step), recipe.yaml (hyperparameters), start.log (the labelled data as the run named it, the
hold-out, the device, the starting checkpoint) and metrics.jsonl (the validation at the checkpoint's step);
the starting checkpoint's own record (`run_record.py`) adds its corpus and steps when it is a tfkit run. A
fact no file holds is left out: a random-init control has no base model line.

The run writes the card at its end into the checkpoints it publishes for the user, the final one and
`best/` (`write_cards`), after metrics.jsonl holds the final validation; each card is one atomic file, so
the checkpoint folder itself is never rewritten.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from ..errors import TfkitError
from ..files import write_atomic
from ..layout import BEST, CARD_MARK, CONFIG, MODEL_CARD
from ..models.config import ModelConfig
from ..models.head_config import HeadConfig
from ..yamlfile import AliasBomb, safe_load
from .folders import run_folder_of
from .model_card import hardware_lines
from .record import TaskRecord
from .run_record import ORIGIN_LINE, RunRecord, last_block, read_metrics, read_run_record

# start.log's line of a fine-tuning run's data (trainer/task.py prints it)
TASK_DATA_LINE = re.compile(r"^data: (classification|regression), (.+?): ([\d,]+) training examples from (.+), "
                            r"([\d,]+) validation examples from (.+)$")
# validation scores as metrics.jsonl names them -> (model-index metric type, the card's words)
SCORES = {"accuracy": ("accuracy", "accuracy"), "macro_f1": ("f1", "macro-F1"),
          "matthews": ("matthews_correlation", "Matthews correlation"),
          "pearson": ("pearsonr", "Pearson correlation"), "spearman": ("spearmanr", "Spearman correlation")}
# the recipe keys a card lists as the run's hyperparameters
HYPERPARAMETERS = (("optim", "name"), ("optim", "lr"), ("optim", "weight_decay"), ("schedule", "name"),
                   ("schedule", "warmup_steps"), ("train", "max_steps"), ("train", "batch_size"), ("data", "seq_len"),
                   ("model", "dropout"), ("objective", "label_smoothing"), ("task", "metric"))


def write_cards(run_dir: Path, final: Path | None) -> None:
    """README.md into the run's final checkpoint `final` and its `best/` (when kept); a resume that trained
    nothing ends on the checkpoint it resumed, which another run folder may hold and is left as it is."""
    for folder in (final, run_dir / BEST):
        if folder is not None and run_folder_of(folder) == run_dir and (folder / CONFIG).is_file():
            write_atomic(folder / MODEL_CARD, finetune_card(folder))


def finetune_card(folder: Path) -> str:
    """The README.md text of the fine-tuned checkpoint `folder` (see the module doc)."""
    record = read_run_record(folder)
    run_dir, head, task = record.run_dir, record.checkpoint.head, record.checkpoint.task
    recipe = _recipe(run_dir / "recipe.yaml") if run_dir is not None else {}
    block = last_block(run_dir / "start.log") if run_dir is not None else []
    data = next((m for line in block if (m := TASK_DATA_LINE.match(line))), None)
    scores = _validation_row(run_dir, record.checkpoint.step) if run_dir is not None else None
    train = recipe.get("train") if isinstance(recipe.get("train"), dict) else {}
    init_from = (_initialised_from(run_dir) if run_dir is not None else None) or train.get("init_from")
    source = _source(init_from)
    regression = head is not None and head.task == "regression"
    name = run_dir.name if run_dir is not None else record.name  # the run, which the recipe may have made many of
    front = _front_matter(name, record, regression, data, scores)
    classes = head.num_labels if head is not None else None
    what = "regressor (one float output)" if regression else f"text classifier ({classes} classes)"
    control = "init_from" in train and train["init_from"] is None  # recipe.yaml says so, not a missing key
    start = (f"fine-tuned from the weights of `{init_from}`{_imported(source)}" if init_from
             else "trained from random weights (no pretrained body: the control)" if control else None)
    body = [f"# {name}", "", f"A {record.checkpoint.model.arch} {what} made by `tfkit finetune`"
            + (f", {start}." if start else "."), ""]
    for title, lines in (("Task", _task_lines(head, task, regression)),
                         ("Model", _model_lines(record.checkpoint.model)),
                         ("Starting checkpoint", _source_lines(init_from, source)),
                         ("Labelled data", _data_lines(data, block)),
                         ("Training", _training_lines(record, recipe)),
                         ("Evaluation", _evaluation_lines(scores, data, folder))):
        if lines:
            body += [f"## {title}", "", *lines, ""]
    body += ["## How to use", "", *_usage(), "", CARD_MARK]
    return "---\n" + yaml.safe_dump(front, sort_keys=False, allow_unicode=True) + "---\n\n" + "\n".join(body) + "\n"


def _recipe(path: Path) -> dict:
    """recipe.yaml as a mapping; a damaged one costs the card its hyperparameters only."""
    try:
        recipe = safe_load(path.read_text(encoding="utf-8"))
    except (OSError, AliasBomb, UnicodeDecodeError, yaml.YAMLError):
        return {}
    return recipe if isinstance(recipe, dict) else {}


def _validation_row(run_dir: Path, step: int | None) -> dict | None:
    """The run's last validation row at the checkpoint's step (a resume may have logged it twice)."""
    rows = [r for r in read_metrics(run_dir / "metrics.jsonl") if r.get("step") == step and "val_loss" in r]
    return rows[-1] if rows and step is not None else None


def _initialised_from(run_dir: Path) -> str | None:
    """The checkpoint train.init_from resolved to, as the run's first start named it (a resume's block does not)."""
    path = run_dir / "start.log"
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines() if path.is_file() else []
    return next((m[1] for line in lines if (m := ORIGIN_LINE.match(line))), None)


def _source(path: str | None) -> RunRecord | None:
    """The starting checkpoint's own record, when it is still there."""
    if path is None or not (Path(path) / CONFIG).is_file():
        return None
    try:
        return read_run_record(path)
    except (TfkitError, OSError):  # a source changed or damaged since: the card names it without its training
        return None


def _imported(source: RunRecord | None) -> str:
    """What an import-hf starting checkpoint was imported from, as the card's first sentence names it."""
    if source is None or source.checkpoint.imported_from is None:
        return ""
    return f" (the HuggingFace {source.checkpoint.hf_architecture or 'model'} `{source.checkpoint.imported_from}`)"


def _front_matter(name: str, record: RunRecord, regression: bool, data: re.Match | None, scores: dict | None) -> dict:
    front: dict = {"library_name": "tfkit", "tags": ["tfkit", record.checkpoint.model.arch, "regression" if regression
                                                     else "text-classification"],
                   "pipeline_tag": "text-classification"}
    if data is not None:
        front["datasets"] = [data[4]]
    metrics = [{"type": kind, "value": round(scores[f"val_{key}"], 4), "name": f"validation {words}"}
               for key, (kind, words) in SCORES.items()
               if scores and isinstance(scores.get(f"val_{key}"), (int, float))]
    if metrics:
        valid = data[6] if data is not None else "validation"
        front["model-index"] = [{"name": name, "results": [{
            "task": {"type": "text-classification", "name": "Text regression" if regression else "Text classification"},
            "dataset": {"type": valid, "name": valid, "split": "validation"}, "metrics": metrics}]}]
    return front


def _task_lines(head: HeadConfig | None, task: TaskRecord | None, regression: bool) -> list[str]:
    lines = []
    if regression:
        lines.append("- Regression: one float per text (mean squared error)")
    elif head is not None and head.labels:
        lines.append(f"- Classification into {len(head.labels)} classes: " + ", ".join(f"`{x}`" for x in head.labels)
                     + " (id2label / label2id in config.json)")
    if task is not None:
        pair = [f"pair column `{task.text_pair}`"] if task.text_pair is not None else []
        lines.append("- Input: " + ", ".join([f"text column `{task.text}`", *pair, f"label column `{task.label}`"]))
        stride = f"; long texts read as windows {task.stride} tokens apart" if task.stride else ""
        lines.append(f"- Long texts: truncation `{task.truncation}`{stride}")
    if head is not None and head.pooling:
        lines.append(f"- Head: one linear layer on the `{head.pooling}`-pooled vector, dropout {head.dropout}")
    return lines


def _model_lines(cfg: ModelConfig) -> list[str]:
    kind = "MHA" if cfg.kv_heads == cfg.n_heads else "MQA" if cfg.kv_heads == 1 else "GQA"
    return [f"- Body: tfkit `{cfg.arch}`, {cfg.n_layers} layer{'s' * (cfg.n_layers != 1)}, d_model {cfg.d_model}, "
            f"{cfg.n_heads} query / {cfg.kv_heads} key-value heads ({kind}), context {cfg.max_seq_len} tokens"]


def _source_lines(path: str | None, source: RunRecord | None) -> list[str]:
    if path is None:
        return []
    lines = [f"- `{path}`" + (f" (`{source.name}`)" if source is not None and source.name != Path(path).name else "")]
    if source is not None:
        if source.train_corpus:
            size = f", {source.train_corpus_tokens:,} tokens" if source.train_corpus_tokens else ""
            lines.append(f"- Pretrained on `{source.train_corpus}`" + (f" (a corpus of {size[2:]})" if size else ""))
        if source.checkpoint.step is not None:
            lines.append(f"- Steps: {source.checkpoint.total_steps:,}"
                         + (f", {source.tokens:,} tokens seen" if source.tokens is not None else ""))
        lines += [f"- {line[0].upper()}{line[1:]}" for line in source.lineage]  # an import-hf folder, a conversion
    return lines


def _data_lines(data: re.Match | None, block: list[str]) -> list[str]:
    """The labelled data as start.log names it, and what it says was held out, cut or windowed."""
    if data is None:
        return []
    notes = [line.removeprefix("data: ") for line in block if line.startswith("data: ") and line != data[0]]
    return [f"- Training: `{data[4]}`, {data[3]} examples ({data[2]})",
            f"- Validation: `{data[6]}`, {data[5]} examples", *[f"- {n[0].upper()}{n[1:]}" for n in notes]]


def _training_lines(record: RunRecord, recipe: dict) -> list[str]:
    lines = []
    if record.checkpoint.step is not None:
        lines.append(f"- Steps: {record.checkpoint.step:,}")
    values = [f"{section}.{key} {recipe[section][key]}" for section, key in HYPERPARAMETERS
              if isinstance(recipe.get(section), dict) and recipe[section].get(key) is not None]
    if values:
        lines.append("- Hyperparameters (recipe.yaml): " + ", ".join(values))
    if record.recipe_sha256:
        seed = f", seed {record.seed}" if record.seed is not None else ""
        lines.append(f"- Recipe: `{record.name}` (sha256 of its recipe.yaml `{record.recipe_sha256[:16]}`){seed}")
    return lines + hardware_lines(record)


def _evaluation_lines(scores: dict | None, data: re.Match | None, folder: Path) -> list[str]:
    if scores is None:
        return []
    where = f" on `{data[6]}`" if data is not None else ""
    examples = f" ({scores['val_examples']:,} examples)" if isinstance(scores.get("val_examples"), int) else ""
    found = [f"{words} {scores[f'val_{key}']:.4f}" for key, (_, words) in SCORES.items()
             if isinstance(scores.get(f"val_{key}"), (int, float))]
    kept = " (the best validation of the run, kept as best/)" if folder.name == BEST else ""
    return [f"- Validation at step {scores['step']:,}{where}{examples}{kept}: loss {scores['val_loss']:.4f}, "
            + ", ".join(found)]


def _usage() -> list[str]:
    return ["With tfkit (a CSV / TSV / JSONL / Parquet file with the columns above):", "", "```sh",
            "tfkit predict path/to/this/folder --data texts.jsonl --out predictions.jsonl",
            "tfkit eval path/to/this/folder --data labelled.csv", "```", "",
            "`tfkit export-hf` writes it as a HuggingFace `*ForSequenceClassification` folder with the same logits "
            "(BERT with `pooling: cls`, decoders with `pooling: last`)."]
