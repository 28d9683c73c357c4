"""What `tfkit pretrain` tells the user: the start block (what is about to run) and the final report.

The start block is also kept in the run folder's start.log (run_folder.append_start_block), so it is
printed into a `progress.Transcript`. The final report is the table a user compares between runs; under
a time budget it says what the budget covered, and after a signal it prints the whole command that
continues the run.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from rich.table import Table

from ..checkpoints.folders import form_of, is_complete
from ..checkpoints.hf_classifier import export_problem
from ..checkpoints.record import CheckpointRecord
from ..errors import TfkitError
from ..layout import BEST
from ..progress import Transcript, console as output_console
from ..tokenization.train import TfkitTokenizer
from .distributed import DistInfo
from .loop import TrainState, micro_batch_size
from .recipe import Recipe
from .run_folder import resume_command
from .task_names import PREFIX, best_key
from .validation import ValidationResult

console = output_console()
SAMPLE_PROMPT_TOKENS = 8  # eval.sample_prompt: auto = this many tokens of the run's own validation text


@dataclass
class RunResult:
    run_dir: Path
    state: TrainState
    final: ValidationResult | None  # None when the run was interrupted
    checkpoint: Path | None  # the last checkpoint written
    wall_time: float  # seconds from the start of `pretrain` to the report
    sample: str | None = None
    tasks: dict[str, float] | None = None  # the final validation's downstream scores (task/NAME/METRIC)

    @property
    def interrupted(self) -> int:
        """The signal number that stopped the run (SIGINT 2, SIGTERM 15), 0 if it finished."""
        return self.state.interrupted


SHARDING = {"ddp": "with the weights and optimizer state whole on every process, gradients all-reduced",
            "fsdp": "with parameters, gradients and optimizer state sharded over the processes, one block "
                    "gathered at a time"}


def describe(recipe: Recipe, model, cfg, info: DistInfo, run_dir: Path, resume_from: Path | None,
             init_from: Path | None, out: Transcript, precision_auto: bool, split: str | None = None) -> None:
    """What is about to run, including the global batch in tokens (the number that sets the LR) and `split`, how
    the processes share it (batch_plan.BatchPlan.describe; by default the recipe's micro-batches per rank)."""
    t = recipe.train
    precision = {"fp32": "fp32", "bf16": "bf16 autocast", "fp16": "fp16 autocast"}[t.precision]
    why = f"; train.precision auto: {'' if t.precision == 'bf16' else 'no '}native bf16 on this {info.device.type}"
    per_rank = micro_batch_size(recipe) // info.world_size
    per_sequence = recipe.data.seq_len * (2 if recipe.objective.name == "seq2seq" else 1)  # source + target
    threads = torch.get_num_threads()
    out.print(
        f"[bold]{recipe.name}[/bold]: {cfg.arch} {model.num_params() / 1e6:.2f}M params "
        f"(d_model {cfg.d_model}, {cfg.n_layers} layers{' of one shared block' if cfg.share_layers else ''}, "
        f"{cfg.n_heads} heads / {cfg.kv_heads} kv), "
        f"vocab {cfg.vocab_size}, {recipe.objective.name}, {precision} on {info.device} "
        f"({threads} CPU thread{'s' * (threads != 1)})"
        + (f" x{info.world_size} ({t.distributed}) {SHARDING[t.distributed]}" if info.enabled else "")
        + (why if precision_auto else ""),
        highlight=False)
    if recipe.head_task is not None:  # examples of any length, packed back to back or padded, not fixed rows
        layout = "packed back to back into rows" if recipe.task.packing and cfg.arch != "transformer" else "padded"
        batch = (f"global batch {t.batch_size} examples ({layout} of at most {recipe.data.seq_len} tokens; "
                 f"{split or f'{t.grad_accum} micro-batch(es) of {per_rank} examples per rank'}), ")
    else:
        batch = (f"global batch {t.batch_size} x {per_sequence}"
                 f"{' (source + target)' if per_sequence > recipe.data.seq_len else ''}"
                 f" = {t.batch_size * per_sequence:,} tokens "
                 f"({split or f'{t.grad_accum} micro-batch(es) of {per_rank} sequences per rank'}), ")
    out.print(
        batch
        + (f"as many steps as fit in {t.max_time} of training (at most {t.max_steps:,}; setup and the final "
           "sample come on top), " if t.max_time else f"{t.max_steps} steps, ")
        + f"{recipe.schedule.name} lr {recipe.optim.lr:g}", highlight=False)
    origin = f"resuming {resume_from}" if resume_from else f"initialised from {init_from}" if init_from else "fresh start"
    out.print(f"run folder {run_dir} ({origin})", highlight=False)
    head = getattr(model, "head_config", None)
    problem = None if head is None else export_problem(cfg, head)
    for warning in recipe.warnings() + ([f"this classifier cannot be exported by `tfkit export-hf`: {problem}"]
                                        if problem else []):
        out.print(f"warning: {warning}", style="yellow", markup=False, highlight=False)


def what_ended(state: TrainState, train, planned: int | None = None) -> str:
    """Under train.max_time, what the step count means: the steps that fit in the budget (against the
    updates a plan predicted, when a plan sized the run), or max_steps reached inside it (a fast machine), or
    an interruption."""
    budget = train.max_time
    if budget is None:
        return ""
    if state.interrupted:
        return f" (interrupted, {state.seconds:.0f} s of train.max_time={budget})"
    if state.step >= train.max_steps:
        return f" (train.max_steps={train.max_steps:,} reached in {state.seconds:.0f} s, within train.max_time={budget})"
    if planned:
        return f" ({planned:,} planned; fitted in train.max_time={budget}, {state.seconds:.0f} s)"
    return f" of train.max_steps={train.max_steps:,} (fitted in train.max_time={budget}, {state.seconds:.0f} s)"


PLANNED_SHARE = 0.9  # of a plan's updates: a run that ran fewer is noted (the machine slowed after the plan)


def budget_note(state: TrainState, train, planned: int | None = None) -> str | None:
    """Under a time budget that ended the run before train.max_steps, what its loss means."""
    if train.max_time is None or state.interrupted or state.step >= train.max_steps:
        return None
    if planned:
        if state.step >= PLANNED_SHARE * planned:
            return None  # the steps row says how many ran; a few percent is the plan's own error
        return (f"note: {state.step:,} of the {planned:,} updates planned for train.max_time={train.max_time} ran "
                f"({state.step / planned:.0%}): this machine was slower during the run than when the plan measured "
                "it (other jobs, or a slower clock); the schedule decayed over the updates that ran")
    return (f"note: {state.step:,} of the recipe's {train.max_steps:,} steps fitted in train.max_time={train.max_time} "
            "on this machine; the schedule decayed over those, so the loss is what this machine reaches in the budget "
            "(a faster machine or a longer train.max_time fits more steps and reaches lower)")


def wall_time(result: RunResult, train) -> str:
    """The wall time, and under a time budget what it holds besides the budget's training time."""
    if train.max_time is None:
        return f"{result.wall_time:.1f} s"
    return (f"{result.wall_time:.1f} s (train.max_time counts training, validation and checkpoints; setup "
            "(tokenizer, token cache, model) and the final sample and report come on top)")


def report(result: RunResult, model, tokens_per_sec: float | None, recipe: Recipe) -> None:
    """The final table: what a user compares between runs."""
    command = "finetune" if recipe.head_task else "pretrain"
    table = Table(title=f"{command}: {result.run_dir.name}", show_header=False)
    table.add_column(style="bold")
    table.add_column(justify="right")
    scores = getattr(result.final, "scores", None)
    if scores is not None:  # a fine-tuning run: the task's scores on the validation examples
        table.add_row("validation loss", f"{result.final.loss:.4f}")
        for name, value in scores.items():
            table.add_row(f"validation {name}", f"{value:.4f}")
    elif result.final is not None:
        table.add_row("validation loss", f"{result.final.loss:.4f}")
        table.add_row("perplexity", f"{result.final.perplexity:.2f}")
        table.add_row("accuracy", f"{100 * result.final.accuracy:.2f}%")
        source_rows(table, result.final)
    for key, value in (result.tasks or {}).items():  # eval.tasks / eval.probe at the final validation
        table.add_row(key.removeprefix(PREFIX).replace("/", " "), f"{value:.4f}")
    table.add_row("steps", f"{result.state.step:,}" + what_ended(result.state, recipe.train, recipe.planned))
    table.add_row("tokens", f"{result.state.tokens:,}")
    table.add_row("tokens / s", "- (no step run)" if tokens_per_sec is None else f"{tokens_per_sec:,.0f}")
    table.add_row("parameters", f"{model.num_params():,}")
    table.add_row("skipped steps", str(result.state.bad_steps))
    table.add_row("wall time", wall_time(result, recipe.train))
    for name, text in checkpoint_rows(result, recipe):
        table.add_row(name, text)
    console.print(table)
    if note := budget_note(result.state, recipe.train, recipe.planned):
        console.print(note, highlight=False, markup=False)
    if result.sample is not None:
        console.print("[bold]sample:[/bold]", highlight=False)
        console.print(result.sample, highlight=False, markup=False)
    if result.interrupted:
        console.print(f"interrupted: continue with: {resume_command(result.run_dir)}", highlight=False,
                      markup=False, soft_wrap=True)


def checkpoint_rows(result: RunResult, recipe: Recipe) -> list[tuple[str, str]]:
    """The report's rows naming the run's last checkpoint and its best/ (which step, by what: `best_note`),
    each with its form (single file or sharded: checkpoints.folders.form_of)."""
    last = result.checkpoint
    rows = [("checkpoint", f"{last} ({form_of(last)})" if last is not None else "none")]
    if is_complete(best := result.run_dir / BEST) and (kept := best_note(result.run_dir, recipe)):
        rows.append(("best/", f"{kept}; {form_of(best)}"))
    return rows


def source_rows(table: Table, final: ValidationResult) -> None:
    """Validation per source (a list of sources): the mixed bits per byte, each source's loss and bits per byte."""
    if final.sources is None:
        return
    bpb = final.bits_per_byte
    table.add_row("bits per byte", "-" if bpb is None else f"{bpb:.4f}")
    for name, own in final.sources.items():
        bits = "-" if own.bits_per_byte is None else f"{own.bits_per_byte:.4f}"
        table.add_row(f"  {name}: loss, bits/byte", f"{own.loss:.4f}, {bits}")


def best_note(run_dir: Path, recipe: Recipe) -> str | None:
    """train.keep_best: which step best/ holds and by what (eval.best_by: the validation loss, or a task score,
    recorded as minus the score)."""
    if not recipe.train.keep_best:
        return None
    try:
        record = CheckpointRecord.read(run_dir / BEST)
    except TfkitError:  # none kept (no validation after step 0 beat infinity)
        return None
    if record.val_loss is None:
        return None
    key = best_key(recipe.eval.best_by)
    if recipe.head_task is not None:  # a fine-tuning run keeps its task.metric (trainer/task.py)
        metric = recipe.task.metric_for(recipe.head_task)
        return f"step {record.step:,}, the highest validation {metric} ({-record.val_loss:.4f}; task.metric)"
    if key is None:
        return f"step {record.step:,}, the lowest validation loss ({record.val_loss:.4f})"
    return (f"step {record.step:,}, the highest {key.removeprefix(PREFIX).replace('/', ' ')} "
            f"({-record.val_loss:.4f}; eval.best_by={recipe.eval.best_by})")


def sample_prompt(recipe: Recipe, valid_data, tokenizer: TfkitTokenizer) -> str:
    """`eval.sample_prompt`, where `auto` is the opening of the run's own validation text (its first
    SAMPLE_PROMPT_TOKENS tokens): a phrase of the corpus the model learnt, not of some other corpus.
    An empty prompt starts the sample from the beginning of a document."""
    if recipe.eval.sample_prompt != "auto":
        return recipe.eval.sample_prompt
    batch = next(iter(valid_data.eval_batches(1, 1)), None)
    if batch is None:
        return ""
    return tokenizer.decode(batch["input_ids"][0, :SAMPLE_PROMPT_TOKENS].tolist()).strip()


def sample(model, tokenizer: TfkitTokenizer, recipe: Recipe, valid_data) -> str:
    """The trained model continuing `eval.sample_prompt` (causal models only)."""
    from ..models.framing import continuation, frame_prompt
    from ..models.generation import generate

    text = sample_prompt(recipe, valid_data, tokenizer)
    prompt, _ = frame_prompt(tokenizer, text, "gpt")  # as `tfkit generate` frames it
    new = generate(model, [prompt], recipe.eval.sample_tokens, temperature=0.8, top_k=40,
                   eos_id=tokenizer.eos_id, seed=recipe.train.seed)[0]
    return text + continuation(tokenizer, prompt, new)
