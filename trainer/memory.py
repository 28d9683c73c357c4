"""The peak memory of a training run on each device, predicted from its keys before anything is built.

A run that does not fit should be refused before its first update, and a plan should only choose what fits,
so the estimate needs no torch and no model (`tfkit recipes validate` and `tfkit plan` use it as they are). It
is a stated formula, in bytes per device:

    peak = runtime + weights + gradients + optimizer state + slack x (activations + transient)

- weights: 4 bytes per parameter (fp32 master weights, whatever the autocast), and under bf16 / fp16 autocast
  2 more per block matrix (autocast keeps a low-precision copy of each weight for the forward);
- gradients: 4 per parameter; DDP adds its gradient buckets, 4 more;
- optimizer: AdamW's two moments, 8 per parameter; Muon's momentum, 4 per block matrix (AdamW's 8 for the rest);
- under FSDP2 (`train.distributed: fsdp`) the three above are divided across the W processes, and each holds
  whole, while it computes, the root's parameters (embeddings, head) and two blocks (the one computing and
  the one prefetched);
- activations: what autograd saves for the backward pass, per token of the micro-batch (this process's share
  of it), counted per layer in units of d_model (`LAYER_VALUES`): 6 d + 2 d_kv for attention and its norms, plus
  the feed-forward's (2 x d_ff with GELU, 1 x with ReLU, 4 x with SwiGLU), plus 2 d with RMSNorm or BatchNorm,
  2 d with dropout, 2 H T on the naive attention path, 3 H T with attention dropout; the cross-attention of a
  decoder layer 6 d + 2 d_kv more; then 2 d per token after the last layer (final norm) and, for the head,
  the fused loss's V x d weight gradient (or, with objective.fused_loss off, V values per predicted token).
  These counts are what `torch.autograd.graph.saved_tensors_hooks` reads in fp32, and a test checks them
  against it for every family (tests/test_plan_memory.py); under bf16 / fp16 autocast a layer's saved values
  are taken as 0.68 of their fp32 bytes (AUTOCAST_ACTIVATIONS: a reading of the saved tensors' dtypes, not
  yet checked against a bf16 run's peak). With `train.activation_checkpointing` a layer keeps only its input (d per
  token) and one layer's activations exist at a time, while it is recomputed. The compiled path is estimated
  as the eager one: inductor's partitioner saves at most what eager autograd does, so this is an upper bound;
- transient: what exists only for a moment at the peak: the head's logits (one chunk of rows with the fused
  loss, at most CHUNK_ELEMENTS values; all of them without it) and a layer's feed-forward gradient in the
  backward pass;
- runtime and slack: on a CPU the peak is the process's resident memory above what it held before the run
  (the interpreter and libraries are not the run's): the runtime's own buffers (the autograd engine, thread
  pools, kernels' scratch) and a whole `pretrain`'s data pipeline, tokenizer, checkpoint writer and the
  modules they import (RUNTIME_BYTES), and what the allocator keeps beside the activations it was asked for
  (SLACK, 1.18: set from single `measure_pace` readings before benchmarks/plan.py existed). RUNTIME_BYTES is
  fitted: the GPT rows of benchmarks/plan.py's first pass (their peaks were
  50-75 MiB above the formula with 90 MiB), whose BERT and encoder-decoder rows are the check. On a GPU the
  allocator's peak is counted (`torch.cuda.max_memory_allocated`, no runtime, no slack); the CUDA context
  (CUDA_CONTEXT) is kept free beside it when a run is checked against the device's memory.

benchmarks/plan.py compares this estimate with real runs (`tfkit pretrain`), in benchmarks/RESULTS.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..models.config import ModelConfig
from .resources import count_parameters

FP32 = 4
AUTOCAST_ACTIVATIONS = 0.68  # saved bytes of a layer under bf16 / fp16 autocast, over fp32 (saved-tensor count)
CHUNK_ELEMENTS = {"cpu": 2**22, "cuda": 2**24}  # the fused head's logits per chunk (fused_loss.CHUNK_ELEMENTS)
RUNTIME_BYTES = {"cpu": 140 * 2**20, "cuda": 0}  # fitted (module doc)
SLACK = {"cpu": 1.18, "cuda": 1.0}  # the allocator's bytes per activation byte (module doc)
CUDA_CONTEXT = 2**29  # the CUDA context and kernels, outside the allocator: kept free on a GPU
FFN_SAVED = {"gelu": 2, "gelu_tanh": 2, "relu": 1, "swiglu": 4}  # saved d_ff-wide values per token
MLM_HEAD_VALUES = 9  # per masked row, in units of d_model: the MLM head's transform before the vocabulary


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per device at the peak of an update (module doc)."""

    weights: int
    gradients: int
    optimizer: int
    activations: int  # saved for the backward pass and transient, with the allocator's slack
    runtime: int = 0

    @property
    def peak(self) -> int:
        return self.runtime + self.weights + self.gradients + self.optimizer + self.activations

    def line(self) -> str:
        parts = (("weights", self.weights), ("gradients", self.gradients), ("optimizer", self.optimizer),
                 ("activations", self.activations), ("runtime", self.runtime))
        return f"{gib(self.peak)} (" + ", ".join(f"{name} {gib(v)}" for name, v in parts) + ")"


def gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**28 else f"{n / 2**20:.0f} MiB"


@dataclass(frozen=True)
class Layout:
    """How the run lays the work out: what changes memory besides the model's shape."""

    micro_batch: int  # sequences per micro-batch on this device (train.batch_size / grad_accum / processes)
    seq_len: int  # data.seq_len (each of source and target for seq2seq)
    objective: str = "clm"  # clm | mlm | seq2seq | classify | regress
    optimizer: str = "adamw"  # adamw | muon
    precision: str = "fp32"  # fp32 | bf16 | fp16
    grad_accum: int = 1
    activation_checkpointing: bool = False
    processes: int = 1
    distributed: str = "ddp"  # ddp | fsdp (with processes > 1)
    fused_loss: bool = True  # objective.fused_loss as resolved for the device
    device: str = "cpu"  # cpu | cuda


def layer_values(cfg: ModelConfig, seq_len: int, cross: bool = False) -> float:
    """Values one layer saves for the backward pass, per token, in fp32 units (module doc)."""
    d, kv = cfg.d_model, cfg.kv_heads * cfg.head_dim
    values = 6 * d + 2 * kv + FFN_SAVED.get(cfg.activation, 2) * cfg.ffn_dim
    if cfg.norm != "layernorm":
        values += 2 * d
    if cfg.dropout > 0:
        values += 2 * d
    if cfg.attention == "naive":
        values += 2 * cfg.n_heads * seq_len
    elif cfg.attn_dropout > 0:  # SDPA with dropout on a CPU: the math path keeps the weights and their mask
        values += 3 * cfg.n_heads * seq_len
    if cross:
        values += 6 * d + 2 * kv
    return values


def block_matrix_params(cfg: ModelConfig) -> int:
    """The parameters of the blocks' weight matrices (what Muon steps and autocast copies)."""
    d, kv = cfg.d_model, cfg.kv_heads * cfg.head_dim
    per_block = 2 * d * d + 2 * d * kv + (3 if cfg.activation == "swiglu" else 2) * d * cfg.ffn_dim
    stacks = 2 if cfg.arch == "transformer" else 1
    cross = (2 * d * d + 2 * d * kv) if cfg.arch == "transformer" else 0
    return cfg.stored_layers * (stacks * per_block + cross)  # a shared block (model.share_layers) once


def activation_bytes(cfg: ModelConfig, layout: Layout) -> int:
    """Saved activations of one micro-batch on one device, bytes (module doc)."""
    tokens = layout.micro_batch * layout.seq_len  # per stack: the encoder-decoder has source and target
    scale = FP32 * (AUTOCAST_ACTIVATIONS if layout.precision in ("bf16", "fp16") else 1.0)
    if cfg.arch == "transformer":
        per_token = layer_values(cfg, layout.seq_len) + layer_values(cfg, layout.seq_len, cross=True)
        kept_per_token = 2 * cfg.d_model
    else:
        per_token = layer_values(cfg, layout.seq_len)
        kept_per_token = cfg.d_model
    if layout.activation_checkpointing:  # each layer's input kept, one layer's activations while it is recomputed
        layers = tokens * (cfg.n_layers * kept_per_token * FP32 + per_token * scale)
    else:
        layers = tokens * cfg.n_layers * per_token * scale
    return int(layers + head_bytes(cfg, layout, tokens))


def head_bytes(cfg: ModelConfig, layout: Layout, tokens: int) -> int:
    """What the final norms and the output head save: 2 d per token per stack, the head's own (module doc)."""
    stacks = 2 if cfg.arch == "transformer" else 1
    out = stacks * 2 * cfg.d_model * tokens * FP32
    if layout.objective in ("classify", "regress"):
        return out
    predicted = tokens * (0.15 if layout.objective == "mlm" else 1.0)
    if layout.objective == "mlm":
        out += predicted * MLM_HEAD_VALUES * cfg.d_model * FP32
    if layout.fused_loss and layout.objective != "mlm":
        return int(out + cfg.vocab_size * cfg.d_model * FP32)  # the weight's gradient, computed in the forward
    return int(out + predicted * cfg.vocab_size * FP32)  # the log-probabilities of every predicted row


def transient_bytes(cfg: ModelConfig, layout: Layout) -> int:
    """Memory that exists only around the peak: the head's logits, a layer's feed-forward gradient."""
    tokens = layout.micro_batch * layout.seq_len
    predicted = tokens * (0.15 if layout.objective == "mlm" else 1.0)
    if layout.objective in ("classify", "regress"):
        logits = 0
    elif layout.fused_loss and layout.objective != "mlm":
        chunk_rows = max(64, CHUNK_ELEMENTS.get(layout.device, CHUNK_ELEMENTS["cuda"]) // cfg.vocab_size)
        logits = min(predicted, chunk_rows) * cfg.vocab_size * FP32
    else:
        logits = predicted * cfg.vocab_size * FP32
    return int(logits + 2 * tokens * cfg.ffn_dim * FP32)


def estimate_memory(cfg: ModelConfig, layout: Layout) -> MemoryEstimate:
    """The peak of an update of `cfg` laid out as `layout`, per device (module doc)."""
    params = count_parameters(cfg)
    matrices = block_matrix_params(cfg)
    sharded = layout.processes > 1 and layout.distributed == "fsdp"
    shards = layout.processes if sharded else 1
    weights = FP32 * params / shards
    if sharded:  # the root's parameters and two blocks, whole, while they compute
        root = params - matrices * (1 if cfg.n_layers else 0)
        weights += FP32 * (root + 2 * matrices / max(cfg.stored_layers, 1))
    if layout.precision in ("bf16", "fp16"):
        weights += 2 * matrices / shards
    gradients = FP32 * params / shards
    if layout.processes > 1 and not sharded:
        gradients *= 2  # DDP's buckets
    if layout.optimizer == "muon":
        optimizer = FP32 * matrices + 2 * FP32 * (params - matrices)
    else:
        optimizer = 2 * FP32 * params
    device = "cpu" if layout.device == "cpu" else "cuda"
    activations = SLACK[device] * (activation_bytes(cfg, layout) + transient_bytes(cfg, layout))
    return MemoryEstimate(int(weights), int(gradients), int(optimizer / shards), int(activations),
                          RUNTIME_BYTES[device])
