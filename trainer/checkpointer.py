"""A run's checkpoints as the trainer writes them: every `save_every` updates and at the end (`save`),
the weights of the best validation so far (`keep_if_best`, train.keep_best), and after a divergence the
last good one (`set_aside_diverged`). The files themselves are the checkpoints room's (checkpoints/training.py,
sharded.py, trainer_state.py, record.py); this object knows the run: its folder, model, optimizer and scaler,
what its config.json records (`_record`), and which checkpoint is the latest good one; and on resume it
restores the optimizer and loss scaler from the checkpoint (`restore`).

The form follows the process count. One process writes model.safetensors and trainer_state.pt as before.
Several processes (DDP or FSDP2) write a sharded checkpoint: every rank its shards of the weights and of the
optimizer state, with torch.distributed.checkpoint, nothing gathered on one rank; with `train.async_save`
the shards are staged in memory and written by a thread while training goes on, and the checkpoint is
published (made the one resume and eval see) when every rank's part is on disk: at the next save, a
divergence, or the end of the run (`wait`). A resume reads either form at any process count."""

from __future__ import annotations

import math
from pathlib import Path

import torch
from torch import nn

from ..checkpoints import sharded, training
from ..checkpoints.folders import is_sharded
from ..checkpoints.record import CheckpointRecord, DataRecord, TaskRecord
from ..checkpoints.trainer_state import load_trainer_state, rng_state
from ..errors import CheckpointError
from ..layout import BEST, CHECKPOINTS, TRAINER_STATE
from ..models.config import ModelConfig
from ..progress import console as output_console
from .distributed import DistInfo, all_reduce_sum, async_group, barrier, broadcast_object
from .loop import TrainState
from .parallel import Parallel
from .recipe import Recipe
from .resume import elastic_run

console = output_console()


class Checkpointer:
    """Writes a run's checkpoints; every rank calls each method (each writes its shards; rank 0 the rest)."""

    def __init__(self, recipe: Recipe, info: DistInfo, parallel: Parallel, run_dir: Path, model: nn.Module,
                 cfg: ModelConfig, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler,
                 prior_steps: int, resumed_from: Path | None) -> None:
        self.recipe, self.info, self.parallel, self.run_dir = recipe, info, parallel, run_dir
        self.model, self.cfg, self.optimizer, self.scaler = model, cfg, optimizer, scaler
        self.prior_steps = prior_steps  # updates the starting weights had had, recorded in every config.json
        self.latest: Path | None = resumed_from  # the last good checkpoint written (or resumed from)
        self.best_loss: float | None = None if resumed_from else math.inf  # a resume reads the kept one's, lazily
        self.sharded = info.enabled  # several processes: each rank writes its shards (checkpoints/sharded.py)
        # train.async_save: shards written by a thread, its collectives on a process group of their own
        self.async_group = async_group(info) if self.sharded and recipe.train.async_save else None
        self.pending: training.ShardedSave | None = None  # a sharded checkpoint being written

    @property
    def form(self) -> str:
        """The start block's line on how this run's checkpoints (and best/) are written."""
        if not self.sharded:
            return "checkpoints: single file (model.safetensors, trainer_state.pt), written by this process"
        how = ("staged in memory and written by a thread while training goes on (train.async_save)"
               if self.async_group is not None else "written in parallel")
        return (f"checkpoints and best/: sharded, each of the {self.info.world_size} processes' part {how} "
                "(torch.distributed.checkpoint, shards/); they load at any process count, and `tfkit "
                "consolidate` writes the single-file form")

    def restore(self) -> tuple[TrainState, dict | None]:
        """On resume: the optimizer and loss scaler of the checkpoint loaded, and its state and trainer state
        returned (the caller restores its RNG last); a fresh state and None for a fresh start. The model's
        weights were loaded when it was built (`checkpoints.training.load_source_weights`)."""
        if self.latest is None:
            return TrainState(), None
        saved = load_trainer_state(self.latest)
        try:
            if is_sharded(self.latest):
                self._restore_shards(saved["optimizer"])
            else:
                self.parallel.load_optimizer(self.model, self.optimizer, saved["optimizer"])
            if saved["scaler"]:  # empty when the checkpoint was not fp16: keep the fresh scaler
                self.scaler.load_state_dict(saved["scaler"])
        except CheckpointError as exc:
            if is_sharded(self.latest):  # names the shard file or the tensor at fault
                raise
            raise self._unfit(exc) from None
        except (KeyError, ValueError, TypeError, RuntimeError) as exc:  # a damaged or foreign state
            raise self._unfit(exc) from None
        saved.pop("optimizer")  # the optimizer holds it now: not kept for the whole run (a full copy under FSDP)
        state = TrainState.from_dict(saved["state"])
        state.interrupted = 0
        return state, saved

    def _restore_shards(self, saved: dict) -> None:
        """The optimizer state of a sharded checkpoint, each rank reading its part at this process count."""
        from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

        tensors, _ = sharded.optimizer_state(self.model, self.optimizer)  # this rank's, to be filled in place
        sharded.load(self.latest, {sharded.OPTIMIZER: {"state": tensors}})
        set_optimizer_state_dict(self.model, self.optimizer, {"state": tensors, "param_groups": saved["param_groups"]})

    def _unfit(self, exc: Exception) -> CheckpointError:
        return CheckpointError(f"{self.latest / TRAINER_STATE}: does not fit this model and optimizer "
                               f"({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})")

    def save(self, state: TrainState) -> Path | None:
        """Checkpoint `state`; a checkpoint with non-finite weights is never written nor named as good. A
        sharded checkpoint still being written (train.async_save) is published first."""
        self.wait()
        payload = {"state": state.to_dict(), "rng": rng_state(), "scaler": self.scaler.state_dict(),
                   "elastic_run": elastic_run()}  # which torchrun run wrote it: a restart of that run resumes it
        if self.sharded:
            self._save_shards(state.step, payload)
        else:
            payload["optimizer"] = self.parallel.optimizer_state(self.model, self.optimizer)
            try:
                self.latest = training.save_checkpoint(self.run_dir, state.step, self.model, payload,
                                                       self.run_dir / "tokenizer", self._record(),
                                                       self.recipe.train.keep_last)
            except training.NonFiniteWeights as exc:
                self._warn(f"{exc}; the last good one is {self.latest or 'none'}")
        barrier(self.info)
        return self.latest

    def _save_shards(self, step: int, payload: dict) -> None:
        """Every rank writes its shards of the weights and optimizer state into rank 0's staging folder; rank 0
        publishes the checkpoint once they are on disk (now, or with train.async_save at the next `wait`)."""
        if not self._finite():
            self._warn(f"step {step}: the weights are not finite (NaN or inf); no checkpoint was written; the last "
                       f"good one is {self.latest or 'none'}")
            return
        tensors, groups = sharded.optimizer_state(self.model, self.optimizer)
        payload["optimizer"] = {"state": {}, "param_groups": groups}  # the tensors are in the shards
        state = {sharded.MODEL: sharded.model_state(self.model), sharded.OPTIMIZER: {"state": tensors}}
        rest = (training.sharded_rest(self.model, self.run_dir / "tokenizer", self._record(), payload, step=step)
                if self.info.is_main else None)
        self.pending = training.ShardedSave.start(self.run_dir / CHECKPOINTS / f"step-{step}", state, rest,
                                                  lambda folder: broadcast_object(folder, self.info),
                                                  self.async_group)
        if self.async_group is None:
            self.wait()

    def wait(self) -> Path | None:
        """Publish the sharded checkpoint being written, once every rank's part is on disk (every rank calls
        this); then the oldest beyond train.keep_last go."""
        pending, self.pending = self.pending, None
        if pending is None:
            return self.latest
        published = pending.finish()
        self.latest = pending.final
        if published is not None:
            training.prune(self.run_dir / CHECKPOINTS, self.recipe.train.keep_last)
        return self.latest

    def _finite(self) -> bool:
        """Whether every rank's part of the weights is finite (a collective)."""
        bad = 0.0 if sharded.local_finite(self.model) else 1.0
        return all_reduce_sum(torch.tensor([bad], dtype=torch.float64), self.info).tolist()[0] == 0

    def _warn(self, text: str) -> None:
        if self.info.is_main:
            console.print(f"warning: {text}", style="yellow", markup=False, highlight=False)

    def set_aside_diverged(self, step: int) -> Path | None:
        """At a divergence (the state stopped at the step whose weights every update since failed from):
        those weights' checkpoints are set aside (`checkpoint.set_aside_diverged`); the newest one left
        is the last good one."""
        self.wait()
        if self.info.is_main:
            self.latest = training.set_aside_diverged(self.run_dir, step)
        return self.latest

    def keep_if_best(self, step: int, loss: float) -> None:
        """train.keep_best: write run_dir/best/ when `loss` beats every validation so far (of every start
        of this run). Small corpora overfit, and the best weights are then not the last ones. Several
        processes write best/ sharded, as their checkpoints."""
        if not self.recipe.train.keep_best or not math.isfinite(loss):
            return
        if self.best_loss is None:
            self.best_loss = training.best_loss(self.run_dir)
        if loss >= self.best_loss:
            return
        self.best_loss = loss  # on every rank (the loss is all-reduced): the next decision is the same everywhere
        if self.sharded:
            self._best_shards(step, loss)
        elif self.info.is_main:
            try:
                training.save_best(self.run_dir, step, self.model, self.run_dir / "tokenizer", self._record(), loss)
            except training.NonFiniteWeights as exc:
                self._warn(str(exc))
        barrier(self.info)

    def _best_shards(self, step: int, loss: float) -> None:
        if not self._finite():
            self._warn(f"step {step}: the weights are not finite (NaN or inf); the best checkpoint was kept")
            return
        rest = (training.sharded_rest(self.model, self.run_dir / "tokenizer", self._record(), None, step=step,
                                      val_loss=loss) if self.info.is_main else None)
        training.ShardedSave.start(self.run_dir / BEST, {sharded.MODEL: sharded.model_state(self.model)}, rest,
                                   lambda folder: broadcast_object(folder, self.info)).finish()

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
