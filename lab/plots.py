"""The lab's figures, when the plots extra (matplotlib) is installed: validation curves (mean over seeds
per row), the final metric per row and eval text with its spread, and the activation-memory curve."""

from __future__ import annotations

from pathlib import Path

from ..files import atomic_file
from .scoring import is_degradation
from .verdict import mean_sd


def write_plots(folder: Path, results: dict) -> list[str]:
    """Names of the figures written into `folder` (none without matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    written = []
    for name, draw in (("curves.png", _curves), ("bars.png", _bars), ("memory.png", _memory)):
        fig, ax = plt.subplots(figsize=(8, 5))
        try:
            if draw(ax, results):
                fig.tight_layout()
                with atomic_file(folder / name) as tmp:
                    fig.savefig(tmp, format="png", dpi=110)
                written.append(name)
        finally:
            plt.close(fig)
    return written


def _curves(ax, results: dict) -> bool:
    drawn = False
    for name, seeds in results.get("curves", {}).items():
        by_step: dict[int, list[float]] = {}
        for rows in seeds.values():
            for step, value in rows:
                by_step.setdefault(step, []).append(value)
        if len(by_step) > 1:
            steps = sorted(by_step)
            ax.plot(steps, [mean_sd(by_step[s])[0] for s in steps], marker=".", label=name)
            drawn = True
    ax.set(xlabel="step", ylabel="validation loss", title=f"{results['claim']}: validation loss (mean over seeds)")
    if drawn:
        ax.legend(fontsize=8)
    return drawn


def _bars(ax, results: dict) -> bool:
    """The metric per row and eval text; degradation columns (LABEL@Nx, a difference near 0) are left out."""
    stats = {name: {label: cell for label, cell in row.items() if not is_degradation(label)}
             for name, row in results["summary"].items()}
    names = list(stats)
    labels = list(dict.fromkeys(label for row in stats.values() for label in row))
    width = 0.8 / max(len(labels), 1)
    for i, label in enumerate(labels):
        cells = [stats[n].get(label) for n in names]
        ax.bar([x + i * width for x in range(len(names))], [c["mean"] if c else 0 for c in cells], width,
               yerr=[c["sd"] if c else 0 for c in cells], label=label, capsize=2)
    ax.set_xticks([x + width * (len(labels) - 1) / 2 for x in range(len(names))], names, rotation=30, ha="right",
                  fontsize=8)
    ax.set(ylabel=results["metric"], title=f"{results['claim']}: {results['metric']} per variant")
    if names:
        low = min(c["mean"] for row in stats.values() for c in row.values())
        ax.set_ylim(bottom=max(0.0, low * 0.9))
        ax.legend(fontsize=8)
    return bool(names)


def _memory(ax, results: dict) -> bool:
    memory = results.get("probes", {}).get("memory")
    if not memory:
        return False
    for impl in ("flash", "naive"):
        ax.plot(memory["seq_lens"], memory[impl], marker="o", label=impl)
    ax.set(xlabel="sequence length T", ylabel="MiB kept for backward", xscale="log", yscale="log",
           title="activation memory of one training step")
    ax.legend()
    return True
