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


def _example_commands() -> list[list[str]]:
    """Every command of the README's examples (the bash blocks after Set up), split as the shell would,
    comments dropped, in the order a reader runs them."""
    import shlex

    text = (ROOT / "README.md").read_text(encoding="utf-8").split("## Set up", 1)[1].split("\n## ", 1)[1]
    blocks = re.findall(r"```bash\n(.+?)\n```", text, flags=re.S)
    return [shlex.split(line, comments=True) for block in blocks for line in block.splitlines() if line.strip()]


def _inputs(args: list[str]) -> list[str]:
    """The files a tfkit command reads: `data.train` / `data.valid` values and a tokenizer's corpus."""
    sets = [args[i + 1] for i, a in enumerate(args[:-1]) if a == "--set"]
    found = [s.split("=", 1)[1] for s in sets if s.startswith(("data.train=", "data.valid="))]
    if args[:2] == ["tfkit", "train-tokenizer"]:
        found.append(args[2])
    return found


def test_every_readme_example_runs_in_a_clone_as_written():
    """A clone has nothing beside it (no ../shared): each file an example reads is a built-in corpus or
    one an earlier example wrote, each recipe it names is bundled, and its --set values validate."""
    from tfkit.trainer.recipe import bundled_recipes, load_recipe

    written: set[str] = set()
    commands = _example_commands()
    assert len(commands) > 20, "the README's examples were not found"
    for args in commands:
        for path in _inputs(args):
            assert path.startswith("stdlib:") or path in written, f"{' '.join(args)}: {path} is not there"
        if ">" in args:
            written.add(args[args.index(">") + 1])
        if "--run-dir" in args:
            written.add(args[args.index("--run-dir") + 1])
        if "pretrain" in args and "tfkit" in args[: args.index("pretrain")]:
            recipe = args[args.index("pretrain") + 1]
            sets = [args[i + 1] for i, a in enumerate(args[:-1]) if a == "--set"]
            if "--resume" in args:  # a run folder's own recipe.yaml, written by an earlier example's run
                assert Path(recipe).parent.as_posix() in written, f"{' '.join(args)}: no earlier run wrote {recipe}"
                continue
            assert recipe in bundled_recipes(), f"{' '.join(args)}: no bundled recipe {recipe}"
            load_recipe(recipe, sets)  # raises on a value the recipe refuses
