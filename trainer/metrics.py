"""Where training numbers go: `metrics.jsonl` (always), TensorBoard (when installed), W&B (`log.wandb`,
`trackers.py`), `loss.png` at the end.

`metrics.jsonl` is the record of truth: one JSON object per line, flushed as written, readable by
anything. Training rows carry `step, loss, accuracy, lr, grad_norm, tokens, tokens_per_sec` (+ `mfu` on
GPUs); validation rows carry `step, val_loss, val_accuracy, val_ppl`, and with eval.tasks / eval.probe
`task/NAME/METRIC` and `tokens` (trainer/downstream.py). On resume, rows logged after the
checkpoint (by the run that died) are dropped, so the file reads as one uninterrupted run.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from ..checkpoints.run_record import read_metrics
from ..files import write_atomic
from .task_curves import draw_task_panel, token_curves
from .trackers import WandbTracker

# Dense bf16 tensor-core peak FLOP/s per GPU (vendor data sheets, without sparsity), matched by
# substring of torch.cuda.get_device_name(); the first match wins, so specific names come first.
PEAK_BF16_FLOPS: list[tuple[str, float]] = [
    ("H200", 989e12),  # H200 SXM
    ("H100 NVL", 835e12),
    ("H100 PCIe", 756e12),
    ("H100", 989e12),  # H100 SXM5
    ("A100", 312e12),
    ("L40S", 362e12),
    ("L40", 181e12),  # before "L4", which it contains
    ("L4", 121e12),
    ("A10", 125e12),
    ("RTX 4090", 165e12),
    ("RTX 3090", 71e12),
]


def peak_flops(device_name: str, precision: str = "bf16") -> float | None:
    """Peak FLOP/s of a GPU for the run's matmuls, None when unknown (MFU is then not reported).

    bf16 and fp16 run at the PEAK_BF16_FLOPS rate; fp32 training runs its matmuls as TF32 (trainer.run
    enables it on CUDA), whose dense tensor-core peak is half the bf16 one on every GPU listed."""
    for key, flops in PEAK_BF16_FLOPS:
        if key in device_name:
            return flops / 2 if precision == "fp32" else flops
    return None


def mfu(flops_per_token: float, tokens_per_sec: float, peak: float | None, world_size: int) -> float | None:
    """Model FLOPs utilisation: achieved training FLOP/s over the peak of every GPU in the job."""
    if not peak:
        return None
    return flops_per_token * tokens_per_sec / (peak * world_size)


class MetricsWriter:
    """Appends rows to metrics.jsonl and mirrors them to TensorBoard and a tracker. Only rank 0 gets an enabled one."""

    def __init__(self, run_dir: Path, enabled: bool, tensorboard: bool, resume_step: int | None = None,
                 tracker: WandbTracker | None = None) -> None:
        """`tracker` (trainer/trackers.py: W&B) receives every row written and is closed with the file."""
        self.enabled = enabled
        self.path = run_dir / "metrics.jsonl"
        self._tb = None
        self._tracker = tracker
        if not enabled:
            return
        if resume_step is not None:
            truncate_after(self.path, resume_step)
        elif self.path.exists():
            self.path.unlink()  # a fresh run in an existing folder starts a fresh record
        self._file = self.path.open("a", encoding="utf-8")
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:  # tensorboard is an optional extra (tfkit[plots])
                SummaryWriter = None
            if SummaryWriter is not None:
                # purge_step: TensorBoard drops the events of the steps trained again, those of a killed
                # attempt included when a fresh start (from step 0) restarts it
                self._tb = SummaryWriter(log_dir=str(run_dir / "tensorboard"), purge_step=resume_step or 0)

    def log(self, row: dict[str, Any]) -> None:
        if not self.enabled:
            return
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()
        if self._tb is not None:
            for key, value in row.items():
                numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
                if key != "step" and numeric and math.isfinite(value):
                    self._tb.add_scalar(key, value, row["step"])
        if self._tracker is not None:
            self._tracker.log(row)

    def close(self) -> None:
        if not self.enabled:
            return
        self._file.close()
        if self._tb is not None:
            self._tb.close()
        if self._tracker is not None:
            self._tracker.close()


def truncate_after(path: Path, step: int) -> None:
    """Keep only rows with `step <= step`: the rows a killed run wrote after its last checkpoint are
    about to be produced again by the resumed run. The file is replaced atomically: a kill leaves the old one."""
    if not path.exists():
        return
    kept = [row for row in read_metrics(path) if row.get("step", 0) <= step]
    write_atomic(path, "".join(json.dumps(row) + "\n" for row in kept))


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def plot_loss(metrics_path: Path, out: Path) -> Path | None:
    """Training (and validation, when present) loss against step, as a PNG. None without matplotlib.
    Skipped updates (non-finite loss, logged with `loss: null`) are marked along the bottom edge."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    rows = read_metrics(metrics_path)
    train = [(r["step"], r["loss"]) for r in rows if _finite(r.get("loss")) and not r.get("skipped")]
    valid = [(r["step"], r["val_loss"]) for r in rows if _finite(r.get("val_loss"))]
    skipped = [r["step"] for r in rows if r.get("skipped")]  # their loss is null, NaN or inf: no y to plot
    if not train and not valid:
        return None
    task_loss, tasks = token_curves(rows)  # eval.tasks / eval.probe: a second panel against tokens
    fig, axes = plt.subplots(1, 2 if tasks else 1, figsize=(13 if tasks else 7, 4))
    ax = axes[0] if tasks else axes
    if tasks:
        draw_task_panel(axes[1], task_loss, tasks)
    if train:
        ax.plot(*zip(*train), label="train", linewidth=1)
    if valid:
        ax.plot(*zip(*valid), "o-", label="validation", linewidth=1.5, markersize=3)
    if skipped:  # a rug along the bottom edge: x in steps, y in axes fractions
        ax.plot(skipped, [0.02] * len(skipped), "x", color="tab:red", transform=ax.get_xaxis_transform(),
                label=f"skipped update ({len(skipped)})")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats / token)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out
