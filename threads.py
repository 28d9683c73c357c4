"""How many CPU threads torch may use: no more than the cores that are free.

PyTorch starts one intra-op thread per core. Where other processes already keep those cores busy, the
threads wait for each other at every op and are descheduled in turn: beside two busy processes on a
2-core machine the quickstart ran 4-8x slower with two threads than with one. `auto` takes the cores this
process may run on (its CPU affinity) less the load of the last minute, at least one; a user's own
OMP_NUM_THREADS is kept as it is.
"""

from __future__ import annotations

import os

AUTO = "auto"


def auto_threads() -> int:
    """Cores this process may use that the last minute's load leaves free (at least 1)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    return max(1, min(cores, round(cores - load)))


def set_threads(setting: int | str = AUTO) -> int:
    """Apply `train.threads` (or a command's default, `auto`) to torch; returns the number in use."""
    import torch

    if setting == AUTO:
        if "OMP_NUM_THREADS" in os.environ:  # the user chose; torch already follows it
            return torch.get_num_threads()
        setting = auto_threads()
    if torch.get_num_threads() != int(setting):
        torch.set_num_threads(int(setting))
    return int(setting)
