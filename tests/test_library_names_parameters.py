"""The library names its own parameters in errors; the CLI spells them as the running command's flags.

`tfkit.models.generation.check_sampling(top_k=0)` says "top_k must be >= 1", which a Python caller can act
on; `tfkit generate --top-k 0` says "--top-k must be >= 1", which a shell user can. The second is the
first with the parameters it names (`TfkitError.params`) rewritten at the boundary (cli/flags.py).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
from typer.main import get_command
from typer.testing import CliRunner

from tfkit.cli.flags import with_flags
from tfkit.cli.main import app
from tfkit.errors import ConfigError, TfkitError, rename_params

ROOT = Path(__file__).resolve().parents[1]
LIBRARY = ("models", "trainer", "tokenization", "evaluation", "lab")
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z-]*")
# a whole command to copy is the CLI's own vocabulary: in backticks (`tfkit lab run CLAIM --out DIR`), or
# ending the text from its start or a colon ("continue it with: tfkit pretrain RUN/recipe.yaml --resume auto")
WHOLE_COMMAND = re.compile(r"`(tfkit|torchrun) [^`]*`|(^|: )(tfkit|torchrun) .*$")


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the string nodes that are docstrings (prose about the CLI, not messages)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def _literal_text(node: ast.AST) -> str:
    """A string literal's text, an f-string's placeholders as {}."""
    if isinstance(node, ast.Constant):
        return node.value
    return "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)


def flags_in_messages(root: Path) -> list[str]:
    """`FILE:LINE: FLAG` for each command-line flag spelled in a string literal of the library (docstrings
    and whole commands aside)."""
    found = []
    for folder in LIBRARY:
        for path in sorted((root / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            skip = _docstrings(tree)
            inner = {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values}
            for node in ast.walk(tree):
                is_text = isinstance(node, ast.JoinedStr) or (isinstance(node, ast.Constant)
                                                             and isinstance(node.value, str))
                if not is_text or id(node) in skip or id(node) in inner:
                    continue
                for flag in FLAG.findall(WHOLE_COMMAND.sub("", _literal_text(node))):
                    found.append(f"{path.relative_to(root)}:{node.lineno}: {flag}")
    return sorted(found)


def test_no_library_message_names_a_command_line_flag():
    assert flags_in_messages(ROOT) == []


def test_the_scan_finds_a_flag_in_an_error_and_leaves_docstrings_and_commands(tmp_path):
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "m.py").write_text(
        '"""`--top-k` in a docstring is prose."""\n'
        'def f(k):\n'
        '    """--top-k again."""\n'
        '    raise ValueError(f"--top-k must be >= 1, got {k}; see `tfkit generate CKPT --top-k 5`")\n'
        'HINT = "made by tfkit generate; use --seed to repeat it: tfkit generate CKPT --seed 1"\n')
    for folder in LIBRARY[1:]:
        (tmp_path / folder).mkdir()
    assert flags_in_messages(tmp_path) == ["models/m.py:4: --top-k", "models/m.py:5: --seed"]


def _command(*path: str):
    command = get_command(app)
    for name in path:
        command = command.commands[name]
    return command


def test_a_library_error_names_the_parameter_and_the_cli_the_flag():
    from tfkit.models.generation import check_sampling

    exc = pytest.raises(ConfigError, check_sampling, 1.0, 0, None, 10).value
    assert str(exc) == "top_k must be >= 1, got 0"
    assert with_flags(exc, _command("generate")) == "--top-k must be >= 1, got 0"


def test_a_parameter_the_command_names_otherwise_is_spelled_as_its_option():
    """generate's `--prompt` is the library's `prompt_ids`, `--fill-mask` its `fill_mask`: the command's
    `library_params` say so."""
    from tfkit.models.generation import check_generate

    exc = pytest.raises(ConfigError, check_generate, SimpleNamespace(arch="bert"), [[1]], 3, 0, None).value
    assert str(exc) == 'prompt_ids: BERT does not generate left to right; use fill_mask "... [MASK] ..."'
    assert with_flags(exc, _command("generate")) == \
        '--prompt: BERT does not generate left to right; use --fill-mask "... [MASK] ..."'


def test_only_the_parameters_an_error_names_are_rewritten_and_only_as_words():
    names = {"seq_len": "--seq-len", "text_field": "--text-field"}
    message = ("seq_len 9 exceeds the model's max_seq_len; 1..seq_len=9; data.text_field or text_field; "
               "runs/seq_len/x.txt, seq_len.txt")
    assert rename_params(message, names) == (
        "--seq-len 9 exceeds the model's max_seq_len; 1..seq_len=9; data.text_field or --text-field; "
        "runs/seq_len/x.txt, seq_len.txt")
    exc = TfkitError("seq_len 9 and text_field 'body'", params=("text_field",))
    assert with_flags(exc, _command("eval")) == "seq_len 9 and --text-field 'body'"
    assert with_flags(exc, None) == str(exc)


@pytest.mark.parametrize("args, line", [
    (["pretrain", "gpt-tiny", "--resume", "{tmp}/none"],
     "error: --resume {tmp}/none: no such file or folder (give a run folder, one of its checkpoints/step-<N>/, "
     "or auto)"),
    (["recipes", "validate", "gpt-tiny", "--set", "trian.max_steps=5"],
     "error: --set trian.max_steps=5: unknown section 'trian' (did you mean 'train'?)"),
    (["lab", "run", "gqa-uptrain", "--seeds", "0"], "error: --seeds: got 0, expected a positive integer"),
    (["generate", "{tmp}", "-p", "x", "--dtype", "int8"],
     "error: --dtype: got 'int8', expected one of fp32, bf16, fp16"),
])
def test_commands_still_name_their_flags(args, line, tmp_path):
    result = CliRunner().invoke(app, [a.format(tmp=tmp_path) for a in args])
    assert result.exit_code == 2, result.output
    assert result.stderr.strip() == line.format(tmp=tmp_path)


def test_the_library_says_the_same_with_the_parameter_names(tmp_path):
    from tfkit.checkpoints.folders import resolve_resume
    from tfkit.lab.engine import prepare
    from tfkit.lab.plan import LabOptions
    from tfkit.lab.spec import load_spec
    from tfkit.trainer.recipe import load_recipe

    missing = str(pytest.raises(TfkitError, resolve_resume, tmp_path / "none").value)
    assert missing.startswith(f"resume {tmp_path / 'none'}: no such file or folder")
    unknown = str(pytest.raises(ConfigError, load_recipe, "gpt-tiny", ["trian.max_steps=5"]).value)
    assert unknown == "overrides trian.max_steps=5: unknown section 'trian' (did you mean 'train'?)"
    seeds = str(pytest.raises(ConfigError, prepare, load_spec("gqa-uptrain"), LabOptions(seeds=0)).value)
    assert seeds == "seeds: got 0, expected a positive integer"
