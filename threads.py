"""How many CPU threads torch may use: no more than the cores that are free.

PyTorch starts one intra-op thread per core. Where other processes already keep those cores busy, the
threads wait for each other at every op and are descheduled in turn: beside two busy processes on a
2-core machine the quickstart ran 4-8x slower with two threads than with one. On an idle one, two threads
ran it 1.7x faster than one. So `auto` measures what is free now: the share of the machine's CPU time
that was idle over a fifth of a second (`/proc/stat`, while this process sleeps), times its cores, within
the cores this process may run on. The 1-minute load average is no guide here: it still counts a command
that finished seconds ago. A user's own OMP_NUM_THREADS is kept as it is.
"""

from __future__ import annotations

import os
import time

AUTO = "auto"
SAMPLE_SECONDS = 0.2


def _cpu_times() -> tuple[int, int]:
    """(idle, total) CPU time of the whole machine so far, from the first line of /proc/stat."""
    with open("/proc/stat", encoding="ascii") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    return fields[3] + fields[4], sum(fields[:8])  # idle + iowait; user .. steal


def free_cores() -> float:
    """Cores the other processes leave idle right now (the load average where /proc/stat is missing)."""
    cores = os.cpu_count() or 1
    try:
        idle_before, total_before = _cpu_times()
        time.sleep(SAMPLE_SECONDS)
        idle_after, total_after = _cpu_times()
    except (OSError, ValueError, IndexError):
        return cores - (os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0)
    return cores * (idle_after - idle_before) / max(total_after - total_before, 1)


def auto_threads() -> int:
    """Free cores among those this process may use (its CPU affinity), at least 1."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(usable, round(free_cores())))


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
