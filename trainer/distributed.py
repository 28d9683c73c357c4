"""Process groups, devices and collectives for data-parallel training under `torchrun`.

`torchrun --nproc_per_node N -m tfkit pretrain ...` sets RANK / WORLD_SIZE / LOCAL_RANK; without them
tfkit trains in one process and every helper here degrades to a no-op, so the training loop has a
single code path. Every rank runs the same loop on its slice of the same global batch (the datasets
hand out slices by rank), gradients are averaged by DDP (or reduce-scattered by FSDP2), and only rank 0
writes files. How the model is wrapped for that is `parallel`'s concern.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from .. import runtime
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
    """runtime.pick_device's device for `train.device`, where `cuda` (or `auto` on a GPU) means this rank's
    GPU, the one of its LOCAL_RANK, made the current device."""
    device = runtime.pick_device(preference, "train.device")
    if device.type == "cuda":
        device = torch.device("cuda", local_rank if device.index is None else device.index)
        torch.cuda.set_device(device)
    return device


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
