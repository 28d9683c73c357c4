"""Where and with what a lab ran: the tfkit commit, torch, Python, the device and the threads, written into
results.json and into the expectations' registration, so a verdict quoted from the record names the code and
the machine that made it (and a number from another machine is never read as this one's)."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

import torch

PACKAGE = Path(__file__).resolve().parents[1]  # the tfkit package, which is the repository root


def git_commit(folder: Path = PACKAGE) -> str | None:
    """The commit the package was run from, "+dirty" when tracked files differ from it; None outside git."""
    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", *args], cwd=folder, capture_output=True, text=True, timeout=20)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if commit is None:
        return None
    dirty = git("status", "-s", "-uno")  # short form, tracked files only: empty when the tree is the commit's
    return commit[:7] + ("+dirty" if dirty else "")


def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo on Linux, else what platform knows)."""
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def device_name() -> str:
    """The accelerator the lab's trainings would use (the recipes' train.device: auto), else the CPU."""
    if torch.cuda.is_available():
        return f"{torch.cuda.get_device_name(0)} (CUDA {torch.version.cuda})"
    return f"{cpu_name()}, {os.cpu_count()} cores"


def provenance() -> dict:
    """{commit, torch, python, device, omp_threads}: the code and machine of this run."""
    return {"commit": git_commit(), "torch": torch.__version__, "python": platform.python_version(),
            "device": device_name(), "omp_threads": os.environ.get("OMP_NUM_THREADS")}


def provenance_line(p: dict | None) -> str:
    """One sentence of results.md: "commit abc1234, torch 2.13.0+cpu, Intel Xeon ..., OMP_NUM_THREADS=1"."""
    if not p:
        return ""
    threads = f", OMP_NUM_THREADS={p['omp_threads']}" if p.get("omp_threads") else ""
    return (f"Run at commit {p.get('commit') or 'unknown (not a git checkout)'}, torch {p['torch']}, Python "
            f"{p['python']}, on {p['device']}{threads}.")
