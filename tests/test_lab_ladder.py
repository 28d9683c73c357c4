"""`--steps` repeated: the same lab at each step count, every rung an ordinary lab folder, the verdicts side by
side; continued without retraining, rebuilt by `lab report`, refused in one line when the steps are bad."""

import json

import pytest
from typer.testing import CliRunner

from tfkit.cli.main import app

SPEC = """\
# two variants for the ladder test
base: gpt-tiny
reference: a
variants: {a: [], b: [model.attn_scale=none]}
expect:
  - {better: a, than: b, source: test}
"""


@pytest.fixture(scope="module")
def ladder(english_text, tmp_path_factory):
    folder = tmp_path_factory.mktemp("ladder")
    (folder / "train.txt").write_text(english_text[:60_000])
    (folder / "valid.txt").write_text(english_text[60_000:70_000])
    (folder / "spec.yaml").write_text(SPEC)
    args = ["lab", "run", str(folder / "spec.yaml"), "--quick", "--seeds", "1", "--data", str(folder / "train.txt"),
            "--eval", str(folder / "valid.txt"), "--set", f"data.valid={folder / 'valid.txt'}",
            "--steps", "4", "--steps", "2", "--out", str(folder / "out")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return folder / "out", args


def test_every_rung_is_a_lab_at_its_own_step_count(ladder):
    out, _ = ladder
    for steps in (2, 4):
        rung = json.loads((out / f"steps-{steps}" / "results.json").read_text())
        assert rung["options"]["steps"] == steps
        assert rung["scale"]["a"]["steps"] == steps and rung["scale"]["a"]["tokens"] == steps * 4 * 32  # quick batch
    summary = json.loads((out / "results.json").read_text())
    assert summary["steps"] == [2, 4]  # in increasing order, whatever order they were given in


def test_the_ladder_report_puts_the_rungs_side_by_side(ladder):
    out, _ = ladder
    markdown = (out / "results.md").read_text()
    assert "| claim | 2 steps | 4 steps |" in markdown
    rungs = {n: json.loads((out / f"steps-{n}" / "results.json").read_text()) for n in (2, 4)}
    deltas = [f"Δ {rungs[n]['verdicts'][0]['mean']:+.3g}" for n in (2, 4)]
    assert f"| a < b on valid | no verdict: {deltas[0]} | no verdict: {deltas[1]} |" in markdown
    assert "| 2 | 256 |" in markdown and "| 4 | 512 |" in markdown  # tokens seen at each rung


def test_a_ladder_is_continued_and_rebuilt(ladder):
    out, args = ladder
    again = CliRunner().invoke(app, args)
    assert again.exit_code == 0, again.output
    assert "train a/seed-1337: done before" in again.output and "train b/seed-1337: done before" in again.output
    (out / "results.md").unlink()
    (out / "steps-2" / "results.md").unlink()
    rebuilt = CliRunner().invoke(app, ["lab", "report", str(out)])
    assert rebuilt.exit_code == 0, rebuilt.output
    assert "| claim | 2 steps | 4 steps |" in (out / "results.md").read_text()
    assert "## Verdicts" in (out / "steps-2" / "results.md").read_text()


@pytest.mark.parametrize("steps, message", [(["3", "3"], "steps: got [3, 3], expected distinct positive step counts"),
                                            (["0", "4"], "steps: got [0, 4]")])
def test_bad_steps_are_one_line(tmp_path, steps, message):
    args = ["lab", "run", "qk-scale", "--quick", "--out", str(tmp_path / "out")]
    for n in steps:
        args += ["--steps", n]
    result = CliRunner().invoke(app, args)
    lines = [line for line in result.output.splitlines() if line.strip() and not line.startswith("lab qk-scale")]
    assert result.exit_code == 2 and len(lines) == 1 and message in lines[0] and "--steps" in lines[0], result.output
    assert not (tmp_path / "out").exists()


def test_a_ladder_never_writes_into_another_lab(ladder):
    out, args = ladder
    other = list(args)
    other[other.index("--out") + 1] = str(out / "steps-2")  # a lab folder, not this ladder's
    result = CliRunner().invoke(app, other)
    assert result.exit_code == 2 and "not a lab folder (no ladder.json)" in result.output
