"""Building a model without memory and filling it from a file: parameters on the meta device, then the file's
tensors made its parameters (`assign_weights`), so a checkpoint's weights are allocated once, by reading it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from ..errors import CheckpointError


@contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Modules built inside get each parameter moved to the meta device as they register it: the weights
    take no memory and their initialisers compute nothing, while buffers are built as usual."""
    register = nn.Module.register_parameter

    def on_meta(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        if param is not None and param.device.type != "meta":
            param = nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)
        register(module, name, param)

    nn.Module.register_parameter = on_meta  # type: ignore[method-assign]
    try:
        with SkipMetaInit():
            yield
    finally:
        nn.Module.register_parameter = register  # type: ignore[method-assign]


# What modules run to fill their parameters at construction: nn.init's functions and the in-place tensor
# ops they and modules' own `reset_parameters` use. All of them set values and keep the shape.
INITIALISERS = frozenset({
    "uniform_", "normal_", "trunc_normal_", "constant_", "ones_", "zeros_", "eye_", "dirac_", "xavier_uniform_",
    "xavier_normal_", "kaiming_uniform_", "kaiming_normal_", "orthogonal_", "sparse_",  # nn.init
    "zero_", "fill_", "copy_", "mul_", "add_", "sub_", "div_", "clamp_", "erfinv_", "exponential_", "bernoulli_",
    "random_", "log_normal_", "cauchy_", "geometric_", "fill_diagonal_",  # Tensor methods
})


class SkipMetaInit(TorchFunctionMode):
    """Initialisers (`INITIALISERS`) on meta tensors return their tensor untouched. There is nothing to
    compute, and on meta tensors torch runs random initialisers through its reference implementations,
    whose first call imports TorchDynamo: 1.2 s of every load. Any other op runs as usual."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        target = args[0] if args else kwargs.get("tensor")  # nn.init's functions pass it by keyword
        if getattr(func, "__name__", "") in INITIALISERS and isinstance(target, torch.Tensor) and target.is_meta:
            return target
        return func(*args, **kwargs)


def assign_weights(model: nn.Module, state: dict[str, torch.Tensor], source: Path, what: str) -> None:
    """Make `state`'s tensors (in their own dtype) the parameters of a model built on the meta device, strictly (one
    CheckpointError line naming the first mismatch, as `load_weights_into`), then tie what the model
    ties. A file stores a tied matrix once (safetensors drops the other names), so every name of a tied
    group is filled from whichever one the file holds."""
    groups: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(param), []).append(name)
    full = dict(state)
    for names in groups.values():
        present = next((state[n] for n in names if n in state), None)
        if present is not None:
            full.update({n: present for n in names})
    try:
        model.load_state_dict(full, strict=True, assign=True)
    except RuntimeError as err:
        raise CheckpointError(f"{source}: does not hold the weights of {what} ({first_problem(err)})") from err
    for names in groups.values():  # assign gave each name its own Parameter: one object per tied group
        first = model.get_parameter(names[0])
        for name in names[1:]:
            owner, _, attr = name.rpartition(".")
            setattr(model.get_submodule(owner), attr, first)


def first_problem(err: Exception) -> str:
    """The first line of a load error that names a tensor, and how many more there are."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    problems = [line for line in lines if line.startswith(("size mismatch", "Missing key", "Unexpected key"))]
    return lines[0] if not problems else problems[0] + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else "")

