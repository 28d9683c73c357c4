"""Process groups, devices and model wrapping for data-parallel training under `torchrun`.

`torchrun --nproc_per_node N -m tfkit pretrain ...` sets RANK / WORLD_SIZE / LOCAL_RANK; without them
tfkit trains in one process and every helper here degrades to a no-op, so the training loop has a
single code path. Every rank runs the same loop on its slice of the same global batch (the datasets
hand out slices by rank), gradients are averaged by DDP (or reduce-scattered by FSDP2), and only rank 0
writes files.
"""

from __future__ import annotations

import contextlib
import datetime
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from ..errors import ConfigError


@dataclass
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def pick_device(preference: str, local_rank: int = 0) -> torch.device:
    """`auto` = this rank's GPU when CUDA is available, else the CPU; `cuda` without one is an error."""
    if preference == "auto":
        preference = "cuda" if torch.cuda.is_available() else "cpu"
    if preference.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ConfigError(f"train.device: {preference!r} requested but CUDA is not available "
                              "(use auto or cpu)")
        index = int(preference.split(":")[1]) if ":" in preference else local_rank
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    return torch.device("cpu")


def init_distributed(device_preference: str) -> DistInfo:
    """Join the process group when launched by torchrun: nccl on GPUs, gloo on CPUs."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local_rank = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    if world > 1 and device_preference.startswith("cuda:"):
        raise ConfigError(f"train.device: {device_preference!r} would put all {world} torchrun processes on one "
                          "GPU; use cuda or auto (each process takes the GPU of its LOCAL_RANK)")
    device = pick_device(device_preference, local_rank)
    if world > 1 and not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, timeout=datetime.timedelta(minutes=30),
                                device_id=device if device.type == "cuda" else None)
    return DistInfo(rank, world, local_rank, device)


def shutdown(info: DistInfo) -> None:
    if info.enabled and dist.is_initialized():
        dist.destroy_process_group()


def barrier(info: DistInfo) -> None:
    """Wait for every rank (used after rank 0 prepares the tokenizer and the token shards)."""
    if info.enabled:
        dist.barrier()


def all_reduce_sum(values: torch.Tensor, info: DistInfo) -> torch.Tensor:
    """Sum a float64 vector of scalars (loss sums, token counts, accuracy) over ranks in one collective.

    On GPUs the values stay on the device (nccl reduces device memory), so nothing waits for them here;
    the caller reads the result when it needs it. gloo reduces on the CPU."""
    if not info.enabled:
        return values
    device = info.device if info.device.type == "cuda" else torch.device("cpu")
    t = values.to(device=device, dtype=torch.float64)
    dist.all_reduce(t)
    return t


def broadcast_object(obj, info: DistInfo):
    """Rank 0's value of a small picklable object on every rank (e.g. the run folder path)."""
    if not info.enabled:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def transformer_blocks(model: nn.Module) -> list[nn.Module]:
    """Every transformer block of a tfkit model (GPT/BERT blocks, encoder and decoder layers)."""
    from ..models.transformer import Block

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


def wrap(loss_module: nn.Module, mode: str, info: DistInfo) -> nn.Module:
    """The module the loop calls: the LossModule itself in one process; DDP around it (replicated weights,
    all-reduced gradients); or, for FSDP2, the LossModule around a model whose blocks and root are
    `fully_shard`ed (parameters sharded across ranks, all-gathered block by block).

    FSDP2 hooks the forward of each sharded module; the MLM objective calls BERT's `encode` and `mlm_logits`
    instead, so those are registered as forward methods of the root (otherwise its parameters would stay
    sharded). Only those: registering a method that the model's own forward calls (the encoder-decoder's
    `encode`/`decode`) reshards the root when it returns, and the fused loss then meets a sharded LM head."""
    if not info.enabled:
        return loss_module
    if mode == "fsdp":
        from torch.distributed.fsdp import fully_shard, register_fsdp_forward_method

        model = loss_module.model
        for block in transformer_blocks(model):
            fully_shard(block)
        fully_shard(model)
        if model.config.arch == "bert":  # mlm_loss calls these instead of forward
            for name in ("encode", "mlm_logits"):
                register_fsdp_forward_method(model, name)
        return loss_module
    device_ids = [info.device.index] if info.device.type == "cuda" else None
    return nn.parallel.DistributedDataParallel(loss_module, device_ids=device_ids)


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
