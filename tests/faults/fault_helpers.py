"""What the fault cases share: a tiny recipe, folder snapshots, the one-line error check, the CLI."""

from __future__ import annotations

import functools
import hashlib
import json
import os
from pathlib import Path


def tiny_recipe(folder: Path, text: str, **sections) -> Path:
    """A recipe that trains in about a second: 2 layers of width 32, 8 sequences of 32 tokens, one CPU."""
    folder.mkdir(parents=True, exist_ok=True)
    train, valid = folder / "train.txt", folder / "valid.txt"
    train.write_text(text[:40_000], encoding="utf-8")
    valid.write_text(text[40_000:46_000], encoding="utf-8")
    recipe = {
        "name": "tiny",
        "model": {"arch": "gpt", "d_model": 32, "n_layers": 2, "n_heads": 4, "max_seq_len": 64, "dropout": 0.1},
        "tokenizer": {"kind": "bpe", "vocab_size": 400},
        "data": {"train": str(train), "valid": str(valid), "seq_len": 32},
        "objective": {"name": "clm"},
        "optim": {"lr": 3e-3},
        "schedule": {"name": "cosine", "warmup_steps": 2},
        "train": {"max_steps": 4, "batch_size": 8, "log_every": 1, "eval_every": 2, "save_every": 2,
                  "keep_last": 10, "device": "cpu", "threads": 1,
                  "precision": "fp32"},  # the same arithmetic on every machine, in every process
        "eval": {"batches": 1, "sample_prompt": None},
        "log": {"progress": False, "plot": False, "tensorboard": False},
    }
    for section, values in sections.items():
        recipe[section] = {**recipe.get(section, {}), **values}
    path = folder / "tiny.yaml"
    path.write_text(json.dumps(recipe))  # JSON is YAML
    return path


# --- what a failing command must leave ---------------------------------------------------------------

def snapshot(root: Path) -> dict[str, str]:
    """Every file and folder under `root`, relative, with a digest of each file's bytes."""
    out = {}
    if not root.exists():
        return out
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        if path.is_symlink():
            out[rel] = "link"
        elif path.is_dir():
            out[rel] = "dir"
        elif not path.is_file():  # a FIFO, a socket: reading it would wait for a writer
            out[rel] = "special"
        else:
            out[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def changes(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """What differs between two snapshots, each as `+new`, `-gone` or `~changed`. An existing lock file
    may change: it holds the pid of the last process that took the lock (files.folder_lock)."""
    out = []
    for key in sorted(set(before) | set(after)):
        if key.endswith(".tfkit.lock") and key in before and key in after:
            continue
        if key not in before:
            out.append(f"+{key}")
        elif key not in after:
            out.append(f"-{key}")
        elif before[key] != after[key]:
            out.append(f"~{key}")
    return out


def assert_one_line_error(result, *expected: str) -> str:
    """Exit code 2, no traceback, and stderr exactly one line `error: ...` holding every `expected`."""
    output = result.output
    stderr = result.stderr if hasattr(result, "stderr") else output
    assert result.exit_code == 2, f"exit {result.exit_code}: {output[-2000:]} {result.exception!r}"
    assert "Traceback" not in output and "Traceback" not in stderr, output[-3000:]
    lines = [line for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error: ")]
    assert len(errors) == 1, stderr[-3000:]
    line = errors[0]
    assert len(line) < 2000, f"a {len(line)}-character 'line'"
    assert "weights_only" not in line, "torch's advice to load a refused pickle anyway"
    for fragment in expected:
        assert fragment in line, f"{fragment!r} not in {line!r}"
    return line


@functools.cache
def _command():
    """The click command of the tfkit app, built once: Typer builds it anew on every invoke, from the type
    hints of every command (0.3 s, most of an in-process case)."""
    import typer

    from tfkit.cli.main import app

    return typer.main.get_command(app)


def cli(args: list, **kw):
    """Run `tfkit ARGS` in-process (click's CliRunner, as Typer's; stderr apart from stdout)."""
    from click.testing import CliRunner

    return CliRunner().invoke(_command(), [str(a) for a in args], prog_name="tfkit", **kw)


def environment() -> dict[str, str]:
    """The environment of a subprocess that computes exactly as this process does (one thread)."""
    return {**os.environ, "OMP_NUM_THREADS": "1"}
