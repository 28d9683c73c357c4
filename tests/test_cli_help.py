"""Every `--help` reads as prose at the width it is shown at: the docstring's paragraphs are wrapped to
the terminal (80 and 120 columns here), never broken where the source file broke them."""

import pytest
import typer
from typer.testing import CliRunner

from tfkit.cli.main import app


def _command_paths(command=None, path=()) -> list[tuple[str, ...]]:
    command = command or typer.main.get_command(app)
    paths = [path]
    for name, sub in sorted(getattr(command, "commands", {}).items()):
        paths += _command_paths(sub, (*path, name))
    return paths


def ragged_breaks(help_text: str, width: int) -> list[str]:
    """Lines of the description (between the usage line and the first panel) that end a line although the
    next line's first word would have fit after them: a break the terminal did not need."""
    lines = help_text.splitlines()
    start = next(i for i, line in enumerate(lines) if "Usage:" in line) + 1
    end = next((i for i, line in enumerate(lines) if line.lstrip().startswith("╭")), len(lines))
    text = [line.strip() for line in lines[start:end]]
    return [f"{a!r} then {b!r}" for a, b in zip(text, text[1:])
            if a and b and len(a) + 1 + len(b.split()[0]) <= width - 2]  # a space of margin on each side


@pytest.mark.parametrize("width", [80, 120])
@pytest.mark.parametrize("path", _command_paths(), ids=lambda p: " ".join(p) or "tfkit")
def test_help_paragraphs_fill_the_width(path, width):
    result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": str(width)})
    assert result.exit_code == 0, result.output
    assert max(len(line) for line in result.output.splitlines()) <= width  # shown at the width asked for
    assert not ragged_breaks(result.output, width)
