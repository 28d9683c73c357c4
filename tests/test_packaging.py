"""The repository root installs as one `tfkit` package: recipes inside, no bare top-level modules."""

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def not_source() -> list[str]:
    """What a build must not see: version control and what .gitignore names (environments, run outputs, earlier
    builds), as names at any depth. The wheel is built from a copy of the rest, because setuptools builds in the
    source tree (build/, tfkit.egg-info/): two builds of one tree at once collide, and a test must not leave
    files in the user's checkout."""
    lines = (ROOT / ".gitignore").read_text().splitlines()
    return [".git", *(Path(line.strip("/")).name for line in lines if line.strip() and not line.startswith("#"))]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> zipfile.ZipFile:
    source = tmp_path_factory.mktemp("source") / "tfkit"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(*not_source()))
    out = tmp_path_factory.mktemp("wheel")
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(source)],
        capture_output=True, text=True,
    )
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    (path,) = out.glob("tfkit-*.whl")
    return zipfile.ZipFile(path)


@pytest.mark.slow  # pip builds the wheel: about 8 s
@pytest.mark.xdist_group("wheel")  # one build for both wheel tests
def test_wheel_contains_subpackages_under_tfkit_only(wheel):
    names = wheel.namelist()
    top = {n.split("/")[0] for n in names if not n.startswith("tfkit-")}
    assert top == {"tfkit"}, top
    for module in ("tfkit/cli/main.py", "tfkit/models/attention.py", "tfkit/trainer/recipe.py",
                   "tfkit/tokenization/train.py", "tfkit/errors.py", "tfkit/__main__.py"):
        assert module in names
    assert not any(n.startswith("tfkit/tests/") for n in names)


@pytest.mark.slow
@pytest.mark.xdist_group("wheel")
def test_wheel_ships_the_bundled_recipes(wheel):
    names = set(wheel.namelist())
    for recipe in ("quickstart", "gpt-tiny", "bert-tiny"):
        assert f"tfkit/recipes/{recipe}.yaml" in names


def test_no_bare_top_level_modules_are_importable(tmp_path):
    for name in ("models", "cli", "trainer", "tokenization"):
        result = subprocess.run([sys.executable, "-c", f"import {name}"], cwd=tmp_path, capture_output=True, text=True)
        assert result.returncode != 0 and "ModuleNotFoundError" in result.stderr, name


def test_python_dash_m_tfkit_runs_the_cli():
    result = subprocess.run([sys.executable, "-m", "tfkit", "--version"], capture_output=True, text=True)
    assert result.returncode == 0 and result.stdout.startswith("tfkit ")
