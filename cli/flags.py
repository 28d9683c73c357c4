"""A library error as a command's user reads it: the parameters it names spelled as the command's flags.

The library names its own parameters (`top_k must be >= 1`), since it is called from Python too; a command
knows its options from Typer (the parameter `top_k` is the option `--top-k`), and a command that passes a
library parameter under another name says so in its function's `library_params` (convert-mqa-to-gqa's
`--kv-heads` is `regroup_kv_heads`'s `new_kv_heads`: `{"new_kv_heads": "kv_heads"}`).
"""

from __future__ import annotations

from ..errors import TfkitError, rename_params


def flag_names(command) -> dict[str, str]:
    """Parameter name -> the command's long flag (`top_k` -> `--top-k`), and each library parameter the
    command passes under another name (its callback's `library_params`) -> that option's flag."""
    flags = {param.name: next((o for o in param.opts if o.startswith("--")), param.opts[0])
             for param in command.params if param.param_type_name == "option" and param.name}
    renamed = getattr(command.callback, "library_params", {})
    return {**flags, **{library: flags[option] for library, option in renamed.items()}}


def with_flags(exc: TfkitError, command) -> str:
    """`exc`'s message with the parameters it names (`exc.params`) spelled as `command`'s flags; as it is
    where a parameter is not one of the command's options, or there is no command."""
    names = flag_names(command) if command is not None else {}
    return rename_params(str(exc), {p: names[p] for p in exc.params if p in names})
