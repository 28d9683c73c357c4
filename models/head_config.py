"""What a classifier's head is, as config.json keeps it beside the model's (`HeadConfig.to_dict`): the task, the
pooling, the dropout and the labels as `id2label` / `label2id`, the keys any tool reads labels from. Plain
Python (no torch), so a recipe's `task` section and a checkpoint's record are checked without importing it;
the head itself is models/heads.py.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError, shorten

TASKS = ("classification", "regression")
POOLINGS = {"bert": ("cls", "mean"), "gpt": ("last", "mean"), "transformer": ("mean",)}  # the first: default


@dataclass(frozen=True)
class HeadConfig:
    task: str = "classification"  # classification (one logit per class) | regression (one output, a float)
    labels: tuple[str, ...] = ()  # class names by id (classification); () for regression
    pooling: str | None = None  # cls | last | mean; None = the family's own (POOLINGS' first)
    dropout: float = 0.1  # on the pooled vector, before the classifier (BERT's fine-tuning default)
    bias: bool | None = None  # a bias on the classifier; None = as the body has biases (a Llama has none)

    @property
    def num_labels(self) -> int:
        return len(self.labels) if self.task == "classification" else 1

    def pooling_for(self, arch: str) -> str:
        return self.pooling or POOLINGS[arch][0]

    def problems(self, arch: str) -> list[str]:
        """Every setting this head cannot have on a body of family `arch`, each naming its key."""
        out = []
        if self.task not in TASKS:
            out.append(f"head.task: got {self.task!r}, expected one of {', '.join(TASKS)}")
        elif self.task == "classification" and (len(self.labels) < 2 or len(set(self.labels)) < len(self.labels)):
            out.append(f"head.labels: got {list(self.labels)}, expected at least two distinct class names")
        elif self.task == "regression" and self.labels:
            out.append(f"head.labels: got {list(self.labels)}, but a regression head has no classes")
        if arch in POOLINGS and self.pooling is not None and self.pooling not in POOLINGS[arch]:
            out.append(f"head.pooling: {self.pooling!r} is not a pooling of {arch} models, which pool "
                       f"{' or '.join(POOLINGS[arch])}")
        if not 0.0 <= self.dropout < 1.0:
            out.append(f"head.dropout: got {self.dropout}, expected 0 <= value < 1")
        return out

    def to_dict(self) -> dict:
        """The head's section of config.json; `id2label` keys are strings, as JSON (and transformers) has them."""
        return {"task": self.task, "pooling": self.pooling, "dropout": self.dropout, "bias": self.bias,
                "num_labels": self.num_labels,
                "id2label": {str(i): name for i, name in enumerate(self.labels)},
                "label2id": {name: i for i, name in enumerate(self.labels)}}

    @classmethod
    def from_dict(cls, data: dict, source: str = "config.json") -> HeadConfig:
        """The head `to_dict` wrote; ConfigError naming `source` and the key when it cannot be one (the rest
        is checked by `problems`, as for a head built in code)."""
        id2label, dropout = data.get("id2label") or {}, data.get("dropout", 0.1)
        ids = [str(i) for i in range(len(id2label))] if isinstance(id2label, dict) else None
        if ids is None or sorted(id2label) != sorted(ids) or not all(isinstance(v, str) for v in id2label.values()):
            raise ConfigError(f"{source}: head.id2label is {shorten(repr(id2label), 300)}, expected class names "
                              "under the ids 0..n-1")
        if isinstance(dropout, bool) or not isinstance(dropout, (int, float)):
            raise ConfigError(f"{source}: head.dropout is {dropout!r}, expected a number")
        bias = data.get("bias", True)  # a head saved before the key always had a bias; null: as its body
        if bias is not None and not isinstance(bias, bool):
            raise ConfigError(f"{source}: head.bias is {bias!r}, expected true, false or null")
        return cls(task=data.get("task", "classification"), labels=tuple(id2label[i] for i in ids),
                   pooling=data.get("pooling"), dropout=float(dropout), bias=bias)

