"""The lab's figures, when the plots extra (matplotlib) is installed: validation curves (mean over seeds
per row), the final metric per row and eval text with the interval its verdict reads (`bar_chart`: the data
bars.png is drawn from, which the tests read), and the activation-memory curve."""

from __future__ import annotations

import math
from pathlib import Path

from ..files import atomic_file
from .downstream import column_metric
from .scoring import is_degradation
from .stats import mean_sd, paired_interval
from .outcomes import untrained
from .verdict import paired


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


def bar_chart(results: dict) -> dict:
    """What bars.png draws, as data: per eval column (degradation columns LABEL@Nx, a difference near 0, left out)
    each row's mean and the whisker of the paired interval its verdict reads (stats.paired_interval of the per-seed
    differences to the reference, placed at the reference's mean: a whisker that clears the reference's bar is
    a difference the interval supports; none on the reference, nor from one seed); a mark on a row that did not
    train (verdict.untrained) and on a quick run; the unigram figure the gates hold each run against (a loss
    lab's first column); and a y range from 0 that holds every bar, whisker and line."""
    ref, rows = results["reference"], results["rows"]
    stats = {name: {label: cell for label, cell in row.items() if not is_degradation(label)}
             for name, row in results["summary"].items()}
    names = list(stats)
    labels = list(dict.fromkeys(label for row in stats.values() for label in row))
    columns: dict[str, list[dict]] = {}
    for label in labels:
        metric, ref_cell = column_metric(results, label), stats.get(ref, {}).get(label)
        bars = []
        for name in names:
            cell = stats[name].get(label)
            mean = cell["mean"] if cell and math.isfinite(cell["mean"]) else None
            mark = "did not train" if untrained(results, name) else ""
            bar = {"row": name, "mean": mean, "lo": None, "hi": None, "mark": mark}
            deltas = paired(rows, name, ref, label, metric) if name != ref and ref_cell else []
            if len(deltas) > 1 and mean is not None and math.isfinite(ref_cell["mean"]):
                iv = paired_interval(deltas)
                bar["lo"], bar["hi"] = ref_cell["mean"] + iv.lo, ref_cell["mean"] + iv.hi
            bars.append(bar)
        columns[label] = bars
    unigram = _unigram(results) if results.get("metric") == "loss" else {}
    tops = [v for bars in columns.values() for b in bars for v in (b["mean"], b["hi"]) if v is not None]
    tops += [v for v in unigram.get("rows", {}).values()]
    quick = bool(results.get("options", {}).get("quick"))
    return {"names": names, "columns": columns, "reference": ref, "unigram": unigram,
            "ylim": (0.0, max(tops, default=1.0) * 1.08),
            "note": "quick run: no verdict (a tiny size checks the lab runs, not the claim)" if quick else "",
            "ylabel": results["metric"], "title": f"{results['claim']}: {results['metric']} per variant"}


def _unigram(results: dict) -> dict:
    """{"label", "rows": {row: mean unigram figure}} from the gates (the first eval text), {} without them."""
    gates = results.get("gates") or {}
    found = {}
    for name, run in (gates.get("runs") or {}).items():
        values = [g["unigram"] for g in run["seeds"].values() if g.get("unigram") is not None]
        if values and name in results["summary"]:
            found[name] = sum(values) / len(values)
    return {"label": gates["label"], "rows": found} if found else {}


def _bars(ax, results: dict) -> bool:
    chart = bar_chart(results)
    names, columns = chart["names"], chart["columns"]
    width = 0.8 / max(len(columns), 1)
    for i, (label, bars) in enumerate(columns.items()):
        xs = [x + i * width for x in range(len(names))]
        drawn = ax.bar(xs, [b["mean"] or 0.0 for b in bars], width, label=label)
        for x, b, patch in zip(xs, bars, drawn.patches):
            if b["lo"] is not None:
                ax.errorbar(x, b["mean"], yerr=[[b["mean"] - b["lo"]], [b["hi"] - b["mean"]]], color="black",
                            capsize=2, linewidth=1)
            if b["mark"] or b["mean"] is None:  # written up the bar from its foot, the bar hatched
                patch.set_hatch("//")
                ax.text(x, chart["ylim"][1] * 0.02, b["mark"] or "no score", rotation=90, ha="center",
                        va="bottom", fontsize=8, bbox={"facecolor": "white", "edgecolor": "none", "pad": 1})
        if label == chart["unigram"].get("label"):
            for x, name in zip(xs, names):
                value = chart["unigram"]["rows"].get(name)
                if value is not None:
                    ax.hlines(value, x - width / 2, x + width / 2, colors="red", linestyles="dashed", linewidth=1)
    if chart["unigram"]:
        ax.plot([], [], color="red", linestyle="dashed", label=f"unigram model ({chart['unigram']['label']})")
    ax.set_xticks([x + width * (len(columns) - 1) / 2 for x in range(len(names))],
                  [f"{n} (ref)" if n == chart["reference"] else n for n in names], rotation=30, ha="right", fontsize=8)
    ax.set(ylabel=chart["ylabel"], ylim=chart["ylim"])
    ax.set_title(chart["title"] + (f"\n{chart['note']}" if chart["note"] else ""), fontsize=10)
    ax.set_xlabel(f"whiskers: 95% paired t interval of the difference to {chart['reference']}, at its mean", fontsize=8)
    if names:
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))  # beside the bars, never on them
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
