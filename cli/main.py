"""The `tfkit` command: the Typer app, its global options, and the error boundary.

Commands live one group per module and stay thin; this module only assembles them. Every `TfkitError`
raised below is caught here and printed as one red line with exit code 2 (the traceback only with
`--debug`), so a user sees what to fix rather than a stack; so is a command-line mistake that Typer reports (an
unknown option, a missing argument), without its usage block and framed box. So is every `OSError` that got this far
(an `--out` under a regular file, a `--run-dir` that is a file, no permission, a full disk): those are
ordinary file-system mistakes, and the line names the path and the operating system's reason.
A library error names its function's parameters (`top_k must be >= 1`); the line spells them as the running
command's flags (`--top-k must be >= 1`).
"""

from __future__ import annotations

import inspect
import os
import re
import sys
import warnings
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from typer.core import TyperGroup
from typer.exceptions import TyperException

from .. import __version__
from ..errors import TfkitError, disk_full, shorten
from ..files import is_disk_full
from . import consolidate, convert, evaluate, finetune, generate, hf, lab, plan, predict, pretrain, recipes, tokenizer
from .flags import with_flags

err_console = Console(stderr=True, soft_wrap=True)


def one_line(message: str) -> str:
    """A message as the one line the boundary promises: a library's multi-line reason joined with "; ",
    and a line that quotes something huge (a 2 MB recipe value) cut in the middle."""
    return shorten("; ".join(part.strip() for part in message.splitlines() if part.strip()))


def os_error_line(exc: OSError) -> str:
    """`PATH: reason` for a file-system error; when a path component is a regular file where a folder
    is needed (`--out afile/sub`), says which one, since the OS reason alone ("Not a directory") does not.
    A full disk also says what is intact: every file tfkit replaces is written to a temporary name that
    is removed on failure, so whatever existed before is as it was."""
    if is_disk_full(exc):
        return disk_full(exc, "nothing was replaced: what was being written went to a temporary name, now "
                              "removed, and every file that existed before is intact").args[0]
    if exc.filename is None:
        return one_line(str(exc))
    where = f"{exc.filename} -> {exc.filename2}" if exc.filename2 is not None else str(exc.filename)
    line = f"{where}: {exc.strerror or type(exc).__name__}"
    if isinstance(exc, (FileExistsError, NotADirectoryError)) and isinstance(exc.filename, str):
        path = Path(exc.filename)
        blocker = next((p for p in (path, *path.parents) if p.exists()), None)  # nearest thing that is there
        if blocker is not None and not blocker.is_dir():
            line += " (a file, not a folder)" if blocker == path else f" ({blocker} is a file, not a folder)"
    return line


def usage_line(exc: TyperException) -> str:
    """A command-line mistake (a missing argument, an unknown option, `--kv-heads two`) as one line that
    says where to look, instead of a usage block and a framed box."""
    where = getattr(exc, "ctx", None)
    hint = f" (see '{where.command_path} -h')" if where is not None else ""
    return one_line(exc.format_message().rstrip(".")) + hint


class _CommandContext(typer.Context):
    """Keeps the innermost command being run in the shared `meta`, so the boundary, which sees the error
    only after that command's context has closed, knows whose flags to name."""

    def __init__(self, command, *args, **kwargs):
        super().__init__(command, *args, **kwargs)
        self.meta["tfkit.command"] = command


def record_running(command) -> None:
    """Give `command` and every subcommand below it the `_CommandContext`."""
    command.context_class = _CommandContext
    for sub in getattr(command, "commands", {}).values():
        record_running(sub)


def _print_error(message: str) -> None:
    err_console.print(f"[bold red]error:[/bold red] {escape(message)}", highlight=False)


def unwrap(text: str | None) -> str | None:
    """A docstring's paragraphs as one line each, for the help to wrap at the terminal's width: Typer keeps
    the docstring's own line breaks, which at 80 columns leave a short ragged line after each one, and at
    120 a column as narrow as the source. A line starting with "- " stays a line of its own (a list)."""
    if text is None:
        return None
    paragraphs = inspect.cleandoc(text).split("\n\n")
    return "\n\n".join(re.sub(r"\n(?!- )", " ", p) for p in paragraphs)


def unwrap_help(command) -> None:
    """`unwrap` the help of a command, its options and arguments, and every subcommand below it."""
    command.help = unwrap(command.help)
    for param in command.params:
        if getattr(param, "help", None):
            param.help = unwrap(param.help)
    for sub in getattr(command, "commands", {}).values():
        unwrap_help(sub)


class _Group(TyperGroup):
    """Catches user errors from any subcommand and turns them into one line and exit code 2."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        unwrap_help(self)  # Typer builds the subcommands first, so the whole tree is here
        record_running(self)

    def make_context(self, info_name, args, parent=None, **extra):
        """The top level's own options (`tfkit --bogus`) are parsed here, before `invoke`."""
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except TyperException as exc:
            _print_error(usage_line(exc))
            raise typer.Exit(2) from None

    def invoke(self, ctx: typer.Context):
        try:
            return super().invoke(ctx)
        except BrokenPipeError:  # `tfkit generate ... | head -1` closed stdout early: not an error to report
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the exit flush must not fail too
            raise typer.Exit(141) from None  # 128 + SIGPIPE, what `yes | head` reports
        except KeyboardInterrupt:  # Ctrl-C outside training (which saves and exits 130 itself), e.g. importing torch
            raise typer.Exit(130) from None
        except TyperException as exc:  # a subcommand's arguments, parsed here
            _print_error(usage_line(exc))
            raise typer.Exit(2) from None
        except (TfkitError, OSError) as exc:
            if ctx.meta.get("tfkit.debug"):
                raise
            command = ctx.meta.get("tfkit.command")
            _print_error(one_line(os_error_line(exc) if isinstance(exc, OSError) else with_flags(exc, command)))
            raise typer.Exit(2) from None


app = typer.Typer(
    cls=_Group,
    name="tfkit",
    help="From raw text to a trained, evaluated Transformer.",
    context_settings={"help_option_names": ["-h", "--help"]},
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


_python_showwarning = warnings.showwarning


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """tfkit's own warnings (a corpus with invalid UTF-8, an HF option dropped) are news for the user:
    one yellow line, without the Python file and source line that made them look like a crash. Other
    libraries' warnings keep Python's format, which is what their authors expect to be reported."""
    if category.__module__.split(".")[0] == "tfkit":
        err_console.print(f"[bold yellow]warning:[/bold yellow] {escape(str(message))}", highlight=False)
    else:
        _python_showwarning(message, category, filename, lineno, file, line)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"tfkit {__version__}")
        raise typer.Exit()


@app.callback()
def _global(
    ctx: typer.Context,
    debug: Annotated[bool, typer.Option("--debug", help="Show the full traceback of errors.")] = False,
    version: Annotated[
        bool, typer.Option("--version", callback=_print_version, is_eager=True, help="Print the version.")
    ] = False,
) -> None:
    """From raw text to a trained, evaluated Transformer."""
    ctx.meta["tfkit.debug"] = debug
    warnings.showwarning = _show_warning


app.command("train-tokenizer")(tokenizer.train_tokenizer)
app.command("pretrain")(pretrain.pretrain)
app.command("plan")(plan.plan)
app.command("finetune")(finetune.finetune)
app.command("eval")(evaluate.evaluate)
app.command("generate")(generate.generate)
app.command("predict")(predict.predict)
app.command("convert-mqa-to-gqa")(convert.convert_mqa_to_gqa)
app.command("consolidate")(consolidate.consolidate)
app.command("import-hf")(hf.import_hf)
app.command("export-hf")(hf.export_hf)
app.command("export-gguf")(hf.export_gguf)
app.add_typer(recipes.app, name="recipes")
app.add_typer(lab.app, name="lab")


def main() -> None:
    app()
