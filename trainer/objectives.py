"""Training objectives: one function from (model, batch) to a summed loss and an accuracy count.

The loss is returned as a *sum* over predicted tokens, not a mean. Gradient accumulation and data
parallelism split one global batch into pieces, and the only way the pieces add up to exactly the
gradient of the whole batch is to divide every piece by the token count of the *whole* batch (MLM
micro-batches hold different numbers of masked tokens, so averaging per-piece means would weight tokens
unequally). The training loop knows that global count before the forward pass (`count_targets`), so it
does the division; the objectives stay oblivious of how the batch was split.

Batches follow the contract in ARCHITECTURE.md: `labels` is -100 wherever nothing is predicted.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..models.heads import classifier_inputs
from .fused_loss import linear_cross_entropy, use_fused_loss
from .recipe import ObjectiveSection

IGNORE = -100


@dataclass
class LossOutput:
    loss_sum: Tensor  # () float: summed (label-smoothed) cross-entropy over predicted tokens
    correct: Tensor  # () int: predicted tokens whose argmax equals the label
    count: Tensor  # () int: predicted tokens (labels != -100)

    @property
    def loss(self) -> Tensor:
        """Mean loss per predicted token (what a single-batch caller wants)."""
        return self.loss_sum / self.count.clamp(min=1)


def count_targets(batch: dict[str, Tensor]) -> int:
    """Predicted tokens in a batch, known before any forward pass; a task batch's `labels (B,)` are one
    target per row (a regression target may be any float, -100 too)."""
    if batch["labels"].dim() == 1:
        return batch["labels"].numel()
    return int((batch["labels"] != IGNORE).sum())


def count_inputs(batch: dict[str, Tensor]) -> int:
    """Tokens the model reads, for tokens/s in training and eval alike: every position of packed CLM/MLM
    rows (sliding windows count their right padding too); the real source and target tokens of seq2seq
    pairs, whose padding (often most of a row) is not text."""
    if "src_ids" in batch:
        return int(batch["src_mask"].sum() + batch["tgt_mask"].sum())
    return int(batch["input_ids"].numel())


def _token_loss(logits: Tensor, labels: Tensor, label_smoothing: float) -> LossOutput:
    """Cross-entropy and accuracy of `logits (N, V)` against `labels (N,)`, skipping -100."""
    loss_sum = F.cross_entropy(logits, labels, ignore_index=IGNORE, reduction="sum",
                               label_smoothing=label_smoothing)
    valid = labels != IGNORE
    correct = ((logits.argmax(dim=-1) == labels) & valid).sum()
    return LossOutput(loss_sum, correct, valid.sum())


def _head_loss(hidden: Tensor, head: nn.Linear, labels: Tensor, label_smoothing: float) -> LossOutput:
    """`_token_loss(head(hidden), labels)` with the head fused into the loss: hidden (N, C), labels (N,).

    The (N, V) logits, their log-probs and their gradient never exist at once (trainer/fused_loss.py);
    on the tiny GPT this was ~73% of a training step. Same loss sum, correct count and gradients."""
    loss_sum, correct = linear_cross_entropy(hidden, head.weight, head.bias, labels, label_smoothing)
    return LossOutput(loss_sum, correct, (labels != IGNORE).sum())


def _packing(batch: dict[str, Tensor]) -> dict[str, Tensor]:
    """The document layout of packed rows, when the batch has one (`data.document_mask`): doc_ids (B, T)
    and, with `data.reset_positions`, position_ids (B, T)."""
    return {k: batch[k] for k in ("doc_ids", "position_ids") if k in batch}


def clm_loss(model: nn.Module, batch: dict[str, Tensor], label_smoothing: float = 0.0,
             fused: bool = True) -> LossOutput:
    """Causal LM: predict token t+1 from tokens <= t over packed blocks (labels are pre-shifted).

    fused=False computes the (B, T, V) logits and `F.cross_entropy`, the reference the fused path is tested
    against."""
    labels = batch["labels"].flatten()  # (B*T,)
    if not fused:
        logits = model(batch["input_ids"], attention_mask=batch.get("attention_mask"), **_packing(batch))  # (B, T, V)
        return _token_loss(logits.flatten(0, 1), labels, label_smoothing)
    hidden = model(batch["input_ids"], attention_mask=batch.get("attention_mask"), head=False,
                   **_packing(batch))  # (B, T, C)
    return _head_loss(hidden.flatten(0, 1), model.lm_head, labels, label_smoothing)


def mlm_loss(model: nn.Module, batch: dict[str, Tensor], label_smoothing: float = 0.0) -> LossOutput:
    """Masked LM: encode everything, then run the vocabulary head only on the masked rows.

    Only ~15% of positions carry a label, and the head (a D x V matmul plus its transform) is the most
    expensive layer of a small BERT; gathering the masked rows first skips ~85% of that work and of the
    (B, T, V) logits memory, with a loss identical to computing every logit and masking afterwards.

    The rows are gathered at `mlm_positions (B, K)` (MlmDataset's, K fixed by the shape; padding slots have
    label -100), so no shape depends on the data: no host sync, one compiled graph. A batch with `labels`
    only (made by hand) gathers `hidden[labels != -100]` instead, whose size the host must read."""
    hidden = model.encode(batch["input_ids"], attention_mask=batch.get("attention_mask"),
                          token_type_ids=batch.get("token_type_ids"), **_packing(batch))  # (B, T, D)
    if "mlm_positions" in batch:
        positions = batch["mlm_positions"]  # (B, K)
        rows = hidden.gather(1, positions[:, :, None].expand(-1, -1, hidden.shape[-1]))  # (B, K, D)
        return _token_loss(model.mlm_logits(rows.flatten(0, 1)), batch["mlm_labels"].flatten(),
                           label_smoothing)  # (B*K, V) logits
    labels = batch["labels"]  # (B, T)
    masked = labels != IGNORE
    logits = model.mlm_logits(hidden[masked])  # (N, V), N = masked tokens
    return _token_loss(logits, labels[masked], label_smoothing)


def seq2seq_loss(model: nn.Module, batch: dict[str, Tensor], label_smoothing: float = 0.0,
                 fused: bool = True) -> LossOutput:
    """Encoder-decoder: teacher forcing, the decoder sees the gold target shifted right (tgt_ids).
    fused as in `clm_loss`."""
    labels = batch["labels"].flatten()  # (B*T_tgt,)
    out = model(batch["src_ids"], batch["tgt_ids"], src_mask=batch.get("src_mask"), tgt_mask=batch.get("tgt_mask"),
                head=not fused)  # (B, T_tgt, V) logits, or (B, T_tgt, C) decoder states when fused
    if not fused:
        return _token_loss(out.flatten(0, 1), labels, label_smoothing)
    return _head_loss(out.flatten(0, 1), model.lm_head, labels, label_smoothing)


def task_loss(model: nn.Module, batch: dict[str, Tensor], regression: bool,
              label_smoothing: float = 0.0) -> LossOutput:
    """Fine-tuning (objective classify / regress): a `SequenceClassifier`'s logits (B, N) against one
    target per row, summed like the token losses (cross-entropy, or squared error; no accuracy for a
    regression)."""
    labels = batch["labels"]  # (B,) class ids or float targets
    logits = model(**classifier_inputs(batch))  # (B, N), padded or packed rows
    count = torch.full((), labels.shape[0], dtype=torch.long, device=labels.device)
    if regression:
        loss_sum = F.mse_loss(logits.squeeze(-1).float(), labels.float(), reduction="sum")
        return LossOutput(loss_sum, torch.zeros((), dtype=torch.long, device=labels.device), count)
    loss_sum = F.cross_entropy(logits.float(), labels, reduction="sum", label_smoothing=label_smoothing)
    return LossOutput(loss_sum, (logits.argmax(dim=-1) == labels).sum(), count)


def unreached_parameters(model: nn.Module, objective: str) -> list[nn.Parameter]:
    """Parameters an objective never computes with: BERT's pooler (trained by next-sentence prediction,
    which tfkit's MLM pretraining leaves out, as RoBERTa does), and a classifier body's pretraining head
    (`SequenceClassifier.unused_parameters`). The trainer freezes them, because DDP waits for a gradient
    of every trainable parameter and would otherwise fail on the first step."""
    if objective in ("classify", "regress"):
        return model.unused_parameters()
    if objective == "mlm" and isinstance(getattr(model, "pooler", None), nn.Module):
        return list(model.pooler.parameters())
    return []


def freeze_unreached(model: nn.Module, objective: str) -> None:
    """requires_grad off for `unreached_parameters`: no optimizer state, no DDP bucket waits for them."""
    for param in unreached_parameters(model, objective):
        param.requires_grad_(False)


OBJECTIVES = {"clm": clm_loss, "mlm": mlm_loss, "seq2seq": seq2seq_loss}


def compute_loss(model: nn.Module, batch: dict[str, Tensor], objective: ObjectiveSection) -> LossOutput:
    """The objective named in the recipe applied to one batch; `objective.fused_loss` picks the output head
    of clm and seq2seq for the batch's device (fused_loss.use_fused_loss)."""
    if objective.name == "mlm":
        return mlm_loss(model, batch, objective.label_smoothing)
    if objective.name in ("classify", "regress"):
        return task_loss(model, batch, objective.name == "regress", objective.label_smoothing)
    fused = use_fused_loss(objective.fused_loss, batch["labels"].device)
    return OBJECTIVES[objective.name](model, batch, objective.label_smoothing, fused=fused)


class LossModule(nn.Module):
    """`model` + objective as one module whose forward returns the loss.

    DDP and FSDP hook the *forward* of the module they wrap; calling `model.encode` / `model.mlm_logits`
    on a wrapped BERT would bypass those hooks (no gradient sync, no parameter all-gather). Wrapping this
    module instead puts the whole objective behind one forward. It owns `model` as its only child, so its
    state dict is the model's with a `model.` prefix, and checkpoints are written from `model` itself.
    """

    def __init__(self, model: nn.Module, objective: ObjectiveSection) -> None:
        super().__init__()
        self.model = model
        self.objective = objective

    def forward(self, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor, Tensor]:
        # Label smoothing shapes training only: evaluation reports the true cross-entropy, so a
        # validation perplexity means the same thing with or without it.
        objective = self.objective if self.training else dataclasses.replace(self.objective, label_smoothing=0.0)
        out = compute_loss(self.model, batch, objective)
        return out.loss_sum, out.correct, out.count


def move_batch(batch: dict[str, Tensor], device: torch.device) -> dict[str, Tensor]:
    """Copy a batch to the training device. On CUDA it goes through pinned (page-locked) host memory, so the
    copy is asynchronous and the host goes on launching the forward pass (the training loop's batches come
    pinned already, from its loader thread: data.Prefetcher)."""
    if device.type != "cuda":
        return {k: v.to(device) for k, v in batch.items()}
    return {k: v.pin_memory().to(device, non_blocking=True) for k, v in batch.items()}


DYNAMO_SETTINGS = {"capture_dynamic_output_shape_ops": True}  # what the loss module's graphs are traced with


def compile_loss_module(module: LossModule) -> None:
    """`torch.compile` the model and its objective in place, as one graph per mode (train / eval).

    MlmDataset's batches gather a fixed number of rows (`mlm_positions`), one static shape. A batch made
    by hand, with labels only, gathers `hidden[masked]`, whose count depends on the data: by default dynamo
    stops the graph at such an op, runs it eagerly and resumes in a new graph compiled for that count
    (three graphs and a recompilation as the count changes). Capturing data-dependent output sizes
    symbolically keeps even that objective one graph that serves every count.

    That setting (DYNAMO_SETTINGS) is this module's alone: dynamo reads its config when it traces, which is
    inside a call of the compiled module (the first, eval mode's first, any retrace), so it is patched around
    each call rather than set for the process, and a later `torch.compile` in the same process (`generate
    --compile`, a user's own code) compiles with dynamo's defaults."""
    module.compile()
    compiled = module._compiled_call_impl  # what nn.Module.__call__ runs once the module is compiled

    def call(*args, **kwargs):
        with torch._dynamo.config.patch(DYNAMO_SETTINGS):
            return compiled(*args, **kwargs)

    module._compiled_call_impl = call
