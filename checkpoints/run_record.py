"""What a checkpoint's run recorded, gathered for its model card (`model_card.py`, `finetune_card.py`).

Everything here is read from files tfkit wrote, never estimated: the checkpoint's config.json (model,
step, precision, conversions), and, when the checkpoint lies in a run folder (`<run>/checkpoints/step-N`
or `<run>/best`), the run's recipe.yaml (seed, its sha256), start.log (the corpora as the run named them,
their sizes in tokens, the device) and metrics.jsonl (tokens seen, the validation at the checkpoint's
step). A fact a file does not hold stays None, and the card leaves it out.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..errors import DataError, TfkitError
from ..jsonfile import parse_json
from ..layout import CONFIG, RECIPE_FILE, START_LOG
from ..yamlfile import AliasBomb, safe_load
from .folders import resolve_checkpoint, run_folder_of
from .record import CheckpointRecord

# start.log lines (trainer/data.py and run._describe print them; the last start block is the one read)
DATA_LINE = re.compile(r"^data: ([\d,]+) training tokens from (.+?) \(.*?\); ([\d,]+) validation tokens "
                       r"from (.+) \(cache ")
DEVICE_LINE = re.compile(r", (fp32|bf16 autocast|fp16 autocast) on (\S+) \((\d+) CPU threads?\)"
                         r"(?: x(\d+) \((\w+)\))?")
MAX_SOURCES = 4  # conversions followed back to the training run
ORIGIN_LINE = re.compile(r"^run folder .* \(initialised from (.+)\)$")


@dataclass
class Validation:
    step: int
    loss: float
    perplexity: float | None
    accuracy: float | None
    corpus: str | None  # as start.log names it: a corpus, or the share of data.train held out


@dataclass
class RunRecord:
    name: str  # the recipe's name, else the checkpoint folder's
    checkpoint: CheckpointRecord  # the checkpoint's config.json
    run_dir: Path | None = None
    seed: int | None = None
    recipe_sha256: str | None = None
    train_corpus: str | None = None
    train_corpus_tokens: int | None = None
    validation_corpus: str | None = None  # a corpus, or the share of data.train held out (start.log's words)
    tokens: int | None = None  # training tokens seen by `tokens_step` (the last log row up to the checkpoint)
    tokens_step: int | None = None
    device: str | None = None  # as start.log names it: cpu, cuda:0 (x4 ddp)
    threads: int | None = None
    validation: Validation | None = None
    initialised_from: str | None = None
    lineage: list[str] = field(default_factory=list)  # conversions and imports, as sentences
    source: RunRecord | None = None  # a converted checkpoint's source, when it is still there

    @property
    def epochs(self) -> float | None:
        """Passes over the training corpus the recorded tokens make (None without both numbers)."""
        if self.tokens is None or not self.train_corpus_tokens:
            return None
        return self.tokens / self.train_corpus_tokens


def read_run_record(path: str | Path, depth: int = 0) -> RunRecord:
    """Everything the checkpoint (or run folder) `path` and its run recorded about how it was made, with the
    record of the checkpoint it was converted from (up to MAX_SOURCES conversions back)."""
    folder = resolve_checkpoint(path)
    checkpoint = CheckpointRecord.read(folder)
    record = RunRecord(name=checkpoint.recipe or folder.name, checkpoint=checkpoint, run_dir=run_folder_of(folder),
                       lineage=_lineage(checkpoint))
    if record.run_dir is not None:
        _read_recipe(record, record.run_dir / RECIPE_FILE)
        _read_start_log(record, record.run_dir / START_LOG)
        _read_metrics(record, record.run_dir / "metrics.jsonl")
    source = checkpoint.converted_from
    if source is not None and depth < MAX_SOURCES and (Path(source) / CONFIG).is_file():
        try:
            record.source = read_run_record(source, depth + 1)
        except TfkitError:  # a source changed since: the card tells the conversion without its training
            record.source = None
    return record


def _lineage(checkpoint: CheckpointRecord) -> list[str]:
    """The conversions the config.json records (convert-mqa-to-gqa, import-hf)."""
    out = []
    if checkpoint.imported_from is not None:
        out.append(f"imported from the HuggingFace {checkpoint.hf_architecture or 'model'} at "
                   f"`{checkpoint.imported_from}` (tfkit import-hf)")
    if checkpoint.converted_from is not None:
        out.append(f"regrouped from {checkpoint.kv_heads_before or '?'} to {checkpoint.model.kv_heads} key/value heads "
                   f"(method `{checkpoint.method or '?'}`) from `{checkpoint.converted_from}` (tfkit convert-mqa-to-gqa)")
    return out


def _read_recipe(record: RunRecord, path: Path) -> None:
    raw = path.read_bytes()
    record.recipe_sha256 = hashlib.sha256(raw).hexdigest()
    try:
        recipe = safe_load(raw.decode("utf-8"))
    except (AliasBomb, UnicodeDecodeError, yaml.YAMLError):  # a damaged recipe.yaml costs the card its seed only
        return
    train = recipe.get("train") if isinstance(recipe, dict) else None
    seed = train.get("seed") if isinstance(train, dict) else None
    record.seed = seed if isinstance(seed, int) and not isinstance(seed, bool) else None


def last_block(path: Path) -> list[str]:
    """The lines of start.log's last start block (a resume appends its own)."""
    if not path.is_file():
        return []
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("# ")]
    return lines[starts[-1] + 1:] if starts else lines


def _read_start_log(record: RunRecord, path: Path) -> None:
    for line in last_block(path):
        if data := DATA_LINE.match(line):
            record.train_corpus_tokens = int(data[1].replace(",", ""))
            record.train_corpus, record.validation_corpus = data[2], data[4]
        elif device := DEVICE_LINE.search(line):
            record.device = device[2] + (f" x{device[4]} ({device[5]})" if device[4] else "")
            record.threads = int(device[3])
        elif origin := ORIGIN_LINE.match(line):
            record.initialised_from = origin[1]


def _read_metrics(record: RunRecord, path: Path) -> None:
    """Tokens seen by the checkpoint's step and its validation row (the run's last validation at that step)."""
    rows = [r for r in read_metrics(path) if isinstance(r.get("step"), int)
            and (record.checkpoint.step is None or r["step"] <= record.checkpoint.step)]
    train = [r for r in rows if isinstance(r.get("tokens"), int) and "loss" in r]
    if train:
        record.tokens, record.tokens_step = train[-1]["tokens"], train[-1]["step"]
    valid = [r for r in rows if isinstance(r.get("val_loss"), (int, float)) and r["step"] == record.checkpoint.step]
    if valid:
        row = valid[-1]
        record.validation = Validation(row["step"], row["val_loss"], row.get("val_ppl"), row.get("val_accuracy"),
                                       record.validation_corpus)


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """Every row of a metrics.jsonl (a torn last line from a killed process is skipped)."""
    rows = []
    if not path.exists():
        return rows
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rows.append(parse_json(line, path))
        except DataError:  # checked when a run resumes (run_folder); a torn or damaged row counts for nothing
            continue
    return rows

