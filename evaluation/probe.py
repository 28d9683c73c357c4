"""A linear probe: how much of a labelled task a model's frozen features already hold (`eval.probe`,
`tfkit eval CKPT --probe DATA`).

Why a probe and not a fine-tune: a fine-tuning of bert-tiny on stdlib:topics is 150 updates of the whole
model (a minute of CPU); a probe is one forward pass over the rows and a closed-form fit (a few seconds), so
it can run at every validation of a pretraining, where a fine-tune per validation would cost more than the
pretraining itself. It reads the model as it is, which is the question a pretraining curve asks.

The probe: every text laid out as the family pretrained (BERT's [CLS] a [SEP], a GPT's document prefix),
cut to PROBE_TOKENS, run once in eval mode; its feature is the mean of its real tokens' final states, a
vector every family has (BERT's [CLS] pooler is untrained without next-sentence prediction). A ridge
classifier (one-vs-rest least squares on features standardised by the training rows, `RIDGE` on the weights,
solved in float64) is fitted on the training rows and scored by its accuracy on the held-out rows. The fit
is closed-form: no learning rate, no iterations, no randomness, so the in-loop number equals the offline one
to the bit. Rows: `stdlib:topics` keeps its own stratified split; another file holds out a seeded, stratified
VALID_FRACTION (`tokenization.labelled.load_labelled`, seed 0 whatever train.seed: every run of a
comparison probes the same rows).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..errors import ConfigError
from ..models.heads import mean_pool
from ..tokenization.batches import pad_rows
from ..tokenization.labelled import Columns, Examples, load_labelled
from ..tokenization.stdlib_topics import PREFIX as TOPICS
from ..tokenization.task_batches import encode_examples, layout_for
from ..tokenization.train import TfkitTokenizer
from ..trainer.distributed import DistInfo, all_reduce_sum

PROBE_TOKENS = 128  # a text's tokens at most (within the model's max_seq_len): topics' docstrings are shorter
PROBE_BATCH = 32  # rows per forward (the same batches in the loop and offline: the same features)
RIDGE = 1.0  # L2 penalty on the probe's weights over standardised features (scikit-learn's RidgeClassifier default)
VALID_FRACTION = 0.2  # held out of a file that has no split of its own
SEED = 0


@dataclass(frozen=True)
class ProbeSpec:
    """`eval.probe`: the labelled data and its columns."""

    data: str
    text: str | int = "text"
    label: str | int = "label"
    header: bool = True

    @classmethod
    def of(cls, probe: dict | str) -> ProbeSpec:
        return cls(probe) if isinstance(probe, str) else cls(**probe)


@dataclass(frozen=True)
class ProbeData:
    """The probe's rows, read and checked before any model is built: training and held-out examples."""

    spec: ProbeSpec
    train: Examples
    valid: Examples
    labels: tuple[str, ...]


def read_probe(spec: ProbeSpec) -> ProbeData:
    """The rows of `spec` (a DataError naming the file and what is missing, e.g. a column)."""
    train, valid = (f"{TOPICS}:train", f"{TOPICS}:valid") if spec.data == TOPICS else (spec.data, None)
    labelled = load_labelled(train, valid, columns=Columns(spec.text, None, spec.label), header=spec.header,
                             valid_fraction=VALID_FRACTION, seed=SEED)
    return ProbeData(spec, labelled.train, labelled.valid, tuple(labelled.labels or ()))


class Probe:
    """The probe's rows encoded for one model family and tokenizer (`encode` once per run), and its score."""

    def __init__(self, data: ProbeData, tokenizer: TfkitTokenizer, arch: str, max_seq_len: int,
                 type_vocab_size: int = 2) -> None:
        layout = layout_for(arch, tokenizer, pairs=False, type_vocab_size=type_vocab_size)
        if tokenizer.pad_id is None:
            raise ConfigError(f"eval.probe: tokenizer {tokenizer.path} has no padding token to batch rows with")
        self.data, self.arch, self.pad_id = data, arch, tokenizer.pad_id
        length = min(PROBE_TOKENS, max_seq_len)
        self.rows = [encode_examples(split.texts, None, tokenizer, layout, length).rows
                     for split in (data.train, data.valid)]
        self.targets = [torch.tensor(split.targets, dtype=torch.long) for split in (data.train, data.valid)]

    def score(self, model: nn.Module, info: DistInfo = DistInfo(), autocast: Callable = nullcontext) -> float:
        """Held-out accuracy of the probe fitted on `model`'s features; a collective under torchrun (each rank
        computes every world-th batch, the features are summed into place)."""
        was_training = model.training
        model.eval()
        try:
            train, valid = (features(model, rows, self.arch, self.pad_id, info, autocast) for rows in self.rows)
        finally:
            model.train(was_training)
        return fit_and_score(train, self.targets[0], valid, self.targets[1], len(self.data.labels))


@torch.inference_mode()
def features(model: nn.Module, rows: list[list[int]], arch: str, pad_id: int, info: DistInfo = DistInfo(),
             autocast: Callable = nullcontext) -> Tensor:
    """(N, C) float64: each row's mean final state, PROBE_BATCH rows a forward, this rank's batches only,
    all-reduced so that every rank holds all of them (zeros elsewhere: each sum has one term)."""
    device = next(model.parameters()).device
    out = torch.zeros(len(rows), model.config.d_model, dtype=torch.float64, device=device)  # (N, C)
    for k, lo in enumerate(range(0, len(rows), PROBE_BATCH)):
        if k % info.world_size != info.rank:
            continue
        batch = rows[lo:lo + PROBE_BATCH]
        ids, mask = pad_rows(batch, max(len(r) for r in batch), pad_id)  # (B, T) each
        ids, mask = ids.to(device), mask.to(device)
        with autocast():
            if arch == "bert":
                hidden = model.encode(ids, mask)  # (B, T, C)
            elif arch == "gpt":
                hidden = model(ids, attention_mask=mask, head=False)  # (B, T, C)
            else:
                hidden = model.encode(ids, mask)  # the encoder-decoder's encoder: (B, T, C)
        out[lo:lo + len(batch)] = mean_pool(hidden.float(), mask).double()  # (B, C)
    return all_reduce_sum(out, info).cpu()


def fit_and_score(x: Tensor, y: Tensor, x_valid: Tensor, y_valid: Tensor, classes: int) -> float:
    """Accuracy on (x_valid, y_valid) of a ridge classifier fitted on (x, y): features standardised by the
    training rows, a bias column, one-hot targets, weights from (XᵀX + RIDGE·I) W = XᵀY (the bias unpenalised)."""
    mean, std = x.mean(0), x.std(0).clamp(min=1e-12)  # (C,) each

    def design(f: Tensor) -> Tensor:
        return torch.cat([(f - mean) / std, torch.ones(f.shape[0], 1, dtype=f.dtype)], dim=1)  # (N, C + 1)

    a = design(x)
    targets = torch.nn.functional.one_hot(y, classes).double()  # (N, K)
    penalty = torch.eye(a.shape[1], dtype=a.dtype) * RIDGE
    penalty[-1, -1] = 0.0
    weights = torch.linalg.solve(a.T @ a + penalty, a.T @ targets)  # (C + 1, K)
    predicted = (design(x_valid) @ weights).argmax(-1)  # (M,)
    return float((predicted == y_valid).double().mean())


def probe_checkpoint(path: str, probe: dict | str, *, device: str | torch.device = "cpu",
                     dtype: str = "auto") -> dict:
    """`tfkit eval CKPT --probe DATA`: one results row, the probe's held-out accuracy on a finished checkpoint,
    in the precision it trained in (`auto`), as the training loop computed it."""
    from ..checkpoints.folders import read_checkpoint
    from ..checkpoints.record import CheckpointRecord
    from ..checkpoints.weights import load_with_tokenizer
    from ..runtime import check_precision, pick_device
    from ..trainer.optim import autocast_context
    from .evaluate import checkpoint_precision

    check_precision(dtype, allow_auto=True)
    device = pick_device(device) if isinstance(device, str) else device
    spec = ProbeSpec.of(probe)
    data = read_probe(spec)
    folder, (model, cfg, tokenizer) = read_checkpoint(path, lambda f: load_with_tokenizer(f, device=device))
    precision = checkpoint_precision(folder, CheckpointRecord.read(folder), dtype)
    scored = Probe(data, tokenizer, cfg.arch, cfg.max_seq_len, cfg.type_vocab_size)
    acc = scored.score(model, autocast=lambda: autocast_context(precision, device))
    return {"checkpoint": str(folder), "arch": cfg.arch, "probe": spec.data, "train_rows": len(data.train),
            "valid_rows": len(data.valid), "classes": len(data.labels), "acc": acc, "dtype": precision}
