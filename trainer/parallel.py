"""How the model is laid out for training: DDP or FSDP2 across processes, activation checkpointing.

`Parallel(mode, info)` owns every difference between the layouts, so the rest of the trainer asks it
instead of testing `(train.distributed, info.enabled)` itself:

| layout      | parameters, optimizer state           | gradients         | a checkpoint                          |
| ----------- | ------------------------------------- | ----------------- | ------------------------------------- |
| one process | whole                                 | local             | model.safetensors, trainer_state.pt   |
| DDP         | whole on every rank                   | all-reduced       | sharded: each rank writes a part      |
| FSDP2       | sharded, all-gathered block by block  | reduce-scattered  | sharded: each rank writes its shards  |

(The checkpoints themselves are checkpointer.py's and checkpoints/sharded.py's.)

Like torchtitan's `parallelize`, activation checkpointing is applied here too (the same unit, the
transformer block). The process group itself (ranks, devices, collectives) is `distributed`'s.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from ..checkpoints.trainer_state import load_optimizer_state_by_name, optimizer_state_by_name
from ..errors import ConfigError
from ..models.config import ModelConfig
from .distributed import DistInfo


@dataclass(frozen=True)
class Parallel:
    mode: str  # train.distributed: "ddp" or "fsdp"; moot in one process
    info: DistInfo

    @property
    def sharded(self) -> bool:
        """FSDP2 across several processes: each rank holds a shard of every parameter and its optimizer state."""
        return self.info.enabled and self.mode == "fsdp"

    def wrap(self, loss_module: nn.Module) -> nn.Module:
        """The module the loop calls: the LossModule itself in one process; DDP around it (replicated
        weights, all-reduced gradients); or, for FSDP2, the LossModule around a model whose blocks and root
        are `fully_shard`ed (parameters sharded across ranks, all-gathered block by block).

        FSDP2 hooks the forward of each sharded module; the MLM objective calls BERT's `encode` and
        `mlm_logits` instead, so those are registered as forward methods of the root (otherwise its
        parameters would stay sharded). Only those: registering a method that the model's own forward calls
        (the encoder-decoder's `encode`/`decode`) reshards the root when it returns, and the fused loss then
        meets a sharded LM head."""
        if not self.info.enabled:
            return loss_module
        if self.sharded:
            from torch.distributed.fsdp import register_fsdp_forward_method

            model = loss_module.model
            shard_blocks_and_root(model)
            if loss_module.objective.name == "mlm":  # mlm_loss calls these instead of forward
                for name in ("encode", "mlm_logits"):
                    register_fsdp_forward_method(model, name)
            return loss_module
        device_ids = [self.info.device.index] if self.info.device.type == "cuda" else None
        return nn.parallel.DistributedDataParallel(loss_module, device_ids=device_ids)

    def optimizer_state(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
        """The optimizer state keyed by parameter name, of a one-process run (several processes write theirs
        into a sharded checkpoint: checkpointer.py)."""
        return optimizer_state_by_name(model, optimizer)

    def load_optimizer(self, model: nn.Module, optimizer: torch.optim.Optimizer, sd: dict) -> None:
        """Inverse of `optimizer_state` (a single-file checkpoint resumed at any process count): every rank
        passes the full state, FSDP keeps each rank's shard."""
        if self.sharded:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

            set_optimizer_state_dict(model, optimizer, sd, options=StateDictOptions(full_state_dict=True))
            return
        load_optimizer_state_by_name(model, optimizer, sd)

    def full_weights(self, model: nn.Module, cfg: ModelConfig) -> nn.Module | None:
        """A module holding the full weights (to sample from at the end): the model itself, or under FSDP a
        CPU copy assembled from the shards on rank 0 (None on other ranks; a collective: every rank calls it),
        built on the meta device and given the gathered tensors: one copy of the weights."""
        if not self.sharded:
            return model
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        from ..checkpoints.meta import assign_weights, parameters_on_meta
        from ..models import build_model
        from ..models.heads import SequenceClassifier

        full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if not self.info.is_main:
            return None
        with parameters_on_meta():
            copy = build_model(cfg)
            if isinstance(model, SequenceClassifier):  # a fine-tuning run: the body and its head
                copy = SequenceClassifier(copy, model.head_config)
        assign_weights(copy, full, Path("(the run's shards)"), "the model")
        return copy


def check_one_process_keys(cfg: ModelConfig, world_size: int) -> None:
    """ConfigError for a model key that several processes do not train: a block shared across layers
    (`model.share_layers`). FSDP2 shards a block per `fully_shard` and gathers it around each forward, and the
    sharded checkpoints of several processes would hold the block under every layer's name; neither is tested
    with one module applied n_layers times, so it is refused before anything is written, not left to chance."""
    if world_size > 1 and cfg.share_layers:
        raise ConfigError(f"model.share_layers: a block shared across layers trains in one process only (FSDP2 and "
                          f"the sharded checkpoints of several processes are not built for it); got {world_size} "
                          "processes")


# --- what the loop and validation call on the wrapped module: they find the layout from the module itself ---

def no_grad_sync(module: nn.Module, skip: bool) -> contextlib.AbstractContextManager:
    """Skip the gradient all-reduce on every micro-batch but the last of an accumulation window."""
    if not skip:
        return contextlib.nullcontext()
    if isinstance(module, nn.parallel.DistributedDataParallel):
        return module.no_sync()
    model = getattr(module, "model", module)
    if hasattr(model, "set_requires_gradient_sync"):  # FSDP2 root
        return _fsdp_no_sync(model)
    return contextlib.nullcontext()


def reshard(module: nn.Module) -> None:
    """After a forward without backward (evaluation), put FSDP2's sharded parameters back in place.

    The FSDP2 root keeps its parameters unsharded after forward (they would be needed again right away
    by backward); with no backward they stay registered as plain unsharded tensors, and the optimizer,
    which holds the sharded ones, would no longer find them (e.g. when its state is saved)."""
    model = getattr(module, "model", module)
    if hasattr(model, "reshard") and hasattr(model, "set_requires_gradient_sync"):
        model.reshard()


@contextlib.contextmanager
def _fsdp_no_sync(module: nn.Module):
    module.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        module.set_requires_gradient_sync(True)


# --- activation checkpointing ----------------------------------------------------------------------------

def shard_blocks_and_root(model: nn.Module) -> None:
    """FSDP2 over the current process group: each transformer block its own unit (gathered one at a time),
    then the root (embeddings, head, final norm)."""
    from torch.distributed.fsdp import fully_shard

    for block in transformer_blocks(model):
        fully_shard(block)
    fully_shard(model)


def transformer_blocks(model: nn.Module) -> list[nn.Module]:
    """Every transformer block of a tfkit model (GPT/BERT blocks, encoder and decoder layers)."""
    from ..models.base import Block

    return [m for m in model.modules() if isinstance(m, Block)]


def apply_activation_checkpointing(model: nn.Module) -> int:
    """Recompute each block's activations during backward instead of storing them.

    Memory for activations drops from O(layers x tokens x width x ~10) to one block's worth plus the block
    inputs, for ~1/3 more compute. The block's `forward` is replaced on the instance, so parameter names
    and checkpoints are unchanged. Non-reentrant checkpointing replays dropout with the saved RNG state,
    so the gradients equal those of the plain forward. Returns the number of blocks wrapped."""
    from torch.utils.checkpoint import checkpoint

    blocks = transformer_blocks(model)
    for block in blocks:
        original = block.forward

        def checkpointed(*args, _forward=original, **kwargs):
            if not torch.is_grad_enabled():  # evaluation / generation: nothing to save memory for
                return _forward(*args, **kwargs)
            return checkpoint(_forward, *args, use_reentrant=False, **kwargs)

        block.forward = checkpointed
    return len(blocks)
