"""`tfkit pretrain`: recipe → run folder → tokenizer → token shards → model → training → final report.

`Trainer` runs one recipe in three stages, each one method: `build` (run folder, tokenizer, datasets,
model, optimizer, resume state), `train` (the baseline validation or the restored RNG, the loop, the last
checkpoint) and `finish` (final validation, sample, plot, report); `save` and `validate` are what the loop
calls back. Each piece of work lives in its own component (tokenization, models, optim, objectives,
parallel, checkpoint, run_folder, loop, validate, metrics); this module only orders them. Rank 0 does
everything that writes files (run folder, tokenizer training, token-shard cache) while the other ranks wait
at a barrier, then every rank builds the same model from the same seed and trains its slice of each batch
with its own dropout masks (`checkpoint.seed_rank`).

Where a run starts from:
- fresh: weights from `train.seed`, tokenizer trained (or copied from `tokenizer.path`);
- `--resume auto|PATH`: the checkpoint's weights, optimizer, step, data position and RNG; exact;
- `train.init_from`: a *new* run whose weights, model config and tokenizer come from a checkpoint (e.g.
  GQA uptraining after `tfkit convert-mqa-to-gqa`); optimizer and step start from zero.
"""

from __future__ import annotations

import contextlib
import gc
import math
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from rich.table import Table

from ..errors import CheckpointError, TfkitError
from ..files import LOCK_FILE, is_disk_full
from ..layout import TRAINER_STATE
from ..models import build_model
from ..models.io import read_config, resolve_checkpoint
from ..progress import Transcript, console as output_console
from ..threads import set_threads
from ..tokenization.train import TfkitTokenizer, check_vocab_fits, load_tokenizer
from . import checkpoint as ckpt
from .budget import TimeBudget, parse_duration
from . import run_folder
from .data import build_datasets, prepare_tokenizer
from .distributed import DistInfo, barrier, broadcast_object, init_distributed, shutdown
from .loop import Loop, TrainingDiverged, TrainState, micro_batch_size, run_loop
from .metrics import MetricsWriter, peak_flops, plot_loss
from .objectives import LossModule, compile_loss_module, unreached_parameters
from .optim import build_optimizer, grad_scaler
from .parallel import Parallel, apply_activation_checkpointing
from .recipe import Recipe
from .trackers import open_tracker
from . import validation
from .validation import ValidationResult

console = output_console()


@dataclass
class RunResult:
    run_dir: Path
    state: TrainState
    final: ValidationResult | None  # None when the run was interrupted
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
    set_threads(recipe.train.threads)  # before any work: torch's default oversubscribes a busy machine
    trainer = Trainer(recipe, info)
    try:
        try:
            trainer.build(run_dir, resume)
        except BaseException:
            trainer.discard_new_run_folder()
            raise
        try:
            trainer.train()
            result = trainer.finish()
        except (TfkitError, OSError) as exc:
            if trainer.checkpoint is None and not isinstance(exc, TrainingDiverged):
                trainer.close()  # e.g. the baseline validation found no batch: nothing of this run is worth keeping
                trainer.discard_new_run_folder()
            if isinstance(exc, OSError) and is_disk_full(exc):  # a full disk names the checkpoint that is intact
                raise run_folder.disk_full_during_run(exc, trainer.run_dir, trainer.checkpoint) from exc
            raise
        # Leave together: rank 0 still writes the report and the plot after the last collective, and a
        # rank that tears its connections down meanwhile can abort in gloo's threads.
        barrier(info)
        return result
    finally:
        trainer.close()
        trainer.lock.close()  # the run folder's lock, held since build
        trainer.release()
        shutdown(info)


class Trainer:
    """One run of a recipe on this process's rank: `build()`, `train()`, `finish()`, in that order."""

    def __init__(self, recipe: Recipe, info: DistInfo) -> None:
        self.recipe, self.info = recipe, info
        self.parallel = Parallel(recipe.train.distributed, info)
        self.started = time.perf_counter()
        self.metrics: MetricsWriter | None = None
        self.checkpoint: Path | None = None  # the last checkpoint written (or resumed from)
        self.run_dir: Path | None = None
        self.made_dirs: list[Path] = []  # run_dir and the parents this process created, deepest first
        self.lock = contextlib.ExitStack()  # rank 0 holds the run folder's lock (files.folder_lock) until the end
        self.lock_created = False  # whether this process made the lock file (a refused start removes it)
        self.start_block = Transcript(console)  # what the run says it will do, also kept in the run folder
        self.precision_auto = False  # whether train.precision was auto before _prepare_run_folder decided it
        self.best_loss: float | None = None  # train.keep_best: the best validation loss so far (read lazily)

    # --- build: everything before the first step ----------------------------------------------------------

    def build(self, run_dir: str | Path | None = None, resume: str | None = None) -> None:
        """Run folder, tokenizer, datasets, model, optimizer and, on resume, the saved trainer state.
        The run folder and the source checkpoint are checked before rank 0 writes anything; recipe.yaml is
        written last, once the whole setup has succeeded."""
        recipe, info = self.recipe, self.info
        if info.device.type == "cuda":  # fp32 matmuls on the tensor cores (TF32), as nanoGPT and litgpt train
            torch.set_float32_matmul_precision("high")
        self._prepare_run_folder(run_dir, resume)
        recipe = self.recipe  # data.train and train.precision resolved against the source checkpoint and device
        self._build_model()
        self._restore()
        tracker = open_tracker(recipe, self.run_dir, bool(self.resume_from)) if info.is_main else None  # log.wandb
        self.metrics = MetricsWriter(self.run_dir, info.is_main, recipe.log.tensorboard,
                                     self.state.step if self.resume_from else None, tracker=tracker)
        per_token = self.model.flops_per_token(recipe.data.seq_len)
        if recipe.objective.name == "seq2seq":
            per_token /= 2  # the model counts a (source, target) token pair; the loop counts both tokens
        self.loop = Loop(recipe, self.model, self.train_module, self.optimizer, self.scaler, self.train_data, info,
                         self.metrics.log, self.save, self.validate, flops_per_token=per_token,
                         peak_flops=(peak_flops(torch.cuda.get_device_name(info.device), recipe.train.precision)
                                     if info.device.type == "cuda" else None),
                         state=self.state)
        if info.is_main:  # only now that the whole setup succeeded: a refused run leaves recipe.yaml as it was
            resumed_step, changes = run_folder.write_recipe(self.run_dir, recipe, self.resume_from)
            if changes:
                console.print(f"warning: the recipe changed since step {resumed_step} (the one that trained up to "
                              f"it is kept as recipe-before-step-{resumed_step}.yaml): " + "; ".join(changes),
                              style="yellow", markup=False, highlight=False)
            _describe(recipe, self.model, self.cfg, info, self.run_dir, self.resume_from, self.init_from,
                      self.start_block, self.precision_auto)
            run_folder.append_start_block(self.run_dir, self.start_block.lines, self.state.step)

    def _prepare_run_folder(self, run_dir: str | Path | None, resume: str | None) -> None:
        """The run folder and the checkpoint the run starts from (checked on every rank, before rank 0
        writes anything), the tokenizer (rank 0 prepares it), the model config and the datasets."""
        recipe, info = self.recipe, self.info
        chosen = str(run_folder.choose_run_dir(recipe, run_dir, resume)) if info.is_main else None
        self.run_dir = Path(broadcast_object(chosen, info))
        if info.is_main:  # before reading the folder: a second process on it is refused before either writes
            self._lock_run_dir()
        self.resume_from = run_folder.find_resume(self.run_dir, resume)
        if self.resume_from is not None and info.is_main:
            run_folder.check_run_files(self.run_dir)
        if self.resume_from is not None:
            run_folder.check_tokenizer_kept(recipe, self.resume_from)
        self.init_from = (None if self.resume_from or not recipe.train.init_from
                          else resolve_checkpoint(recipe.train.init_from))
        self.source = self.resume_from or self.init_from  # the checkpoint that supplies model config and tokenizer
        self.prior_steps = prior_steps(self.source, resumed=self.resume_from is not None)
        if self.source is not None:  # a recipe contradicting the checkpoint fails on every rank, before any folder
            run_folder.model_config(recipe, None, self.source)
        self.recipe = recipe = run_folder.source_data(recipe, self.source)  # data.train: null = the source's
        self.precision_auto = recipe.train.precision == "auto"
        self.recipe = recipe = run_folder.source_precision(recipe, info.device, self.resume_from)
        if self.resume_from is not None and recipe.train.threads == "auto":  # exact resume: the same reductions
            set_threads(read_config(self.resume_from).get("cpu_threads") or "auto")
        if info.is_main:
            run_folder.check_run_dir(self.run_dir, fresh=self.resume_from is None)
            prepare_tokenizer(recipe, self.run_dir / "tokenizer", self.source, self.start_block)
        barrier(info)
        self.tokenizer = load_tokenizer(self.run_dir / "tokenizer")
        self.cfg = run_folder.model_config(recipe, self.tokenizer, self.source)
        check_vocab_fits(self.tokenizer, self.cfg.vocab_size)
        self.train_data, self.valid_data = build_datasets(recipe, self.tokenizer, self.run_dir, info, self.start_block)

    def _lock_run_dir(self) -> None:
        """Make the run folder and hold its lock for the life of the run (`run_folder.lock_run_dir`)."""
        self.made_dirs, self.lock_created = run_folder.lock_run_dir(self.run_dir, self.lock)

    def _build_model(self) -> None:
        """The same initial weights on every rank (from `train.seed`, or the source checkpoint's), wrapped
        for the run's layout, and its optimizer and loss scaler."""
        recipe, info = self.recipe, self.info
        torch.manual_seed(recipe.train.seed)
        self.model = build_model(self.cfg)
        if self.source is not None:
            ckpt.load_weights(self.model, self.source)
        self.model.to(info.device)
        for param in unreached_parameters(self.model, recipe.objective.name):
            param.requires_grad_(False)
        if recipe.train.activation_checkpointing:
            apply_activation_checkpointing(self.model)
        loss_module = LossModule(self.model, recipe.objective)
        if recipe.train.compile:
            compile_loss_module(loss_module)
        self.train_module = self.parallel.wrap(loss_module)
        self.optimizer = build_optimizer(self.model, recipe.optim, info.device)
        self.scaler = grad_scaler(recipe.train.precision, info.device)

    def _restore(self) -> None:
        """On resume: the optimizer, loss scaler and step of the checkpoint (its RNG is restored by `train`)."""
        self.state, self.saved = TrainState(), None
        self.checkpoint = self.resume_from
        if self.resume_from is None:
            return
        self.saved = ckpt.load_trainer_state(self.resume_from)
        try:
            self.parallel.load_optimizer(self.model, self.optimizer, self.saved["optimizer"])
            if self.saved["scaler"]:  # empty when the checkpoint was not fp16: keep the fresh scaler
                self.scaler.load_state_dict(self.saved["scaler"])
        except (CheckpointError, KeyError, ValueError, TypeError, RuntimeError) as exc:  # a damaged or foreign state
            raise CheckpointError(f"{self.resume_from / TRAINER_STATE}: does not fit this model and optimizer "
                                  f"({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})") from None
        self.state = TrainState.from_dict(self.saved["state"])
        self.state.interrupted = 0

    def discard_new_run_folder(self) -> None:
        """After a failed start, remove the run folder if this run made it: a refused or broken start
        leaves nothing behind (an empty runs/NAME-TIME/ only misleads `--resume auto` and the user)."""
        if self.lock_created and not self.made_dirs and self.info.is_main:  # a folder it did not make: as it was
            (self.run_dir / LOCK_FILE).unlink(missing_ok=True)
        if not self.made_dirs or not self.info.is_main:
            return
        shutil.rmtree(self.made_dirs[0], ignore_errors=True)
        for parent in self.made_dirs[1:]:  # e.g. runs/, when this run made it: only while empty
            if parent.is_dir() and not any(parent.iterdir()):
                parent.rmdir()

    # --- what the loop calls back -----------------------------------------------------------------------

    def save(self, state: TrainState) -> Path | None:
        """Checkpoint `state` (a collective under FSDP: every rank calls it; rank 0 writes)."""
        recipe, info = self.recipe, self.info
        payload = {"state": state.to_dict(), "rng": ckpt.rng_state(), "scaler": self.scaler.state_dict(),
                   "optimizer": self.parallel.optimizer_state(self.model, self.optimizer)}
        weights = self.parallel.full_weights(self.model, self.cfg)
        if info.is_main:
            try:
                self.checkpoint = ckpt.save_checkpoint(self.run_dir, state.step, weights, payload,
                                                       self.run_dir / "tokenizer", self._config_extra(),
                                                       recipe.train.keep_last)
            except ckpt.NonFiniteWeights as exc:  # never written, never named as good, never resumed
                console.print(f"warning: {exc}; the last good one is {self.checkpoint or 'none'}", style="yellow",
                              markup=False, highlight=False)
        barrier(info)
        return self.checkpoint

    def last_good_checkpoint(self) -> Path | None:
        """At a divergence (the loop's state stopped at the step whose weights every update since failed
        from): those weights' checkpoints are set aside (`checkpoint.set_aside_diverged`), and the newest
        one left is the last good one."""
        if self.info.is_main:
            self.checkpoint = ckpt.set_aside_diverged(self.run_dir, self.state.step)
        return self.checkpoint


    def validate(self, step: int) -> dict:
        """Validation loss at `step`, logged (and the weights kept when best, train.keep_best); the row is
        returned to the loop."""
        result = self._validation()
        row = result.row(step)
        self.metrics.log(row)
        if step > 0:  # the untrained baseline is never the model to keep
            self.keep_if_best(step, result.loss)
        return row

    def keep_if_best(self, step: int, loss: float) -> None:
        """train.keep_best: write run_dir/best/ when `loss` beats every validation so far (of every start
        of this run: a resume reads the kept one's loss). Small corpora overfit, and the best weights are
        then not the last ones. Every rank takes part (FSDP gathers the weights); rank 0 writes."""
        if not self.recipe.train.keep_best or not math.isfinite(loss):
            return
        if self.best_loss is None:
            self.best_loss = ckpt.best_loss(self.run_dir) if self.resume_from else math.inf
        if loss >= self.best_loss:
            return
        self.best_loss = loss  # on every rank (the loss is all-reduced): the next decision is the same everywhere
        weights = self.parallel.full_weights(self.model, self.cfg)
        if self.info.is_main:
            try:
                ckpt.save_best(self.run_dir, step, weights, self.run_dir / "tokenizer", self._config_extra(), loss)
            except ckpt.NonFiniteWeights as exc:
                console.print(f"warning: {exc}", style="yellow", markup=False, highlight=False)
        barrier(self.info)

    def _validation(self) -> ValidationResult:
        r = self.recipe
        return validation.validate(self.train_module, self.valid_data, r.eval.batches, r.eval.batch_size or micro_batch_size(r),
                        self.info, r.train.precision)

    def _config_extra(self) -> dict:
        """What a checkpoint's config.json records about the training run, beside the model."""
        r = self.recipe
        extra = {"objective": r.objective.name, "recipe": r.name, "train_seq_len": r.data.seq_len,
                 "prior_steps": self.prior_steps,  # updates the initial weights had had (init_from), before step 0
                 "cpu_threads": torch.get_num_threads(),  # a resumed `auto` run computes with as many
                 "precision": r.train.precision,  # and in the same precision (run_folder.source_precision)
                 "data": {"train": r.data.train, "valid": r.data.valid, "valid_fraction": r.data.valid_fraction,
                          "text_field": r.data.text_field}}  # what `data.train: null` of a run started from it reads
        if r.objective.name == "seq2seq":  # what `tfkit eval` reads pairs with
            extra["pair_fields"] = [r.data.source_field, r.data.target_field]
        return extra

    # --- train and finish ---------------------------------------------------------------------------------

    def train(self) -> TrainState:
        """The untrained baseline (fresh) or the checkpoint's RNG (resume), this rank's dropout stream, the
        loop until `train.max_steps` (or a signal), and the last checkpoint."""
        state, max_time = self.state, self.recipe.train.max_time
        if max_time is not None:  # the budget counts from here, the baseline validation included
            self.loop.budget = TimeBudget(parse_duration(max_time), spent_before=state.seconds)
        if self.saved is not None:
            ckpt.set_rng_state(self.saved["rng"])  # last: everything above may draw random numbers
        else:
            validating = time.perf_counter()
            self.validate(0)  # the untrained baseline every curve starts from
            if self.loop.budget is not None:
                self.loop.budget.took("validation", time.perf_counter() - validating)
        ckpt.seed_rank(self.recipe.train.seed, self.info.rank, state.step)
        self.steps_before, self.tokens_before, started = state.step, state.tokens, time.perf_counter()
        run_loop(self.loop, last_checkpoint=self.last_good_checkpoint)
        self.train_time = time.perf_counter() - started
        if self.loop.budget is not None:
            state.seconds = self.loop.budget.spent()
        if state.step > self.steps_before or state.interrupted or not self.checkpoint:
            self.save(state)
        return state

    def finish(self) -> RunResult:
        """Final validation (logged when this run trained, or is fresh), a sample from a causal model, then
        loss.png and the report on rank 0. An interrupted run skips the validation and the sample."""
        recipe, info, state = self.recipe, self.info, self.state
        result = RunResult(self.run_dir, state, None, self.checkpoint, 0.0)
        if not state.interrupted:
            result.final = self._validation()
            self.keep_if_best(state.step, result.final.loss)
            # a finished run's final row is logged, also by a resume of a run killed just before logging it
            if (state.step > self.steps_before or self.saved is None
                    or (info.is_main and not run_folder.has_validation_row(self.run_dir, state.step))):
                self.metrics.log(result.final.row(state.step))
            if recipe.model.arch == "gpt" and recipe.eval.sample_prompt:
                whole = self.parallel.full_weights(self.model, self.cfg)
                if info.is_main:  # FSDP: a CPU copy assembled from the shards, so rank 0 decodes alone
                    result.sample = _sample(whole.to(info.device), self.tokenizer, recipe)
        self.close()
        result.wall_time = time.perf_counter() - self.started
        if info.is_main:
            if recipe.log.plot and plot_loss(self.run_dir / "metrics.jsonl", self.run_dir / "loss.png"):
                console.print(f"loss curve: {self.run_dir / 'loss.png'}", highlight=False)
            trained = state.tokens - self.tokens_before
            _report(result, self.model, trained / max(self.train_time, 1e-9) if trained else None, recipe)
        return result

    def close(self) -> None:
        """Close metrics.jsonl and TensorBoard, however the run ended (a second call does nothing)."""
        if self.metrics is not None:
            self.metrics.close()
            self.metrics = None

    def release(self) -> None:
        """Drop the model, optimizer and loop before the process group is destroyed: FSDP's sharded
        parameters and pending collectives hold the group, and a group freed only at interpreter exit
        aborted a torchrun worker after a finished run ("terminate called without an active exception")."""
        for name in ("loop", "optimizer", "train_module", "model", "saved"):
            if hasattr(self, name):
                setattr(self, name, None)
        gc.collect()


def prior_steps(source: Path | None, resumed: bool) -> int:
    """Optimizer updates behind the weights a run starts from, before its own step 0: none for a fresh
    run, the resumed checkpoint's own count on resume, and all of an `init_from` checkpoint's (its prior
    steps and its steps; a converted checkpoint carries its source's), so an uptrained model reads as
    300+15 steps rather than 15."""
    if source is None:
        return 0
    config = read_config(source)
    before = config.get("prior_steps") if isinstance(config.get("prior_steps"), int) else 0
    step = config.get("step") if isinstance(config.get("step"), int) else 0
    return before if resumed else before + step


def _describe(recipe: Recipe, model, cfg, info: DistInfo, run_dir: Path, resume_from, init_from,
              console: Transcript, precision_auto: bool) -> None:
    """What is about to run, including the global batch in tokens (the number that sets the LR)."""
    t = recipe.train
    precision = {"fp32": "fp32", "bf16": "bf16 autocast", "fp16": "fp16 autocast"}[t.precision]
    why = f"; train.precision auto: {'' if t.precision == 'bf16' else 'no '}native bf16 on this {info.device.type}"
    per_rank = micro_batch_size(recipe) // info.world_size
    per_sequence = recipe.data.seq_len * (2 if recipe.objective.name == "seq2seq" else 1)  # source + target
    console.print(
        f"[bold]{recipe.name}[/bold]: {cfg.arch} {model.num_params() / 1e6:.2f}M params "
        f"(d_model {cfg.d_model}, {cfg.n_layers} layers, {cfg.n_heads} heads / {cfg.kv_heads} kv), "
        f"vocab {cfg.vocab_size}, {recipe.objective.name}, {precision} on {info.device} "
        f"({torch.get_num_threads()} CPU thread{'s' * (torch.get_num_threads() != 1)})"
        + (f" x{info.world_size} ({t.distributed})" if info.enabled else "") + (why if precision_auto else ""),
        highlight=False)
    console.print(
        f"global batch {t.batch_size} x {per_sequence}{' (source + target)' if per_sequence > recipe.data.seq_len else ''}"
        f" = {t.batch_size * per_sequence:,} tokens "
        f"({t.grad_accum} micro-batch(es) of {per_rank} sequences per rank), "
        + (f"as many steps as fit in {t.max_time} (at most {t.max_steps:,}), " if t.max_time
           else f"{t.max_steps} steps, ")
        + f"{recipe.schedule.name} lr {recipe.optim.lr:g}", highlight=False)
    origin = f"resuming {resume_from}" if resume_from else f"initialised from {init_from}" if init_from else "fresh start"
    console.print(f"run folder {run_dir} ({origin})", highlight=False)
    for warning in recipe.warnings():
        console.print(f"warning: {warning}", style="yellow", markup=False, highlight=False)


def _sample(model, tokenizer: TfkitTokenizer, recipe: Recipe) -> str | None:
    """The trained model continuing `eval.sample_prompt` (causal models only)."""
    from ..models.generation import continuation, frame_prompt, generate

    prompt, _ = frame_prompt(tokenizer, recipe.eval.sample_prompt, "gpt")  # as `tfkit generate` frames it
    new = generate(model, [prompt], recipe.eval.sample_tokens, temperature=0.8, top_k=40,
                   eos_id=tokenizer.eos_id, seed=recipe.train.seed)[0]
    return recipe.eval.sample_prompt + continuation(tokenizer, prompt, new)


def _what_ended(state: TrainState, train) -> str:
    """Under train.max_time, what the step count means: the steps that fit in the budget, or max_steps
    reached inside it (a fast machine), or an interruption."""
    budget = train.max_time
    if budget is None:
        return ""
    if state.interrupted:
        return f" (interrupted, {state.seconds:.0f} s of train.max_time={budget})"
    if state.step >= train.max_steps:
        return f" (train.max_steps={train.max_steps:,} reached in {state.seconds:.0f} s, within train.max_time={budget})"
    return f" (fitted in train.max_time={budget}, {state.seconds:.0f} s)"


def _report(result: RunResult, model, tokens_per_sec: float | None, recipe: Recipe) -> None:
    """The final table: what a user compares between runs."""
    table = Table(title=f"pretrain: {result.run_dir.name}", show_header=False)
    table.add_column(style="bold")
    table.add_column(justify="right")
    if result.final is not None:
        table.add_row("validation loss", f"{result.final.loss:.4f}")
        table.add_row("perplexity", f"{result.final.perplexity:.2f}")
        table.add_row("accuracy", f"{100 * result.final.accuracy:.2f}%")
    table.add_row("steps", f"{result.state.step:,}" + _what_ended(result.state, recipe.train))
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
