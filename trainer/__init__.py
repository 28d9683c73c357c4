"""Pretraining: recipes, schedules, objectives, optimizer, checkpoints, the loop, validation, metrics.

`tfkit.trainer.run.pretrain(recipe, run_dir=None, resume=None)` runs a recipe end to end (run.py's `Trainer`);
the pieces are usable on their own:

| module          | what                                                                           |
| --------------- | ------------------------------------------------------------------------------ |
| `recipe`        | YAML recipes → typed sections (`sections`), every problem reported at once     |
| `schedules`     | `lr_at(step, ...)`: learning rate as a pure function of the step               |
| `objectives`    | `compute_loss(model, batch, objective) -> LossOutput(loss_sum, correct, count)` |
| `optim`         | AdamW parameter groups (no decay on norms, biases, embeddings), precision      |
| `checkpoint`    | atomic `checkpoints/step-N/`, weights-only trainer state, RNG per rank         |
| `checkpointer`  | a run's checkpoints: every save_every, best/ (keep_best), the last good one    |
| `run_folder`    | run folder: which one, what may be overwritten, its lock, recipe.yaml, start.log |
| `source`        | what a run takes from its checkpoint: model config, data, precision, tokenizer |
| `resume`        | what a resume trains with: the run's own recipe.yaml plus --set overrides      |
| `step`          | `train_step`: one update on the device; windows of updates between host reads |
| `loop`          | the run of updates: log rows, validations, checkpoints, skips, signals        |
| `budget`        | `train.max_time`: the step a run ends at, evenly spaced validations           |
| `report`        | the start block, the final report, the end-of-run sample                      |
| `validation`    | `validate`: the same fixed validation batches every time                       |
| `downstream`    | eval.tasks / eval.probe at validations: the Downstream a command hands in     |
| `distributed`   | torchrun process groups, devices, collectives                                  |
| `parallel`      | `Parallel`: DDP / FSDP2 wrapping and full state; activation checkpointing      |
| `metrics`       | metrics.jsonl, TensorBoard, loss.png, MFU                                      |
| `data`          | the run's tokenizer and datasets                                               |
| `finetune_card` | README.md model card in a fine-tuning run's final checkpoint and best/         |

Submodules are imported on use (`from tfkit.trainer.run import pretrain`) so `import tfkit.trainer` stays
cheap for the CLI.
"""
