"""README.md is the front door and docs/*.md the manual: a document that lies is a bug.

The README's set-up commands are the ones CI runs. Every example command of the README and of each docs/ page
runs in a clone as written: the command line parses as the command defines it, each recipe it names is bundled
and its --set values validate, and each file or folder it reads is a built-in corpus or one an earlier example
of the same page wrote. A run folder is read by the name an earlier example gave it (`--run-dir`, `--out`): a
`runs/NAME-*` glob matches every run of that recipe the reader has made, or none, and only the set-up's quickstart
is read that way. The README stays short and every relative link of the README and of docs/ leads to a file."""

from __future__ import annotations

import functools
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted((ROOT / "docs").glob("*.md"))
README_MAX_LINES = 250
SETUP_WRITES = frozenset({"runs/quickstart-*"})  # the set-up's `tfkit pretrain quickstart`: every page may read it
# Parameters of the tfkit commands (cli/) that name something an example reads, and something it writes.
READS = ("corpus", "checkpoints", "checkpoint", "ckpt", "src", "folder", "files", "data", "task", "eval_data",
         "evals")
WRITES = ("out", "run_dir", "json_out")
RECIPE_INPUTS = ("data.train", "data.valid", "train.init_from", "tokenizer.path")  # read by a recipe's run


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


def example_commands(text: str) -> list[list[str]]:
    """Every command of a page's ```bash blocks, split as the shell would, comments dropped, in the order a
    reader runs them."""
    blocks = re.findall(r"```bash\n(.+?)\n```", text, flags=re.S)
    return [shlex.split(line, comments=True) for block in blocks for line in block.splitlines() if line.strip()]


def readme_examples() -> list[list[str]]:
    """The README's examples: the bash blocks after its set-up section."""
    text = (ROOT / "README.md").read_text(encoding="utf-8").split("## Set up", 1)[1].split("\n## ", 1)[1]
    return example_commands(text)


@functools.cache
def _cli():
    """The `tfkit` command as its parser sees it (typer's click group)."""
    import typer

    from tfkit.cli.main import app

    return typer.main.get_command(app)


def _parse(args: list[str]) -> tuple[str, dict] | None:
    """(command path, its parameters) of a line that runs tfkit (`tfkit ...`, `torchrun ... -m tfkit ...`), as the
    command's parser reads it (nothing runs); None for any other line. An option the command lacks, a missing
    argument or a value of the wrong type raises the parser's usage error."""
    if "tfkit" not in args or (args[0] != "tfkit" and "-m" not in args):
        return None
    words = args[args.index("tfkit") + 1:]
    words = words[:next((i for i, w in enumerate(words) if w in (">", ">>")), len(words))]
    command, path = _cli(), []
    while hasattr(command, "commands") and words and words[0] in command.commands:
        path.append(words[0])
        command = command.commands[words.pop(0)]
    ctx = command.make_context(" ".join(["tfkit", *path]), list(words))
    return " ".join(path), ctx.params


def _values(value) -> list[str]:
    """The paths a parameter names; `eval --data NAME=CORPUS` names CORPUS."""
    if value is None or isinstance(value, bool):
        return []
    values = [str(v) for v in value] if isinstance(value, (list, tuple)) else [str(value)]
    return [v.partition("=")[2] if re.fullmatch(r"[\w.-]+=\S+", v) else v for v in values]


def _is_written(path: str, written: set[str]) -> bool:
    """`path` is a built-in corpus, or something an earlier example wrote, or inside it (runs/x/tokenizer)."""
    if path.startswith("stdlib:"):
        return True
    return any(path == w or path.startswith(w.rstrip("/") + "/") for w in written)


def check_examples(commands: list[list[str]], written: set[str]) -> list[str]:
    """What is wrong with a page's examples run in order in a fresh clone (`written`: what is there before the
    first one), one line per problem."""
    from tfkit.tokenization.sources import source_paths
    from tfkit.trainer.recipe import bundled_recipes, load_recipe

    written, problems = set(written), []
    for args in commands:
        line = " ".join(args)
        try:
            parsed = _parse(args)
        except Exception as exc:  # the parser's usage error: an unknown option, a missing argument, a bad number
            if not hasattr(exc, "format_message"):
                raise
            problems.append(f"{line}: {exc.format_message()}")
            continue
        if parsed is not None:
            command, params = parsed
            problems += [f"{line}: {path} is not there" for name in READS for path in _values(params.get(name))
                         if not _is_written(path, written)]
            if command in ("pretrain", "finetune", "recipes show"):
                recipe, sets = params["recipe"], list(params.get("overrides") or ())
                if params.get("resume"):  # a run folder's own recipe.yaml, written by an earlier example's run
                    if not _is_written(recipe, written):
                        problems.append(f"{line}: no earlier example wrote {recipe}")
                elif recipe not in bundled_recipes():
                    problems.append(f"{line}: no bundled recipe {recipe}")
                else:
                    r = load_recipe(recipe, sets)  # raises on a value the recipe refuses
                    found = [(key + part, spec) for key in ("data.train", "data.valid")  # a list: each source
                             for part, spec in source_paths(getattr(r.data, key.split(".")[1]))]
                    found += [("train.init_from", r.train.init_from), ("tokenizer.path", r.tokenizer.path)]
                    problems += [f"{line}: {key} {value} is not there" for key, value in found
                                 if value is not None and not _is_written(str(value), written)]
            if command == "lab run" and not (ROOT / "recipes" / "lab" / f"{params['claim']}.yaml").is_file():
                if not _is_written(params["claim"], written):
                    problems.append(f"{line}: no shipped claim {params['claim']}")
            written |= {path for name in WRITES for path in _values(params.get(name))}
        for i, word in enumerate(args[:-1]):
            if word in (">", ">>"):
                written.add(args[i + 1])
    return problems


def test_every_readme_example_runs_in_a_clone_as_written():
    """A clone has nothing beside it (no ../shared): the README's examples, in order, after the set-up."""
    commands = readme_examples()
    assert len(commands) > 12, "the README's examples were not found"
    assert check_examples(commands, set(SETUP_WRITES)) == []


@pytest.mark.parametrize("page", DOCS, ids=lambda p: p.name)
def test_every_example_of_a_docs_page_runs_in_a_clone_as_written(page):
    """Each page on its own, in order, after the README's set-up (and nothing of another page)."""
    commands = example_commands(page.read_text(encoding="utf-8"))
    assert check_examples(commands, set(SETUP_WRITES)) == []


def test_the_docs_pages_have_examples_to_check():
    pages = {page.name: len(example_commands(page.read_text(encoding="utf-8"))) for page in DOCS}
    assert sum(pages.values()) > 40, pages
    for name in ("data.md", "recipes.md", "evaluation.md", "finetuning.md", "huggingface.md", "lab.md", "scale.md"):
        assert pages.get(name, 0) >= 1, f"docs/{name} has no ```bash example"


def test_the_check_catches_a_run_folder_no_example_wrote():
    """The task-eval example of issue 44: `runs/gpt-tiny-*` names the runs of a recipe, not a folder an example
    wrote; a glob of the set-up's quickstart, a named run folder and a file written by `>` are there. A recipe's
    own inputs, a lab claim and the command line itself are checked too."""
    page = """```bash
tfkit pretrain gpt-tiny --set train.max_steps=10
echo '{"context": "a", "choices": ["b", "c"], "gold": 0}' > task.jsonl
tfkit eval runs/quickstart-* runs/gpt-tiny-* --task task.jsonl
tfkit pretrain gpt-tiny --run-dir runs/gpt --set data.train=book.txt
tfkit eval runs/quickstart-* runs/gpt --task task.jsonl
tfkit finetune finetune-classify
tfkit lab run no-such-claim
tfkit generate runs/gpt --max-tokens 40
```"""
    problems = check_examples(example_commands(page), set(SETUP_WRITES))
    assert problems == [
        "tfkit eval runs/quickstart-* runs/gpt-tiny-* --task task.jsonl: runs/gpt-tiny-* is not there",
        "tfkit pretrain gpt-tiny --run-dir runs/gpt --set data.train=book.txt: data.train book.txt is not there",
        "tfkit finetune finetune-classify: train.init_from runs/bert-tiny is not there",
        "tfkit lab run no-such-claim: no shipped claim no-such-claim",
        "tfkit generate runs/gpt --max-tokens 40: No such option: --max-tokens (Possible options: --max-new-tokens, "
        "--min-new-tokens)"], problems


def test_readme_is_a_front_door_under_250_lines():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines < README_MAX_LINES, f"README.md has {lines} lines; reference belongs in docs/"


def _relative_links(page: Path) -> list[str]:
    """The targets of a page's Markdown links that are not URLs or anchors of the page itself."""
    targets = re.findall(r"\]\(([^)\s]+)\)", page.read_text(encoding="utf-8"))
    return [t.split("#", 1)[0] for t in targets if not re.match(r"[a-z]+:", t) and not t.startswith("#")]


@pytest.mark.parametrize("page", [ROOT / "README.md", *DOCS], ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_leads_to_a_file(page):
    links = _relative_links(page)
    missing = [t for t in links if not (page.parent / t).exists()]
    assert missing == [], f"{page.name}: links to nothing: {missing}"


def test_the_readme_links_every_docs_page():
    linked = {(ROOT / t).resolve() for t in _relative_links(ROOT / "README.md")}
    assert [p.name for p in DOCS if p.resolve() not in linked] == []
