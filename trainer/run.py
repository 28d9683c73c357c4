"""`tfkit pretrain`: recipe → run folder → tokenizer → token shards → model → training → final report.

This module only orchestrates; each step lives in its own component (tokenization, models, optim,
objectives, checkpoint, loop, validate, metrics). Rank 0 does everything that writes files (run folder,
tokenizer training, token-shard cache) while the other ranks wait at a barrier, then every rank builds
the same model from the same seed and trains its slice of each batch.

Where a run starts from:
- fresh: weights from `train.seed`, tokenizer trained (or copied from `tokenizer.path`);
- `--resume auto|PATH`: the checkpoint's weights, optimizer, step, data position and RNG; exact;
- `train.init_from`: a *new* run whose weights, model config and tokenizer come from a checkpoint (e.g.
  GQA uptraining after `tfkit convert-mqa-to-gqa`); optimizer and step start from zero.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from ..models import build_model
from ..models.io import resolve_checkpoint
from ..tokenization.train import TfkitTokenizer, check_vocab_fits, load_tokenizer
from . import checkpoint as ckpt
from .data import build_datasets, prepare_tokenizer
from .distributed import (DistInfo, apply_activation_checkpointing, barrier, broadcast_object, init_distributed,
                          shutdown, wrap)
from .loop import Loop, TrainState, micro_batch_size, run_loop
from .metrics import MetricsWriter, peak_flops, plot_loss
from .objectives import LossModule, compile_loss_module, unreached_parameters
from .optim import build_optimizer, grad_scaler
from .recipe import Recipe
from .validate import EvalResult, evaluate

console = Console()


@dataclass
class RunResult:
    run_dir: Path
    state: TrainState
    final: EvalResult | None  # None when the run was interrupted
    checkpoint: Path | None  # the last checkpoint written
    wall_time: float
    sample: str | None = None

    @property
    def interrupted(self) -> int:
        """The signal number that stopped the run (SIGINT 2, SIGTERM 15), 0 if it finished."""
        return self.state.interrupted


def pretrain(recipe: Recipe, run_dir: str | Path | None = None, resume: str | None = None) -> RunResult:
    """Run a recipe end to end; see the module docstring. Works alone or under torchrun."""
    info = init_distributed(recipe.train.device)
    try:
        result = _pretrain(recipe, run_dir, resume, info)
        # Leave together: rank 0 still writes the report and the plot after the last collective, and a
        # rank that tears its connections down meanwhile can abort in gloo's threads.
        barrier(info)
        return result
    finally:
        shutdown(info)


def _pretrain(recipe: Recipe, run_dir_arg: str | Path | None, resume: str | None, info: DistInfo) -> RunResult:
    start = time.perf_counter()
    if info.device.type == "cuda":  # fp32 matmuls on the tensor cores (TF32), as nanoGPT and litgpt train
        torch.set_float32_matmul_precision("high")
    run_dir = Path(broadcast_object(str(ckpt.choose_run_dir(recipe, run_dir_arg, resume)) if info.is_main else None, info))
    resume_from = ckpt.find_resume(run_dir, resume)
    if resume_from is not None:
        ckpt.check_tokenizer_kept(recipe, resume_from)
    init_from = None if resume_from or not recipe.train.init_from else resolve_checkpoint(recipe.train.init_from)
    source = resume_from or init_from  # the checkpoint that supplies model config and tokenizer
    if source is not None:  # a recipe contradicting the checkpoint fails on every rank, before any folder
        ckpt.model_config(recipe, None, source)
    if info.is_main:
        ckpt.check_run_dir(run_dir, fresh=resume_from is None)
        run_dir.mkdir(parents=True, exist_ok=True)
        prepare_tokenizer(recipe, run_dir / "tokenizer", source, console)
    barrier(info)
    tokenizer = load_tokenizer(run_dir / "tokenizer")
    cfg = ckpt.model_config(recipe, tokenizer, source)
    check_vocab_fits(tokenizer, cfg.vocab_size)
    train_data, valid_data = build_datasets(recipe, tokenizer, run_dir, info, console)

    torch.manual_seed(recipe.train.seed)
    model = build_model(cfg)
    if source is not None:
        ckpt.load_weights(model, source)
    model.to(info.device)
    for param in unreached_parameters(model, recipe.objective.name):
        param.requires_grad_(False)
    if recipe.train.activation_checkpointing:
        apply_activation_checkpointing(model)
    loss_module = LossModule(model, recipe.objective)
    if recipe.train.compile:
        compile_loss_module(loss_module)
    train_module = wrap(loss_module, recipe.train.distributed, info)
    optimizer = build_optimizer(model, recipe.optim, info.device)
    scaler = grad_scaler(recipe.train.precision, info.device)
    state = TrainState()
    trainer_state = ckpt.load_trainer_state(resume_from) if resume_from else None
    if trainer_state is not None:
        ckpt.load_optimizer(model, optimizer, trainer_state["optimizer"], recipe.train.distributed, info.enabled)
        if trainer_state["scaler"]:  # empty when the checkpoint was not fp16: keep the fresh scaler
            scaler.load_state_dict(trainer_state["scaler"])
        state = TrainState.from_dict(trainer_state["state"])
        state.interrupted = 0

    metrics = MetricsWriter(run_dir, info.is_main, recipe.log.tensorboard, state.step if resume_from else None)
    eval_bs = recipe.eval.batch_size or micro_batch_size(recipe)
    last: list[Path | None] = [resume_from]
    extra = {"objective": recipe.objective.name, "recipe": recipe.name, "train_seq_len": recipe.data.seq_len}
    if recipe.objective.name == "seq2seq":  # what `tfkit eval` reads pairs with
        extra["pair_fields"] = [recipe.data.source_field, recipe.data.target_field]

    def save(s: TrainState) -> Path | None:
        payload = {"state": s.to_dict(), "rng": ckpt.rng_state(), "scaler": scaler.state_dict(),
                   "optimizer": ckpt.optimizer_state(model, optimizer, recipe.train.distributed, info.enabled)}
        weights = ckpt.full_weights_model(model, cfg, recipe.train.distributed, info.enabled, info.is_main)
        if info.is_main:
            last[0] = ckpt.save_checkpoint(run_dir, s.step, weights, payload, run_dir / "tokenizer", extra,
                                           recipe.train.keep_last)
        barrier(info)
        return last[0]

    def validate(step: int) -> dict:
        row = evaluate(train_module, valid_data, recipe.eval.batches, eval_bs, info, recipe.train.precision).row(step)
        metrics.log(row)
        return row

    per_token = model.flops_per_token(recipe.data.seq_len)
    if recipe.objective.name == "seq2seq":
        per_token /= 2  # the model counts a (source, target) token pair; the loop counts both tokens
    loop = Loop(recipe, model, train_module, optimizer, scaler, train_data, info, metrics.log, save, validate,
                flops_per_token=per_token,
                peak_flops=(peak_flops(torch.cuda.get_device_name(info.device), recipe.train.precision)
                            if info.device.type == "cuda" else None),
                state=state)
    if info.is_main:  # only now that the whole setup succeeded: a refused run leaves recipe.yaml as it was
        resumed_step, changes = ckpt.write_recipe(run_dir, recipe, resume_from)
        if changes:
            console.print(f"warning: the recipe changed since step {resumed_step} (the one that trained up to it "
                          f"is kept as recipe-before-step-{resumed_step}.yaml): " + "; ".join(changes),
                          style="yellow", markup=False, highlight=False)
        _describe(recipe, model, cfg, info, run_dir, resume_from, init_from)
    result = RunResult(run_dir, state, None, resume_from, 0.0)
    try:
        if trainer_state is not None:
            ckpt.set_rng_state(trainer_state["rng"])  # last: everything above may draw random numbers
        else:
            validate(0)  # the untrained baseline every curve starts from
        steps_before, tokens_before, train_start = state.step, state.tokens, time.perf_counter()
        run_loop(loop, last_checkpoint=lambda: last[0])
        train_time = time.perf_counter() - train_start
        if state.step > steps_before or state.interrupted or not last[0]:
            save(state)
        result.checkpoint = last[0]
        if not state.interrupted:
            result.final = evaluate(train_module, valid_data, recipe.eval.batches, eval_bs, info,
                                    recipe.train.precision)
            if state.step > steps_before or trainer_state is None:  # a finished run's final row is logged
                metrics.log(result.final.row(state.step))
            if recipe.model.arch == "gpt" and recipe.eval.sample_prompt:
                whole = ckpt.full_weights_model(model, cfg, recipe.train.distributed, info.enabled, info.is_main)
                if info.is_main:  # FSDP: a CPU copy assembled from the shards, so rank 0 decodes alone
                    result.sample = _sample(whole.to(info.device), tokenizer, recipe)
    finally:
        metrics.close()
    result.wall_time = time.perf_counter() - start
    if info.is_main:
        if recipe.log.plot and plot_loss(run_dir / "metrics.jsonl", run_dir / "loss.png"):
            console.print(f"loss curve: {run_dir / 'loss.png'}", highlight=False)
        trained = state.tokens - tokens_before
        _report(result, model, trained / max(train_time, 1e-9) if trained else None)
    return result


def _describe(recipe: Recipe, model, cfg, info: DistInfo, run_dir: Path, resume_from, init_from) -> None:
    """What is about to run, including the global batch in tokens (the number that sets the LR)."""
    t = recipe.train
    per_rank = micro_batch_size(recipe) // info.world_size
    per_sequence = recipe.data.seq_len * (2 if recipe.objective.name == "seq2seq" else 1)  # source + target
    console.print(
        f"[bold]{recipe.name}[/bold]: {cfg.arch} {model.num_params() / 1e6:.2f}M params "
        f"(d_model {cfg.d_model}, {cfg.n_layers} layers, {cfg.n_heads} heads / {cfg.kv_heads} kv), "
        f"vocab {cfg.vocab_size}, {recipe.objective.name}, {t.precision} on {info.device}"
        + (f" x{info.world_size} ({t.distributed})" if info.enabled else ""), highlight=False)
    console.print(
        f"global batch {t.batch_size} x {per_sequence}{' (source + target)' if per_sequence > recipe.data.seq_len else ''}"
        f" = {t.batch_size * per_sequence:,} tokens "
        f"({t.grad_accum} micro-batch(es) of {per_rank} sequences per rank), {t.max_steps} steps, "
        f"{recipe.schedule.name} lr {recipe.optim.lr:g}", highlight=False)
    origin = f"resuming {resume_from}" if resume_from else f"initialised from {init_from}" if init_from else "fresh start"
    console.print(f"run folder {run_dir} ({origin})", highlight=False)
    for warning in recipe.warnings():
        console.print(f"warning: {warning}", style="yellow", markup=False, highlight=False)


def _sample(model, tokenizer: TfkitTokenizer, recipe: Recipe) -> str | None:
    """The trained model continuing `eval.sample_prompt` (causal models only)."""
    from ..models.generation import generate

    prompt = tokenizer.document_prefix() + tokenizer.encode(recipe.eval.sample_prompt)  # framed as in training
    new = generate(model, [prompt], recipe.eval.sample_tokens, temperature=0.8, top_k=40,
                   eos_id=tokenizer.eos_id, seed=recipe.train.seed)[0]
    return recipe.eval.sample_prompt + tokenizer.decode(new)


def _report(result: RunResult, model, tokens_per_sec: float | None) -> None:
    """The final table: what a user compares between runs."""
    table = Table(title=f"pretrain: {result.run_dir.name}", show_header=False)
    table.add_column(style="bold")
    table.add_column(justify="right")
    if result.final is not None:
        table.add_row("validation loss", f"{result.final.loss:.4f}")
        table.add_row("perplexity", f"{result.final.perplexity:.2f}")
        table.add_row("accuracy", f"{100 * result.final.accuracy:.2f}%")
    table.add_row("steps", f"{result.state.step:,}")
    table.add_row("tokens", f"{result.state.tokens:,}")
    table.add_row("tokens / s", "- (no step run)" if tokens_per_sec is None else f"{tokens_per_sec:,.0f}")
    table.add_row("parameters", f"{model.num_params():,}")
    table.add_row("skipped steps", str(result.state.bad_steps))
    table.add_row("wall time", f"{result.wall_time:.1f} s")
    table.add_row("checkpoint", str(result.checkpoint))
    console.print(table)
    if result.sample is not None:
        console.print("[bold]sample:[/bold]", highlight=False)
        console.print(result.sample, highlight=False, markup=False)
    if result.interrupted:
        console.print(f"interrupted: continue with --resume auto --run-dir {result.run_dir}", highlight=False)
