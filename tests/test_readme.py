"""The README's set-up commands are the ones CI runs: a README that lies is a bug."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _setup_commands() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Set up", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.+?)\n```", section, flags=re.S)


def test_readme_has_exactly_two_setup_commands_quickstart_then_tests():
    commands = _setup_commands()
    assert len(commands) == 2, commands
    assert "\n" not in commands[0] and "\n" not in commands[1]
    assert commands[0].endswith("tfkit pretrain quickstart")
    assert "pytest" in commands[1]
    assert all("pip install torch==2.13.0" in c for c in commands), "CPU torch must be installed first"


def test_ci_runs_the_readme_test_command_verbatim():
    ci_lines = (ROOT / ".ci/run").read_text(encoding="utf-8").splitlines()
    assert _setup_commands()[1] in ci_lines
