"""`tfkit pretrain`: recipe → run folder → tokenizer → token shards → model → training → final report.

`Trainer` runs one recipe in three stages, each one method: `build` (run folder, tokenizer, datasets,
model, optimizer, resume state), `train` (the baseline validation or the restored RNG, the loop, the last
checkpoint) and `finish` (final validation, sample, plot, report), inside `with Trainer(...)`, which owns
the cleanup however the run ends. Its state is declared in `__init__`. Each piece of work lives in its own
component (tokenization, models, optim, objectives, parallel, checkpointer, run_folder, source, loop,
validation, metrics, report); this module only orders them. Rank 0 does everything that writes files (run
folder, tokenizer training, token-shard cache) while the other ranks wait at a barrier, then every rank
builds the same model from the same seed and trains its slice of each batch with its own dropout masks
(`checkpoint.seed_rank`).

Where a run starts from:
- fresh: weights from `train.seed`, tokenizer trained (or copied from `tokenizer.path`);
- `--resume auto|PATH`: the checkpoint's weights, optimizer, step, data position and RNG; exact;
- `train.init_from`: a *new* run whose weights, model shape and tokenizer come from a checkpoint (e.g.
  GQA uptraining after `tfkit convert-mqa-to-gqa`, or an imported model); optimizer and step start from zero.
"""

from __future__ import annotations

import contextlib
import gc
import time
from pathlib import Path

import torch
from torch import nn

from ..checkpoints.finetune_card import write_cards
from ..checkpoints.folders import resolve_checkpoint
from ..checkpoints.record import CheckpointRecord
from ..checkpoints.trainer_state import seed_rank, set_rng_state
from ..checkpoints.training import load_source_weights
from ..checkpoints.weights import check_depth
from ..errors import TfkitError
from ..files import is_disk_full
from ..models import build_model
from ..models.config import ModelConfig
from ..progress import Transcript
from ..progress import console as output_console
from ..threads import set_threads
from ..tokenization.train import TfkitTokenizer, check_vocab_fits, load_tokenizer
from . import run_folder, task, validation
from .batch_plan import BatchPlan, plan_batches
from .budget import TimeBudget, parse_duration
from .plan import plan_for_run
from .checkpointer import Checkpointer
from .data import build_run_data, fit_to_data, grow_chat_vocab, prepare_chat_tokenizer, prepare_tokenizer
from .distributed import DistInfo, barrier, broadcast_object, init_distributed, same_everywhere, shutdown
from .downstream import Downstream, check_downstream, criterion, due, rank0_weights
from .loop import Loop, TrainingDiverged, TrainState, mfu_basis, micro_batch_size, run_loop
from .metrics import MetricsWriter, plot_loss
from .mixing import realised_line, sources_table
from .objectives import LossModule, compile_loss_module, freeze_unreached
from .optim import build_optimizer, decay_line, grad_scaler
from .parallel import Parallel, apply_activation_checkpointing, check_one_process_keys
from .recipe import Recipe
from .report import RunResult, describe, report, sample
from .resume import restart_resume
from .source import keep_threads, model_config, prior_steps, resolve_recipe
from .step import Update
from .task_names import PREFIX
from .trackers import open_tracker
from .validation import ValidationResult

console = output_console()


def pretrain(recipe: Recipe, run_dir: str | Path | None = None, resume: str | None = None,
             scorer: task.Scorer | None = None, downstream: Downstream | None = None) -> RunResult:
    """Run a recipe end to end; see the module docstring. Works alone or under torchrun. A fine-tuning
    recipe (objective classify / regress) needs the `scorer` of its validation scores (`tfkit finetune`), a
    recipe with eval.tasks / eval.probe the `downstream` scores its command built (trainer/downstream.py)."""
    task.check_scorer(recipe, scorer)
    check_downstream(recipe, downstream)
    info = init_distributed(recipe.train.device)
    set_threads(recipe.train.threads)  # before any work: torch's default oversubscribes a busy machine
    recipe = plan_for_run(recipe, str(info.device), info.world_size, console.print)  # model.size: auto
    with Trainer(recipe, info, scorer, downstream) as trainer:
        trainer.build(run_dir, resume)
        trainer.train()
        result = trainer.finish()
        # Leave together: rank 0 still writes the report and the plot after the last collective, and a
        # rank that tears its connections down meanwhile can abort in gloo's threads.
        barrier(info)
    return result


class Trainer(contextlib.AbstractContextManager):
    """One run of a recipe on this process's rank: `build()`, `train()`, `finish()`, in that order, inside
    `with`: the Trainer owns the run's cleanup (metrics file, run-folder lock, process group) and, after a
    failed start, removes the run folder it made."""

    def __init__(self, recipe: Recipe, info: DistInfo, scorer: task.Scorer | None = None,
                 downstream: Downstream | None = None) -> None:
        self.recipe, self.info = recipe, info  # the recipe as resolved by build (data, precision)
        self.scorer = scorer  # fine-tuning: (task, predictions, targets) -> validation scores
        self.downstream = downstream  # eval.tasks / eval.probe, scored at validations (trainer/downstream.py)
        self.replica: nn.Module | None = None  # DDP: rank 0's weights, which every rank scores (rank0_weights)
        self.head = None  # fine-tuning: the classifier head (HeadConfig), its labels from the training data
        self.parallel = Parallel(recipe.train.distributed, info)
        self.started = time.perf_counter()
        self.start_block = Transcript(console)  # what the run says it will do, also kept in the run folder
        self.run_dir: Path | None = None
        self.folder = run_folder.FolderClaim()  # rank 0's: the lock held until the end, what a failed start removes
        self.built = False  # build() finished: a later failure keeps the run folder when it has a checkpoint
        self.resume_from: Path | None = None  # the checkpoint resumed (--resume)
        self.init_from: Path | None = None  # the checkpoint a new run starts from (train.init_from)
        self.prior_steps = 0  # updates the starting weights had had before this run's step 0
        self.precision_auto = False  # whether train.precision was auto before build decided it
        self.saved: dict | None = None  # the resumed checkpoint's trainer state (optimizer, scaler, RNG)
        self.tokenizer: TfkitTokenizer | None = None
        self.cfg: ModelConfig | None = None
        self.train_data = self.valid_data = None  # datasets: batch(i, ...) / eval_batches(n, ...)
        self.model: nn.Module | None = None  # the bare model (checkpoints, sample)
        self.train_module: nn.Module | None = None  # LossModule, wrapped for DDP / FSDP, maybe compiled
        self.optimizer: torch.optim.Optimizer | None = None
        self.scaler: torch.amp.GradScaler | None = None
        self.state = TrainState()  # step, batches, tokens, skips, seconds: what a checkpoint records
        self.loop: Loop | None = None
        self.metrics: MetricsWriter | None = None
        self.checkpoints: Checkpointer | None = None  # save, keep_if_best, the last good checkpoint
        self.steps_before = self.tokens_before = 0  # the state's step and tokens when this start began training
        self.plan: BatchPlan | None = None  # which rows of each update this process computes (batch_plan.py)
        self.restarted: str | None = None  # why a run torchrun started again resumes by itself (resume.restart_resume)
        self.train_time = 0.0  # seconds the loop ran in this start

    @property
    def source(self) -> Path | None:
        """The checkpoint that supplies the model config and tokenizer: the resumed one, or train.init_from."""
        return self.resume_from or self.init_from

    def __exit__(self, kind, exc: BaseException | None, traceback) -> None:
        """However the run ended: close metrics.jsonl, release the lock, the model and the process group. A
        failed start removes the run folder it made, as does a failure before the first checkpoint (e.g. no
        validation batch); a divergence keeps it; a full disk is reported naming the intact checkpoint."""
        try:
            if exc is not None:
                kept = self.built and (self.checkpoints.latest is not None or isinstance(exc, TrainingDiverged)
                                       or not isinstance(exc, (TfkitError, OSError)))
                if not kept:
                    self.close()
                    self.folder.discard()
                if self.built and isinstance(exc, OSError) and is_disk_full(exc):
                    raise run_folder.disk_full_during_run(exc, self.run_dir, self.checkpoints.latest) from exc
        finally:
            self.close()
            self.folder.close()
            self.release()
            shutdown(self.info)

    # --- build: everything before the first step ----------------------------------------------------------

    def build(self, run_dir: str | Path | None = None, resume: str | None = None) -> None:
        """Run folder, tokenizer, datasets, model, optimizer and, on resume, the saved trainer state.
        The run folder and the source checkpoint are checked before rank 0 writes anything; recipe.yaml is
        written last, once the whole setup has succeeded."""
        recipe, info = self.recipe, self.info
        if info.device.type == "cuda":  # fp32 matmuls on the tensor cores (TF32), as nanoGPT and litgpt train
            torch.set_float32_matmul_precision("high")
        self._check_processes()
        self._prepare_run_folder(run_dir, resume)
        recipe = self.recipe  # data.train and train.precision resolved against the source checkpoint and device
        if self.downstream is not None:  # every item encoded, what this model cannot score refused: before training
            self.downstream.prepare(self.cfg, self.tokenizer, self.start_block if info.is_main else None)
        self._build_model()
        self.checkpoints = Checkpointer(recipe, info, self.parallel, self.run_dir, self.model, self.cfg, self.optimizer,
                                        self.scaler, self.prior_steps, self.resume_from)
        self.state, self.saved = self.checkpoints.restore()
        self.plan = self._split_batches(self.state.micro_rows)
        self.state.micro_rows = self.plan.rows
        tracker = open_tracker(recipe, self.run_dir, bool(self.resume_from)) if info.is_main else None  # log.wandb
        self.metrics = MetricsWriter(self.run_dir, info.is_main, recipe.log.tensorboard,
                                     self.state.step if self.resume_from else None, tracker=tracker)
        update = Update.of(recipe, self.model, self.train_module, self.optimizer, self.scaler, info)
        self.loop = Loop(recipe, update, self.train_data, self.metrics.log, self.checkpoints.save, self.validate,
                         state=self.state, batch_plan=self.plan, **mfu_basis(self.model, recipe, info.device))
        if info.is_main:  # only now that the whole setup succeeded: a refused run leaves recipe.yaml as it was
            run_folder.write_recipe(self.run_dir, recipe, self.resume_from, console)
            describe(recipe, self.model, self.cfg, info, self.run_dir, self.resume_from, self.init_from,
                     self.start_block, self.precision_auto, split=self.plan.describe())
            self._say_layout()
            self.start_block.print(decay_line(self.optimizer), highlight=False, markup=False)
            if so_far := realised_line(self.train_data, self.state.batches, micro_batch_size(recipe)):
                self.start_block.print(so_far, highlight=False, markup=False)  # a resumed mixture: its shares so far
            run_folder.append_start_block(self.run_dir, self.start_block.lines, self.state.step)
        self.built = True

    def _check_processes(self) -> None:
        """Before anything is written: every process runs the same recipe, and their number splits its batches."""
        same_everywhere(self.recipe.to_yaml(), "recipe", self.info)
        self._split_batches()
        check_one_process_keys(self.recipe.model, self.info.world_size)

    def _split_batches(self, kept_rows: int = 0) -> BatchPlan:
        t = self.recipe.train
        return plan_batches(t.batch_size, t.grad_accum, self.info.world_size, self.recipe.eval.batch_size, kept_rows)

    def _say_layout(self) -> None:
        """The start block's lines on how the processes share the run: restarts, checkpoints' form."""
        if self.restarted:
            found = (f"resuming {self.resume_from}, its newest complete checkpoint" if self.resume_from else
                     "no complete checkpoint yet: starting afresh")
            self.start_block.print(f"{self.restarted}: {found}", highlight=False, markup=False)
        self.start_block.print(self.checkpoints.form, highlight=False, markup=False)

    def _prepare_run_folder(self, run_dir: str | Path | None, resume: str | None) -> None:
        """The run folder and the checkpoint the run starts from (checked on every rank, before rank 0
        writes anything), the tokenizer (rank 0 prepares it), the model config and the datasets."""
        recipe, info = self.recipe, self.info
        if info.is_main:  # a run torchrun started again continues from its newest complete checkpoint
            resume, self.restarted = restart_resume(resume, recipe, run_dir)
        resume, self.restarted = broadcast_object((resume, self.restarted), info)
        chosen = str(run_folder.choose_run_dir(recipe, run_dir, resume)) if info.is_main else None
        self.run_dir = Path(broadcast_object(chosen, info))
        if info.is_main:  # before reading the folder: a second process on it is refused before either writes
            self.folder.take(self.run_dir)
        barrier(info)  # rank 0 has cleared what a killed attempt left: every rank now finds the same checkpoint
        self.resume_from = run_folder.find_resume(self.run_dir, resume)
        if self.resume_from is not None and info.is_main:
            run_folder.check_run_files(self.run_dir)
        self.init_from = (None if self.resume_from or not recipe.train.init_from
                          else resolve_checkpoint(recipe.train.init_from))
        if self.source is not None:  # its declared depth against its weights, before a model of it is built
            check_depth(CheckpointRecord.read(self.source).model, self.source)
        self.precision_auto = recipe.train.precision == "auto"
        self.recipe = recipe = resolve_recipe(recipe, self.init_from, self.resume_from, info.device,
                                              self.start_block if info.is_main else None)
        self.prior_steps = prior_steps(self.source, resumed=self.resume_from is not None)
        keep_threads(recipe, self.resume_from)
        if info.is_main:
            run_folder.check_inputs_apart(self.run_dir, recipe, fresh=self.resume_from is None)
            run_folder.check_run_dir(self.run_dir, fresh=self.resume_from is None)
            run_folder.keep_or_set_aside_best(self.run_dir, self.resume_from, console)
            prepare_tokenizer(recipe, self.run_dir / "tokenizer", self.source, self.start_block)
            prepare_chat_tokenizer(recipe, self.run_dir / "tokenizer", self.start_block)
        barrier(info)
        self.tokenizer = load_tokenizer(self.run_dir / "tokenizer")
        cfg = model_config(recipe, self.tokenizer, self.source)
        self.recipe, self.cfg = recipe, cfg = grow_chat_vocab(recipe, cfg, self.tokenizer)
        check_vocab_fits(self.tokenizer, cfg.vocab_size)
        self.train_data, self.valid_data, self.head = build_run_data(recipe, self.tokenizer, cfg, self.run_dir, info,
                                                                     self.start_block)
        self.recipe = fit_to_data(recipe, self.train_data, self.start_block if info.is_main else None)

    def _build_model(self) -> None:
        """The same initial weights on every rank (train.seed's or the source's), wrapped; optimizer, scaler."""
        recipe, info = self.recipe, self.info
        torch.manual_seed(recipe.train.seed)
        if self.head is not None:
            self.model = task.build_classifier(self.cfg, self.head, self.init_from, self.resume_from)
        else:
            self.model = build_model(self.cfg)
            if self.source is not None:
                load_source_weights(self.model, self.source)
        self.model.to(info.device)
        freeze_unreached(self.model, recipe.objective.name)
        if recipe.train.activation_checkpointing:
            apply_activation_checkpointing(self.model)
        loss_module = LossModule(self.model, recipe.objective)
        if recipe.train.compile:
            compile_loss_module(loss_module)
        self.train_module = self.parallel.wrap(loss_module)
        self.optimizer = build_optimizer(self.model, recipe.optim, info.device)
        self.scaler = grad_scaler(recipe.train.precision, info.device)

    # --- what the loop calls back -----------------------------------------------------------------------

    def validate(self, step: int) -> dict:
        """Validation at `step` with the downstream scores due, logged (the weights kept when best:
        train.keep_best, by eval.best_by); the row goes to the loop."""
        result = self._validation()
        row = self._with_downstream(result.row(step), step, last=False)
        self.metrics.log(row)
        if step > 0:  # the untrained baseline is never the model to keep
            self.checkpoints.keep_if_best(step, criterion(row, self.recipe.eval.best_by, result.criterion))
        return row

    def _with_downstream(self, row: dict, step: int, last: bool) -> dict:
        """The validation row with eval.tasks / eval.probe scored on the live weights, when due, and the tokens
        trained on so far (what a task curve is drawn against)."""
        if self.downstream is None or not due(step, self.recipe.eval.task_every, last):
            return row
        precision = self.recipe.train.precision
        if not self.info.enabled:
            scores = self.downstream.score(self.model, self.info, precision)
        elif not self.parallel.sharded:  # DDP: each rank scores its share of the items on rank 0's weights
            self.replica = rank0_weights(self.model, self.info, self.replica)
            scores = self.downstream.score(self.replica, self.info, precision)
        else:  # FSDP: every forward is a collective, so rank 0 scores a whole copy alone and shares the scores
            whole = self.parallel.full_weights(self.model, self.cfg)
            scores = (self.downstream.score(whole.to(self.info.device), DistInfo(device=self.info.device), precision)
                      if self.info.is_main else None)
            scores = broadcast_object(scores, self.info)
        return {**row, **scores, "tokens": self.state.tokens}

    def _validation(self) -> ValidationResult | task.TaskValidation:
        r = self.recipe
        if self.head is not None:
            return task.validate_task(self.train_module, self.valid_data, r.eval.batch_size or micro_batch_size(r),
                                      self.info, r.train.precision, self.scorer, r.task.metric_for(r.head_task),
                                      show_progress=r.log.progress)
        return validation.validate(self.train_module, self.valid_data, r.eval.batches,
                                   r.eval.batch_size or micro_batch_size(r), self.info, r.train.precision)

    # --- train and finish ---------------------------------------------------------------------------------

    def train(self) -> TrainState:
        """The untrained baseline (fresh) or the checkpoint's RNG (resume), this rank's dropout stream, the
        loop until `train.max_steps` (or a signal), and the last checkpoint."""
        state, max_time = self.state, self.recipe.train.max_time
        if max_time is not None:  # the budget counts from here, the baseline validation included
            self.loop.budget = TimeBudget(parse_duration(max_time), spent_before=state.seconds)
        if self.saved is not None:
            set_rng_state(self.saved["rng"])  # last: everything above may draw random numbers
        else:
            if self.head is not None and self.info.is_main:  # every validation example: minutes for a large model
                console.print(f"validating the untrained model first on {self.valid_data.num_examples:,} examples "
                              "(the baseline every curve starts from)", highlight=False, markup=False)
            budget = self.loop.budget  # times it on its own clock: the end of the run needs a validation too
            with budget.timing("validation") if budget is not None else contextlib.nullcontext():
                self.validate(0)  # the untrained baseline every curve starts from
        seed_rank(self.recipe.train.seed, self.info.rank, state.step)
        self.steps_before, self.tokens_before, started = state.step, state.tokens, time.perf_counter()
        run_loop(self.loop, last_checkpoint=lambda: self.checkpoints.set_aside_diverged(state.step))
        self.train_time = time.perf_counter() - started
        if self.loop.budget is not None:
            state.seconds = self.loop.budget.spent()
        if state.step > self.steps_before or state.interrupted or not self.checkpoints.latest:
            self.checkpoints.save(state)
        self.checkpoints.wait()  # train.async_save: the last checkpoint is on disk before the run goes on
        return state

    def finish(self) -> RunResult:
        """Final validation (logged when this run trained, or is fresh), a sample from a causal model, then
        a fine-tuning run's model cards (finetune_card.py), loss.png and the report on rank 0. An interrupted
        run skips the validation, the sample and the cards (its resume writes them)."""
        recipe, info, state = self.recipe, self.info, self.state
        result = RunResult(self.run_dir, state, None, self.checkpoints.latest, 0.0)
        if not state.interrupted:
            result.final = self._validation()
            row = self._with_downstream(result.final.row(state.step), state.step, last=True)
            result.tasks = {key: value for key, value in row.items() if key.startswith(PREFIX)} or None
            self.checkpoints.keep_if_best(state.step, criterion(row, recipe.eval.best_by, result.final.criterion))
            # a finished run's final row is logged, also by a resume of a run killed just before logging it
            if (state.step > self.steps_before or self.saved is None
                    or (info.is_main and not run_folder.has_validation_row(self.run_dir, state.step))):
                self.metrics.log(row)
            if recipe.model.arch == "gpt" and self.head is None and recipe.eval.sample_prompt is not None:
                whole = self.parallel.full_weights(self.model, self.cfg)
                if info.is_main:  # FSDP: a CPU copy assembled from the shards, so rank 0 decodes alone
                    result.sample = sample(whole.to(info.device), self.tokenizer, recipe, self.valid_data)
        self.close()
        result.wall_time = time.perf_counter() - self.started
        if info.is_main:
            if self.head is not None and not state.interrupted:  # metrics.jsonl holds the final row
                write_cards(self.run_dir, result.checkpoint)
            if recipe.log.plot and plot_loss(self.run_dir / "metrics.jsonl", self.run_dir / "loss.png"):
                console.print(f"loss curve: {self.run_dir / 'loss.png'}", highlight=False)
            trained = state.tokens - self.tokens_before
            report(result, self.model, trained / max(self.train_time, 1e-9) if trained else None, recipe)
            if (sources := sources_table(self.train_data, state.batches, micro_batch_size(recipe))) is not None:
                console.print(sources)  # a list of sources: each one's share realised and epochs
        return result

    def close(self) -> None:
        """Close metrics.jsonl and TensorBoard, however the run ended (a second call does nothing)."""
        if self.metrics is not None:
            self.metrics.close()
            self.metrics = None

    def release(self) -> None:
        """Drop the model, optimizer and loop before the process group is destroyed: FSDP's sharded
        parameters and pending collectives hold the group, and a group freed only at interpreter exit
        aborted a torchrun worker after a finished run ("terminate called without an active exception").
        Their cycles are collected at once under torchrun and on a GPU (a lab's next run needs the memory);
        elsewhere a full collection costs a quarter second for nothing."""
        self.loop = self.checkpoints = self.optimizer = self.train_module = self.model = self.saved = None
        self.replica = None
        if self.info.enabled or self.info.device.type == "cuda":
            gc.collect()
