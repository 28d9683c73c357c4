"""A run's checkpoints as the trainer writes them: every `save_every` updates and at the end (`save`),
the weights of the best validation so far (`keep_if_best`, train.keep_best), and after a divergence the
last good one (`set_aside_diverged`). The files themselves are the checkpoints room's (checkpoints/training.py,
trainer_state.py, record.py); this object knows the run: its folder, model, optimizer and scaler, what its
config.json records (`_record`), and which checkpoint is the latest good one; and on resume it restores the
optimizer and loss scaler from the checkpoint (`restore`)."""

from __future__ import annotations

import math
from pathlib import Path

import torch
from torch import nn

from ..checkpoints import training
from ..checkpoints.record import CheckpointRecord, DataRecord, TaskRecord
from ..checkpoints.trainer_state import load_trainer_state, rng_state
from ..errors import CheckpointError
from ..layout import TRAINER_STATE
from ..models.config import ModelConfig
from ..progress import console as output_console
from .distributed import DistInfo, barrier
from .loop import TrainState
from .parallel import Parallel
from .recipe import Recipe

console = output_console()


class Checkpointer:
    """Writes a run's checkpoints; every rank calls each method (FSDP gathers the weights), rank 0 writes."""

    def __init__(self, recipe: Recipe, info: DistInfo, parallel: Parallel, run_dir: Path, model: nn.Module,
                 cfg: ModelConfig, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler,
                 prior_steps: int, resumed_from: Path | None) -> None:
        self.recipe, self.info, self.parallel, self.run_dir = recipe, info, parallel, run_dir
        self.model, self.cfg, self.optimizer, self.scaler = model, cfg, optimizer, scaler
        self.prior_steps = prior_steps  # updates the starting weights had had, recorded in every config.json
        self.latest: Path | None = resumed_from  # the last good checkpoint written (or resumed from)
        self.best_loss: float | None = None if resumed_from else math.inf  # a resume reads the kept one's, lazily

    def restore(self) -> tuple[TrainState, dict | None]:
        """On resume: the optimizer and loss scaler of the checkpoint loaded, and its state and trainer state
        returned (the caller restores its RNG last); a fresh state and None for a fresh start."""
        if self.latest is None:
            return TrainState(), None
        saved = load_trainer_state(self.latest)
        try:
            self.parallel.load_optimizer(self.model, self.optimizer, saved["optimizer"])
            if saved["scaler"]:  # empty when the checkpoint was not fp16: keep the fresh scaler
                self.scaler.load_state_dict(saved["scaler"])
        except (CheckpointError, KeyError, ValueError, TypeError, RuntimeError) as exc:  # a damaged or foreign state
            raise CheckpointError(f"{self.latest / TRAINER_STATE}: does not fit this model and optimizer "
                                  f"({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})") from None
        state = TrainState.from_dict(saved["state"])
        state.interrupted = 0
        return state, saved

    def save(self, state: TrainState) -> Path | None:
        """Checkpoint `state`; a checkpoint with non-finite weights is never written nor named as good."""
        payload = {"state": state.to_dict(), "rng": rng_state(), "scaler": self.scaler.state_dict(),
                   "optimizer": self.parallel.optimizer_state(self.model, self.optimizer)}
        weights = self.parallel.full_weights(self.model, self.cfg)
        if self.info.is_main:
            try:
                self.latest = training.save_checkpoint(self.run_dir, state.step, weights, payload,
                                                   self.run_dir / "tokenizer", self._record(),
                                                   self.recipe.train.keep_last)
            except training.NonFiniteWeights as exc:
                console.print(f"warning: {exc}; the last good one is {self.latest or 'none'}", style="yellow",
                              markup=False, highlight=False)
        barrier(self.info)
        return self.latest

    def set_aside_diverged(self, step: int) -> Path | None:
        """At a divergence (the state stopped at the step whose weights every update since failed from):
        those weights' checkpoints are set aside (`checkpoint.set_aside_diverged`); the newest one left
        is the last good one."""
        if self.info.is_main:
            self.latest = training.set_aside_diverged(self.run_dir, step)
        return self.latest

    def keep_if_best(self, step: int, loss: float) -> None:
        """train.keep_best: write run_dir/best/ when `loss` beats every validation so far (of every start
        of this run). Small corpora overfit, and the best weights are then not the last ones."""
        if not self.recipe.train.keep_best or not math.isfinite(loss):
            return
        if self.best_loss is None:
            self.best_loss = training.best_loss(self.run_dir)
        if loss >= self.best_loss:
            return
        self.best_loss = loss  # on every rank (the loss is all-reduced): the next decision is the same everywhere
        weights = self.parallel.full_weights(self.model, self.cfg)
        if self.info.is_main:
            try:
                training.save_best(self.run_dir, step, weights, self.run_dir / "tokenizer", self._record(), loss)
            except training.NonFiniteWeights as exc:
                console.print(f"warning: {exc}", style="yellow", markup=False, highlight=False)
        barrier(self.info)

    def _record(self) -> CheckpointRecord:
        """What a checkpoint's config.json records about the training run, beside the model (save_model adds the
        model's config, a classifier's head and labels, and the step)."""
        r, d = self.recipe, self.recipe.data
        task = None if r.head_task is None else TaskRecord(
            text=r.task.text, text_pair=r.task.text_pair, label=r.task.label, header=r.task.header,
            truncation=r.task.truncation, stride=r.task.stride,
            metric=r.task.metric_for(r.head_task))  # best/'s val_loss is minus this score
        return CheckpointRecord(
            model=self.cfg, objective=r.objective.name, recipe=r.name, train_seq_len=d.seq_len,
            prior_steps=self.prior_steps,  # updates the initial weights had had (init_from), before step 0
            cpu_threads=torch.get_num_threads(),  # a resumed `auto` run computes with as many
            precision=r.train.precision,  # and in the same precision (source.source_precision)
            # what `data.train: null` of a run started from it reads, and the packed layout `tfkit eval` scores under
            data=DataRecord(train=d.train, valid=d.valid, valid_fraction=d.valid_fraction, text_field=d.text_field,
                            document_mask=d.document_mask, reset_positions=d.reset_positions),
            pair_fields=(d.source_field, d.target_field) if r.objective.name == "seq2seq" else None,
            task=task)  # a classifier: how its text was read, which `tfkit eval --data` / `predict` repeat
