"""The CLI answers at once: commands that run no model never import torch (seconds on a busy machine), and
one that runs a model without compiling it never imports TorchDynamo (about as long again)."""

import json
import subprocess
import sys

from helpers import make_checkpoint

# Runs CLI commands in turn as the `tfkit` executable would, reporting after each which heavy modules the
# process has imported so far: an import is never undone, so the first command that needs a module is named.
DRIVER = """
import json, sys
from tfkit.cli.entry import run
for args in json.loads(sys.argv[1]):
    sys.argv = ["tfkit", *args]
    try:
        run()
    except SystemExit as exc:
        code = exc.code
    else:
        code = 0
    seen = {"code": code, "torch": "torch" in sys.modules, "numpy": "numpy" in sys.modules,
            "dynamo": "torch._dynamo" in sys.modules}
    print("IMPORTS " + json.dumps({"args": args, **seen}), file=sys.stderr)
"""


def imports_of(commands: list[list[str]], cwd) -> list[dict]:
    """What each command of one process had imported when it ended, in order."""
    result = subprocess.run([sys.executable, "-c", DRIVER, json.dumps(commands)], cwd=cwd, capture_output=True,
                            text=True, timeout=120)
    return [json.loads(line[len("IMPORTS "):]) for line in result.stderr.splitlines() if line.startswith("IMPORTS ")]


NO_MODEL = [["--help"], ["--version"], ["recipes", "list"], ["recipes", "show", "gpt-tiny"], ["pretrain", "--help"],
            ["eval", "--help"], ["generate", "--help"]]


def test_a_recipe_mistake_is_reported_before_torch_is_imported(tmp_path):
    """A typo in a key or a bad --set costs the user no torch import (7-12 s on a busy machine)."""
    (tmp_path / "bad.yaml").write_text("model:\n  arch: gpt\n  d_modle: 64\n")
    seen = imports_of([["pretrain", "bad.yaml"], ["pretrain", "gpt-tiny", "--set", "train.max_step=3"],
                       ["finetune", "finetune-classify", "--set", "task.pooling=bogus"]], tmp_path)
    assert [each["code"] for each in seen] == [2, 2, 2] and not any(each["torch"] for each in seen), seen


def test_commands_that_run_no_model_leave_torch_unimported(tmp_path):
    seen = imports_of(NO_MODEL, tmp_path)
    assert [s["args"] for s in seen] == NO_MODEL
    for each in seen:
        assert each["code"] == 0 and not each["torch"], each


def test_train_tokenizer_leaves_torch_and_numpy_unimported(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("The quick brown fox jumps over the lazy dog.\n" * 400, encoding="utf-8")
    [seen] = imports_of([["train-tokenizer", str(corpus), "--out", str(tmp_path / "tok"), "--vocab-size", "300",
                          "-q"]], tmp_path)
    assert seen["code"] == 0 and not seen["torch"] and not seen["numpy"], seen
    assert (tmp_path / "tok" / "tokenizer.json").is_file()


def test_a_model_command_that_does_not_compile_leaves_the_compiler_unimported(eval_tokenizers, tmp_path):
    checkpoint = make_checkpoint(tmp_path / "ckpt", eval_tokenizers["bpe"])
    [seen] = imports_of([["generate", str(checkpoint), "-p", "The", "-n", "2", "--seed", "0", "--device", "cpu"]],
                        tmp_path)
    assert seen["code"] == 0 and seen["torch"] and not seen["dynamo"], seen
