"""The machine a command computes on: the one place a device name and a precision are decided, and the
memory a process may use.

A device is `auto` (CUDA when there is a GPU, else the CPU), `cpu`, `cuda` or `cuda:N`; asking for CUDA
where there is none is an error rather than a silent CPU run. A precision is `fp32`, `bf16` or `fp16`, and
where a command allows it `auto`, which that command resolves from what it knows (eval: the precision the
checkpoint trained in). Errors name the parameter or recipe key the value came from (`device`, which a
command spells `--device`; `train.device`), so every command reads the same. torch is imported inside
the functions: the CLI's `--help` must not pay for it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import ConfigError

if TYPE_CHECKING:
    import torch

AUTO = "auto"
PRECISIONS = ("fp32", "bf16", "fp16")


def check_device(name: str, option: str = "device") -> str:
    """`name` when it is a device name (auto, cpu, cuda, cuda:N), else an error naming `option`. Needs no
    torch, so a recipe is checked as quickly as `tfkit recipes validate` must be."""
    if not (name in (AUTO, "cpu", "cuda") or (name.startswith("cuda:") and name[5:].isdigit())):
        raise ConfigError(f"{option}: got {name!r}, expected auto, cpu, cuda or cuda:N", params=(option,))
    return name


def pick_device(name: str, option: str = "device") -> torch.device:
    """The torch device `name` means on this machine (module doc); `option` is where it came from."""
    import torch

    check_device(name, option)
    if name == AUTO:
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"{option}: {name!r} requested but CUDA is not available (use auto or cpu)", params=(option,))
    return torch.device(name)


def check_precision(name: str, option: str = "dtype", allow_auto: bool = False) -> str:
    """`name` when it is a precision this command takes (`auto` only where `allow_auto`), else an error."""
    allowed = ((AUTO,) if allow_auto else ()) + PRECISIONS
    if name not in allowed:
        raise ConfigError(f"{option}: got {name!r}, expected one of {', '.join(allowed)}", params=(option,))
    return name


def torch_dtype(precision: str) -> torch.dtype:
    """The torch dtype of a precision name (fp32 / bf16 / fp16)."""
    import torch

    return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[check_precision(precision)]


def machine_memory() -> int:
    """Bytes of memory this process may use: the physical memory, or a smaller cgroup limit."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for limit_file in (Path("/sys/fs/cgroup/memory.max"), Path("/sys/fs/cgroup/memory/memory.limit_in_bytes")):
        try:
            text = limit_file.read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            total = min(total, int(text))
    return total


MMAP_THRESHOLD = 4 << 20  # bytes: allocations from this size on get pages of their own, returned when freed
M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number (malloc.h)


def return_large_frees() -> bool:
    """Make memory freed in large blocks go back to the system at once (glibc's `mallopt(M_MMAP_THRESHOLD)`;
    nothing elsewhere); returns whether it was set.

    glibc raises its mmap threshold to the size of each large block freed (up to 32 MiB), and serves later
    blocks below it from heaps that keep what is freed as the process's resident memory. FSDP2 all-gathers a
    block's parameters and frees them again at every layer, forward and backward: measured on 2 CPU processes
    (benchmarks/memory.py, an 85M GPT), resident memory grew by 0.9 GB of freed blocks per process during
    the first update, 1.87 GB at its peak against 1.17 GB with a fixed 4 MiB threshold. A fixed threshold
    also ends the dynamic one, so the same holds for the whole run."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    try:
        mallopt = getattr(ctypes.CDLL(name), "mallopt", None) if name else None
    except OSError:
        return False
    return bool(mallopt is not None and mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD))
