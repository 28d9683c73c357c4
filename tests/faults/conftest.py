"""The fault-injection suite: what tfkit promises about bad input, damaged files, full disks, signals and
concurrent runs, tried on generated cases (`python -m pytest -m faults`).

Every test here is marked `faults`, and its category is the module it lives in (`test_fault_recipes.py` ->
recipes); the terminal summary counts the cases of each category. The shared pieces: a tiny trained
run folder (two checkpoints, built once per session in-process), snapshots of folders (what existed
before a failing command must be byte for byte the same after it, and nothing new may be left), and the
check of the one-line error.
"""

from __future__ import annotations

import collections
import shutil
from pathlib import Path

import pytest
from fault_helpers import tiny_recipe

HERE = Path(__file__).parent


def pytest_collection_modifyitems(config, items):
    for item in items:
        if HERE in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.faults)


def _category(nodeid: str) -> str | None:
    path = nodeid.split("::")[0]
    if "tests/faults/test_" not in path:
        return None
    return Path(path).stem.removeprefix("test_fault_")


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for outcome in ("passed", "failed", "skipped", "error"):
        for report in terminalreporter.stats.get(outcome, []):
            category = _category(getattr(report, "nodeid", ""))
            if category and (report.when == "call" or outcome in ("skipped", "error")):
                counts[category][outcome] += 1
    if not counts:
        return
    parts = [f"{name} {sum(c.values())} ({', '.join(f'{n} {o}' for o, n in sorted(c.items()))})"
             for name, c in sorted(counts.items())]
    total = sum(sum(c.values()) for c in counts.values())
    terminalreporter.write_line(f"faults: {total} cases: " + "; ".join(parts))


# --- a tiny trained run, built once ------------------------------------------------------------------

@pytest.fixture(scope="session")
def tiny_run(english_text, tmp_path_factory) -> tuple[Path, Path]:
    """(recipe, run folder) of a finished 4-step run with checkpoints at steps 2 and 4. Read-only: a test
    that damages it works on a copy (`copy_run`)."""
    from tfkit.trainer.recipe import load_recipe
    from tfkit.trainer.run import pretrain

    folder = tmp_path_factory.mktemp("tiny")
    recipe = tiny_recipe(folder, english_text)
    pretrain(load_recipe(str(recipe)), run_dir=folder / "run")
    return recipe, folder / "run"


@pytest.fixture
def copy_run(tiny_run, tmp_path):
    """A private copy of the tiny run folder, to damage."""
    def make(name: str = "run") -> Path:
        target = tmp_path / name
        shutil.copytree(tiny_run[1], target)
        return target
    return make


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    """Run in an empty working folder, so that whatever a command leaves behind (runs/, caches) shows."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TFKIT_CACHE", str(tmp_path / ".cache"))
    return tmp_path
