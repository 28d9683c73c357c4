"""Does a run fit the device's memory? The check every run given by hand passes before training (`check_fits`),
and the pieces a plan chooses a micro-batch with: how a recipe lays its updates out (`layout_of`) and the
fewest micro-batches of a batch that fit (`fitting_accum`), against the memory a run may use per device
(`default_memory_limit`, or a `--memory` size read by `parse_memory`). The estimate itself is
trainer/memory.py's; shared by the pretraining plan (trainer/plan.py) and the fine-tuning plan
(trainer/finetune_plan.py)."""

from __future__ import annotations

import re

from ..errors import ConfigError
from ..models.config import ModelConfig
from .memory import Layout, MemoryEstimate, estimate_memory, gib
from .recipe import Recipe


def layout_of(recipe: Recipe, grad_accum: int, batch_size: int, processes: int, device: str) -> Layout:
    """How `recipe` lays its updates out (memory.Layout) at a given batch and accumulation."""
    t, fused = recipe.train, recipe.objective.fused_loss
    precision = t.precision if t.precision != "auto" else "fp32" if device == "cpu" else "bf16"  # optim's auto
    return Layout(micro_batch=max(1, batch_size // grad_accum // processes), seq_len=recipe.data.seq_len,
                  objective=recipe.objective.name, optimizer=recipe.optim.name, precision=precision,
                  grad_accum=grad_accum, activation_checkpointing=t.activation_checkpointing, processes=processes,
                  distributed=t.distributed, fused_loss=fused == "on" or (fused == "auto" and device == "cpu"),
                  device=device)


def fitting_accum(recipe: Recipe, cfg: ModelConfig, batch_size: int, limit: int, processes: int, device: str,
                  fixed: int | None = None) -> tuple[int, MemoryEstimate]:
    """The fewest micro-batches of `batch_size` whose update fits `limit` (or `fixed`), with its estimate."""
    options = [fixed] if fixed else [a for a in range(1, batch_size + 1) if batch_size % a == 0]
    for accum in options:
        memory = estimate_memory(cfg, layout_of(recipe, accum, batch_size, processes, device))
        if memory.peak <= limit:
            return accum, memory
    return options[-1], memory


def default_memory_limit(device: str) -> int:
    """The bytes a run may use per device: this machine's memory (a CPU) less a fifth for everything else,
    or the GPU's less its CUDA context."""
    if device == "cpu":
        from ..runtime import machine_memory  # noqa: PLC0415

        return int(machine_memory() * 0.8)
    import torch  # noqa: PLC0415

    from .memory import CUDA_CONTEXT  # noqa: PLC0415

    return torch.cuda.get_device_properties(torch.device(device)).total_memory - CUDA_CONTEXT


_MEMORY = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(k|m|g|t)i?b?\s*$", re.IGNORECASE)


def parse_memory(value: str, key: str = "memory") -> int:
    """Bytes in `512MiB`, `8GiB`, `8G` or `1.5TB` (binary units); one line naming `key` otherwise."""
    match = _MEMORY.match(str(value))
    if not match:
        raise ConfigError(f"{key}: got {value!r}, expected a size such as 512MiB or 8GiB", params=(key,))
    number, unit = float(match.group(1)), match.group(2).lower()
    return int(number * 2 ** (10 * "kmgt".index(unit) + 10))


def check_fits(recipe: Recipe, device: str, processes: int = 1, limit: int | None = None,
               cfg: ModelConfig | None = None) -> None:
    """A recipe given by hand whose predicted peak memory exceeds the device's is refused before training,
    with the accumulation that fits at its batch (or the plan, where none does). `cfg`: the model, where it
    is not the recipe's keys' (a fine-tuning run's checkpoint)."""
    kind = device.split(":")[0]
    limit = default_memory_limit(device) if limit is None else limit
    if cfg is None:
        cfg = recipe.model.config(recipe.model.vocab_size or recipe.tokenizer.vocab_size)
    t = recipe.train
    need = estimate_memory(cfg, layout_of(recipe, t.grad_accum, t.batch_size, processes, kind))
    if need.peak <= limit:
        return
    accum, fits = fitting_accum(recipe, cfg, t.batch_size, limit, processes, kind)
    other = ("a smaller checkpoint in train.init_from, or a device with more memory, does" if recipe.head_task
             else "`tfkit plan RECIPE --time T` chooses a model that does")
    instead = (f"train.grad_accum={accum} fits (micro-batch {t.batch_size // accum // processes}, {gib(fits.peak)})"
               if fits.peak <= limit else f"no micro-batch of this model fits: {other}")
    raise ConfigError(f"model: this run's predicted peak memory is {need.line()} per device at micro-batch "
                      f"{t.batch_size // t.grad_accum // processes}, above the {gib(limit)} this {kind} may use; "
                      f"{instead}")
