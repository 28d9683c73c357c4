"""`tfkit convert-mqa-to-gqa CKPT --kv-heads G --out DIR`: regroup a checkpoint's key/value heads.

The conversion is `tfkit.models.convert.convert_checkpoint` (around the pure `regroup_kv_heads`); this
module only does what a command must: resolve the input, refuse to write over it or over an existing
folder before any work, score before and after, and report what changed. A
source without tokenizer.json still converts, with a warning on stderr: the weights are valid, but
`generate` and `eval` cannot read text with the result until a tokenizer is copied in.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..errors import CheckpointError, ConfigError, DataError
from ..progress import console as output_console
from ..replacing import TFKIT_MODEL, check_new_folder, check_not_an_input
from ..runtime import pick_device
from ..threads import set_threads
from .options import Device

if TYPE_CHECKING:
    import torch

err = Console(stderr=True, highlight=False, soft_wrap=True)


def score(folder: Path, data: str, max_tokens: int, device: torch.device) -> dict:
    """`tfkit eval`'s metrics of `folder` on `data`, at the length the checkpoint was trained at. Too little
    text is reported as such: eval's own advice (a smaller --seq-len or --batch-size) names options that
    convert does not have."""
    from ..evaluation.evaluate import EvalRequest, TooLittleText, evaluate

    started = time.perf_counter()
    try:
        result = evaluate(folder, data, EvalRequest(max_tokens=max_tokens, device=device))
    except TooLittleText as exc:
        raise DataError(f"--eval-data {data}: too little text to score one sequence of {exc.seq_len} tokens "
                        f"(the length {folder} was trained at); give more text") from None
    err.print(f"scored {folder}: loss {result['loss']:.4f}, {time.perf_counter() - started:.1f} s")  # plain progress
    return result


def layout(kv_heads: int, n_heads: int) -> str:
    name = "MHA" if kv_heads == n_heads else "MQA" if kv_heads == 1 else f"GQA-{kv_heads}"
    return f"{kv_heads} ({name})"


def report(rows: list[tuple[str, str, str]], title: str) -> Table:
    table = Table(title=title)
    table.add_column("")
    table.add_column("before", justify="right")
    table.add_column("after", justify="right")
    for row in rows:
        table.add_row(*row)
    return table


def convert_mqa_to_gqa(
    checkpoint: Annotated[str, typer.Argument(help="Checkpoint folder, or a run folder (its latest checkpoint).")],
    kv_heads: Annotated[int, typer.Option("--kv-heads", "-g", help="Key/value heads after conversion: "
                                          "1 = MQA, n_heads = MHA, a divisor of n_heads = GQA.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="New checkpoint folder to write (never the input).")],
    method: Annotated[str, typer.Option("--method", help="mean (the paper) | first | random: how a group of "
                                        "K/V heads becomes one; growing the count always copies heads.")] = "mean",
    seed: Annotated[int, typer.Option("--seed", help="Seed of --method random.")] = 0,
    eval_data: Annotated[Optional[str], typer.Option("--eval-data", help="Corpus (as in `tfkit eval --data`) to "
                                                     "measure the validation loss before and after.")] = None,
    eval_tokens: Annotated[int, typer.Option("--eval-tokens", help="Tokens scored by --eval-data.")] = 65_536,
    force: Annotated[bool, typer.Option("--force", help="Replace --out if it exists (never the input).")] = False,
    device: Device = "auto",
) -> None:
    """Convert a checkpoint's attention to another number of key/value heads: MHA -> GQA -> MQA and back.

    Following Ainslie et al. (2023), each group of consecutive K/V heads is mean-pooled into one
    (`--method mean`; `first` keeps the first head, `random` re-initialises), in every attention block.
    Going to more K/V heads (MQA -> GQA -> MHA) copies each head to its group, so the model computes
    exactly the same function. The result is a complete checkpoint folder (weights, config.json with the
    new n_kv_heads and its provenance, tokenizer) that every command accepts. Pooling loses a little
    quality; recover it by uptraining for 5% of the source's steps: the command printed at the end
    (`tfkit pretrain gqa-uptrain --set train.init_from=DIR ...`) sets them.
    """
    from ..checkpoints.convert import convert_checkpoint
    from ..checkpoints.folders import resolve_checkpoint
    from ..checkpoints.record import CheckpointRecord
    from ..models import kv_cache_bytes_per_token
    from ..models.convert import attention_params

    folder = resolve_checkpoint(checkpoint)
    check_new_folder(out, [Path(checkpoint), folder], force, replaces=(TFKIT_MODEL,))
    check_not_an_input(out, [eval_data] if eval_data else [], "--out", CheckpointError)  # scored after writing
    if eval_tokens < 1:
        raise ConfigError(f"--eval-tokens must be >= 1, got {eval_tokens}")
    has_tokenizer = (folder / "tokenizer.json").is_file()
    if eval_data is not None and not has_tokenizer:
        raise ConfigError(f"--eval-data: {folder} has no tokenizer.json to tokenize the data with")
    torch_device = pick_device(device)  # where --eval-data is scored
    set_threads()  # the cores the machine's load leaves free
    if eval_data is not None:  # first: data that cannot be scored fails before --out is written
        before = score(folder, eval_data, eval_tokens, torch_device)
    model, new_model = convert_checkpoint(folder, out, kv_heads, method, seed)
    cfg, new_cfg = model.config, new_model.config

    bytes_before, bytes_after = (kv_cache_bytes_per_token(c) for c in (cfg, new_cfg))
    rows = [
        ("key/value heads", layout(cfg.kv_heads, cfg.n_heads), layout(new_cfg.kv_heads, new_cfg.n_heads)),
        ("parameters", f"{model.num_params():,}", f"{new_model.num_params():,}"),
        ("attention parameters", f"{attention_params(model):,}", f"{attention_params(new_model):,}"),
        ("KV-cache bytes / token (bf16)", *((f"{b:,}" if cfg.arch != "bert" else "- (encoder)")
                                            for b in (bytes_before, bytes_after))),
    ]
    if eval_data is not None:
        after = score(out, eval_data, eval_tokens, torch_device)
        rows.append(("validation loss", f"{before['loss']:.4f}", f"{after['loss']:.4f}"))
        rows.append(("perplexity", f"{before['perplexity']:.2f}", f"{after['perplexity']:.2f}"))
    console = output_console()
    console.print(f"{folder} -> {out} (--method {method})", highlight=False, markup=False, soft_wrap=True)
    console.print(report(rows, "convert-mqa-to-gqa"), highlight=False)
    source_steps = CheckpointRecord.read(out).prior_steps  # the source's steps (and its own source's)
    command = uptrain_command(out, new_cfg, source_steps)  # printed on one line: it stays copy-pasteable
    console.print(f"wrote {out}; uptrain it with: {command}", highlight=False, markup=False, soft_wrap=True)
    if not has_tokenizer:
        err.print(f"[bold yellow]warning:[/bold yellow] {escape(str(folder))} has no tokenizer.json, so "
                  f"{escape(str(out))} has none either: `tfkit generate` and `tfkit eval` need one there "
                  "(copy the run's tokenizer files in)")


# the library's name for --kv-heads, for its errors to name the flag
convert_mqa_to_gqa.library_params = {"new_kv_heads": "kv_heads"}


def uptrain_command(out: Path, cfg, source_steps: int | None = None) -> str:
    """`tfkit pretrain gqa-uptrain --set train.init_from=OUT` plus a `--set model.KEY=VALUE` for every model
    key where the bundled recipe (gpt-tiny with 2 K/V heads) differs from this checkpoint (the trainer
    refuses a recipe whose model contradicts the checkpoint it starts from), and the run's length for a
    source of `source_steps` updates (`uptrain_steps`)."""
    from ..trainer.recipe import load_recipe

    overrides = uptrain_overrides(out, cfg) + uptrain_steps(source_steps, load_recipe("gqa-uptrain"))
    return " ".join(["tfkit pretrain gqa-uptrain", *(f"--set {item}" for item in overrides)])


UPTRAIN_FRACTION = 0.05  # Ainslie et al. (2023): uptraining for 5% of the original pretraining steps


def uptrain_overrides(out: Path, cfg) -> list[str]:
    """The `SECTION.KEY=VALUE` overrides that point the bundled gqa-uptrain recipe at the checkpoint `out`
    of config `cfg`: train.init_from, every model key the trainer would find contradicting, the objective."""
    from ..trainer.recipe import OBJECTIVE_FOR_ARCH, load_recipe
    from ..trainer.source import MAY_DIFFER

    recipe = load_recipe("gqa-uptrain")
    wanted = recipe.model.config(cfg.vocab_size)
    skip = set(MAY_DIFFER) | {"pad_token_id"}
    sets = [f"train.init_from={out}"]
    sets += [f"model.{f.name}={_yaml(getattr(cfg, f.name))}" for f in dataclasses.fields(cfg)
             if f.name not in skip and getattr(wanted, f.name) != getattr(cfg, f.name)]
    if OBJECTIVE_FOR_ARCH[cfg.arch] != recipe.objective.name:
        sets.append(f"objective.name={OBJECTIVE_FOR_ARCH[cfg.arch]}")
    return sets


def uptrain_steps(source_steps: int | None, recipe) -> list[str]:
    """`train.max_steps` at 5% of the steps the source had trained (the recipe's 15 are 5% of gpt-tiny's
    300 only), with validation every third of the run and one checkpoint at its end, as the recipe does
    for its 15; no override where the source's steps are unknown (an imported HuggingFace model)."""
    if not isinstance(source_steps, int) or isinstance(source_steps, bool) or source_steps < 1:
        return []
    steps = max(1, round(UPTRAIN_FRACTION * source_steps))
    t = recipe.train
    wanted = {"train.max_steps": (t.max_steps, steps), "train.eval_every": (t.eval_every, max(1, round(steps / 3))),
              "train.save_every": (t.save_every, steps),
              "schedule.warmup_steps": (recipe.schedule.warmup_steps, min(recipe.schedule.warmup_steps, steps - 1))}
    return [f"{key}={new}" for key, (old, new) in wanted.items() if new != old]


def _yaml(value) -> str:
    """A value as `--set` parses it (YAML): null, true/false, numbers and bare words."""
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)
