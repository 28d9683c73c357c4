"""Where the time of one training step goes: the top kernels by their own time, from `torch.profiler`.

A ratio against a baseline says how far a step is from a goal, not why; the benchmark's `--profile` prints
this table once per train case so the next change aims at the kernels that take the time (matrix products,
attention, the fused loss, the optimizer, elementwise glue, launch gaps).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.profiler import ProfilerActivity, profile

from .common import sync


def top_kernels(step: Callable[[], object], device: torch.device, calls: int = 3, rows: int = 15) -> str:
    """A table of the `rows` kernels (CUDA) or operators (CPU) with the most self time over `calls` steps,
    each with its share of the total; the step is called once first so no compilation is profiled."""
    step()
    sync(device)
    on_gpu = device.type == "cuda"
    activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA] if on_gpu else [ProfilerActivity.CPU]
    with profile(activities=activities) as prof:
        for _ in range(calls):
            step()
        sync(device)

    def own(event) -> float:
        return event.self_device_time_total if on_gpu else event.self_cpu_time_total

    events = [e for e in prof.key_averages() if own(e) > 0]
    if on_gpu:  # a kernel has device time and no CPU time of its own; an operator's time is its kernels'
        events = [e for e in events if e.self_cpu_time_total == 0] or events
    total = sum(own(e) for e in events) or 1.0
    lines = [f"{'ms per step':>11}  {'share':>6}  {'calls':>5}  name",
             *(f"{own(e) / 1000 / calls:11.3f}  {100 * own(e) / total:5.1f}%  {e.count // calls:5d}  {e.key[:90]}"
               for e in sorted(events, key=own, reverse=True)[:rows]),
             f"{total / 1000 / calls:11.3f}  100.0%         all {len(events)} {'kernels' if on_gpu else 'operators'}"]
    return "\n".join(lines)
