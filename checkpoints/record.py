"""What a checkpoint's config.json says, as one type.

`CheckpointRecord.read` reads and validates the file once (every key's type, the model section as a
`ModelConfig`, a classifier's head as a `HeadConfig`); every command then reads typed fields
(`record.step`, `record.prior_steps`, `record.head`) instead of a dict with a guarded `.get` of its own.
`to_json` writes it back. The file is

    {"tfkit_version": ..., "model": ModelConfig.to_dict(), ...what its writer knew}

- a training run (trainer/checkpointer.py): `objective`, `recipe`, `train_seq_len`, `prior_steps`,
  `cpu_threads`, `precision`, `data` (what it read, the packed layout), `pair_fields` (seq2seq), a
  classifier's `head` and `task`, and `step`; a run's best/ adds `val_loss`;
- `tfkit import-hf`: `imported_from`, `hf_architecture` (and `head` for a `*ForSequenceClassification`);
- `tfkit convert-mqa-to-gqa`: the source's facts but its step, with `converted_from`, `method`,
  `kv_heads_before`, `prior_steps` (the source's steps and its own prior ones) and `seed` (method random).

A key that is absent is a fact nobody recorded (None: an import has no step). A key this version does not
know, from a newer tfkit, is ignored; a known key of the wrong type is a damaged file, refused naming it.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, ClassVar

from .. import __version__
from ..errors import CheckpointError
from ..jsonfile import read_json
from ..layout import CONFIG
from ..models.config import ModelConfig, type_problem
from ..models.head_config import HeadConfig
from ..ranges import hints
from ..tokenization.sources import source_problems


@dataclass(frozen=True)
class DataRecord:
    """What a training run read and the packed layout it trained under (`tfkit eval` scores it the same way;
    `data.train: null` of a run started from the checkpoint reads the same data). `train` / `valid` are a
    corpus, or a list of named sources as the recipe wrote it (a weighted mixture: tokenization/sources.py)."""

    train: str | list[dict] | None = None
    valid: str | list[dict] | None = None
    valid_fraction: float | None = None
    text_field: str = "text"
    document_mask: bool = False
    reset_positions: bool = False


@dataclass(frozen=True)
class TaskRecord:
    """How a classifier's rows were read when it was fine-tuned, which `tfkit eval --data` and `tfkit predict`
    repeat (the recipe's `task` section), and the score its best/ kept."""

    text: str | int = "text"
    text_pair: str | int | None = None
    label: str | int = "label"
    header: bool = True
    truncation: str = "head"
    stride: int | None = None
    metric: str | None = None


@dataclass(frozen=True)
class CheckpointRecord:
    """The whole config.json of one checkpoint folder."""

    model: ModelConfig
    tfkit_version: str | None = None
    step: int | None = None  # this checkpoint's own training steps (None: not trained by tfkit, e.g. imported)
    prior_steps: int = 0  # updates its starting weights had had before step 0 (uptraining, conversions)
    val_loss: float | None = None  # best/: the validation loss (minus the task score) it was kept for
    objective: str | None = None  # clm | mlm | seq2seq | classify | regress
    recipe: str | None = None  # the recipe's name
    train_seq_len: int | None = None  # data.seq_len it trained at
    cpu_threads: int | None = None  # a resumed `train.threads: auto` run computes with as many
    precision: str | None = None  # fp32 | bf16 | fp16, the one a resume and `tfkit eval --dtype auto` keep
    data: DataRecord | None = None
    pair_fields: tuple[str, ...] | None = None  # seq2seq: the source and target fields of its records
    head: HeadConfig | None = None  # a classifier made by `tfkit finetune` (or imported as one)
    task: TaskRecord | None = None
    imported_from: str | None = None  # import-hf: the HuggingFace folder
    hf_architecture: str | None = None
    converted_from: str | None = None  # convert-mqa-to-gqa: the source checkpoint
    method: str | None = None
    kv_heads_before: int | None = None
    seed: int | None = None  # convert-mqa-to-gqa --method random: the seed of the new K/V

    NESTED: ClassVar[dict[str, type]] = {"data": DataRecord, "task": TaskRecord}
    NON_NEGATIVE: ClassVar[tuple[str, ...]] = ("step", "prior_steps", "train_seq_len", "cpu_threads")

    @property
    def is_classifier(self) -> bool:
        return self.head is not None

    @property
    def total_steps(self) -> int:
        """Every update behind these weights: its own steps and those of the weights it started from."""
        return self.prior_steps + (self.step or 0)

    @property
    def data_record(self) -> DataRecord:
        """Its data record, or the defaults (no document mask) when it recorded none (imports, older runs)."""
        return self.data or DataRecord()

    @classmethod
    def read(cls, path: str | Path) -> CheckpointRecord:
        """The record of a checkpoint folder (or of its config.json file; `folders.resolve_checkpoint` turns a
        run folder into one). Invalid JSON, a missing model section or a value of the wrong type is one
        CheckpointError (a bad model or head value a ConfigError) naming the file and the key."""
        path = Path(path)
        file = path if path.name == CONFIG else path / CONFIG
        raw = read_json(file, CheckpointError, expect=None)
        if not isinstance(raw, dict) or not isinstance(raw.get("model"), dict):
            raise CheckpointError(f"{file}: expected a JSON object with a 'model' section (the model config)")
        return cls.from_json(raw, file)

    @classmethod
    def from_json(cls, raw: dict[str, Any], file: Path) -> CheckpointRecord:
        """The record of a parsed config.json (`read` without the file)."""
        values = _scalars(cls, raw, "", file)
        for name, kind in cls.NESTED.items():
            section = raw.get(name)
            if section is not None and not isinstance(section, dict):
                raise CheckpointError(f"{file}: '{name}' is {section!r}, expected a JSON object (the checkpoint is "
                                      "damaged)")
            values[name] = None if section is None else kind(**_scalars(kind, section, f"{name}.", file))
        if values.get("data") is not None:
            _check_sources(values["data"], file)
        pair = raw.get("pair_fields")
        two_names = isinstance(pair, list) and len(pair) == 2 and all(isinstance(v, str) for v in pair)
        if pair is not None and not two_names:
            raise CheckpointError(f"{file}: 'pair_fields' is {pair!r}, expected two field names")
        values["pair_fields"] = None if pair is None else tuple(pair)
        head = raw.get("head")
        if head is not None and not isinstance(head, dict):
            raise CheckpointError(f"{file}: 'head' is {head!r}, expected a JSON object (the checkpoint is damaged)")
        values["head"] = None if head is None else HeadConfig.from_dict(head, str(file))
        values["model"] = ModelConfig.from_dict(raw["model"], source=file)
        return cls(**values)

    def to_json(self) -> str:
        """config.json's text: the version writing it, the model, then every fact recorded (None left out)."""
        out: dict[str, Any] = {"tfkit_version": __version__, "model": self.model.to_dict()}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in ("tfkit_version", "model") or value is None:
                continue
            if f.name == "head":
                value = value.to_dict()
            elif f.name in self.NESTED:
                value = dataclasses.asdict(value)
            elif f.name == "pair_fields":
                value = list(value)
            out[f.name] = value
        return json.dumps(out, indent=2) + "\n"


def _scalars(kind: type, raw: dict[str, Any], prefix: str, file: Path) -> dict[str, Any]:
    """The plain (str, number, bool) fields of dataclass `kind` that `raw` holds, each checked against its
    annotation; the first wrong one is a CheckpointError naming `prefix` + the key."""
    declared = hints(kind)
    nested = getattr(kind, "NESTED", {}).keys() | {"model", "head", "pair_fields"}
    values: dict[str, Any] = {}
    for f in fields(kind):
        if f.name in nested or f.name not in raw:
            continue
        value, hint = raw[f.name], declared[f.name]
        expected = type_problem(value, hint)
        if expected is None and f.name in getattr(kind, "NON_NEGATIVE", ()) and value is not None and value < 0:
            expected = "a non-negative integer"
        if expected:
            raise CheckpointError(f"{file}: '{prefix}{f.name}' is {value!r}, expected {expected} (the checkpoint is "
                                  "damaged)")
        values[f.name] = float(value) if hint in (float, float | None) and value is not None else value
    return values


def _check_sources(data: DataRecord, file: Path) -> None:
    """A list of sources under data.train / data.valid holds what a recipe's list holds (tokenization/sources.py)."""
    problems = source_problems(data.train, "data.train") + source_problems(data.valid, "data.valid", valid=True)
    if problems:
        raise CheckpointError(f"{file}: {problems[0]} (the checkpoint is damaged)")
