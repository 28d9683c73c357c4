"""Process groups, devices and collectives for data-parallel training under `torchrun`.

`torchrun --nproc_per_node N -m tfkit pretrain ...` sets RANK / WORLD_SIZE / LOCAL_RANK; without them
tfkit trains in one process and every helper here degrades to a no-op, so the training loop has a
single code path. Every rank runs the same loop on its slice of the same global batch (the datasets
hand out slices by rank), gradients are averaged by DDP (or reduce-scattered by FSDP2), and only rank 0
writes files. How the model is wrapped for that is `parallel`'s concern.
"""

from __future__ import annotations

import datetime
import hashlib
import os
import socket
import time
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


COLLECTIVE_TIMEOUT = datetime.timedelta(minutes=30)  # a collective's wait (rank 0 tokenizes while the others wait)
JOIN_TIMEOUT = datetime.timedelta(minutes=10)  # joining the group: torchrun's own rendezvous waits as long


def init_distributed(device_preference: str) -> DistInfo:
    """Join the process group when launched by torchrun: nccl on GPUs, gloo on CPUs. A group that cannot be
    joined (the rendezvous endpoint unreachable, or the other processes never came) is one line naming the
    endpoint, not a stack of store errors."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local_rank = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    if world > 1 and device_preference.startswith("cuda:"):
        raise ConfigError(f"train.device: {device_preference!r} would put all {world} torchrun processes on one "
                          "GPU; use cuda or auto (each process takes the GPU of its LOCAL_RANK)")
    device = pick_device(device_preference, local_rank)
    if world > 1 and not dist.is_initialized():
        runtime.return_large_frees()  # several processes share the host's memory: freed blocks go back to it
        _join(rank, world, device)
    return DistInfo(rank, world, local_rank, device)


def _join(rank: int, world: int, device: torch.device) -> None:
    endpoint = f"{os.environ.get('MASTER_ADDR', '?')}:{os.environ.get('MASTER_PORT', '?')}"
    agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"  # torchrun's agent holds the store
    hosts = rank == 0 and not agent
    if not hosts and "MASTER_ADDR" in os.environ and not _reachable(endpoint):
        raise ConfigError(f"rank {rank} of {world} could not reach the process group's endpoint {endpoint} "
                          f"(MASTER_ADDR:MASTER_PORT) within {JOIN_TIMEOUT.total_seconds():.0f} s; check that rank 0 "
                          "runs there and that this node reaches it (firewall, the address of another network)")
    try:
        # as torch's env:// rendezvous makes it (a client of torchrun's agent store, or rank 0's), but joined
        # within JOIN_TIMEOUT rather than the collectives' half hour
        store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
                              is_master=hosts, timeout=JOIN_TIMEOUT, wait_for_workers=False,
                              multi_tenant=not agent)
        generation = _generation(store) if agent else None
        prefixed = dist.PrefixStore("default_pg" if generation is None else f"tfkit-{generation}/default_pg", store)
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", store=prefixed,
                                rank=rank, world_size=world, timeout=COLLECTIVE_TIMEOUT,
                                device_id=device if device.type == "cuda" else None)
        if generation is not None and rank == 0:  # every rank has read it (they all joined): the next group's
            store.set(GENERATION, str(generation + 1))
        store.set_timeout(COLLECTIVE_TIMEOUT)
    except (KeyError, ValueError) as exc:
        raise ConfigError(f"WORLD_SIZE={world} but MASTER_ADDR / MASTER_PORT are not set ({exc}); launch with "
                          "torchrun, which sets them") from None
    except (RuntimeError, dist.DistError) as exc:  # DistNetworkError, DistStoreError: timeouts and refusals
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"rank {rank} of {world} could not join the process group at {endpoint} "
                          f"(MASTER_ADDR:MASTER_PORT) within {JOIN_TIMEOUT.total_seconds():.0f} s: {first[:200]}; "
                          "check that every node reaches that endpoint and starts as many processes") from None


GENERATION = "tfkit-generation"  # the agent store's key: how many groups of this run's workers have formed


def _generation(store) -> int:
    """The number of this run's groups formed before, read from torchrun's agent store, whose keys outlive the
    workers: a group torchrun restarts must not read the addresses the last one left there (its ranks would
    connect to dead processes and wait for ever). Not TORCHELASTIC_RESTART_COUNT, which counts each node's own
    failures: after one node's worker dies, the nodes restart with different counts."""
    return int(store.get(GENERATION)) if store.check([GENERATION]) else 0


def _reachable(endpoint: str) -> bool:
    """Whether a TCP connection to HOST:PORT opens within JOIN_TIMEOUT (tried every half second): asked before
    torch's store client, which logs a C++ stack for every refused attempt."""
    host, _, port = endpoint.rpartition(":")
    deadline = time.monotonic() + JOIN_TIMEOUT.total_seconds()
    while True:
        try:
            socket.create_connection((host, int(port)), timeout=2).close()
            return True
        except (OSError, ValueError):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.5)


def same_everywhere(text: str, what: str, info: DistInfo) -> None:
    """Refuse a run whose ranks disagree on `text` (the recipe), naming the ranks that differ from rank 0:
    each rank compares a hash of its own with every other's, so every rank stops with the same line."""
    if not info.enabled:
        return
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    hashes: list[str | None] = [None] * info.world_size
    dist.all_gather_object(hashes, digest)
    differ = [r for r, h in enumerate(hashes) if h != hashes[0]]
    if differ:
        raise ConfigError(f"{what}: rank{'s' * (len(differ) > 1)} {', '.join(map(str, differ))} of {info.world_size} "
                          f"{'run' if len(differ) > 1 else 'runs'} another {what} than rank 0 (hash {hashes[differ[0]]} "
                          f"against {hashes[0]}); every process of a run must be given the same recipe and overrides")


def async_group(info: DistInfo):
    """A gloo process group of its own for torch.distributed.checkpoint's background writes (train.async_save):
    its collectives then never interleave with the training's (a collective; every rank calls it)."""
    return dist.new_group(backend="gloo") if info.enabled else None


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
