"""tfkit checkpoints: the folder every command hands to the next, and the formats it is converted to and from.

A checkpoint folder holds `model.safetensors`, `config.json` (its typed record: `record.CheckpointRecord`), the
tokenizer files, and for a training checkpoint `trainer_state.pt`. A run folder holds `recipe.yaml`,
`start.log`, `tokenizer/`, `metrics.jsonl`, `checkpoints/step-N/` and, with train.keep_best, `best/`.
docs/checkpoints.md describes the layout; this room is where it is written and read:

- `record`: config.json as one type, read and validated once (`CheckpointRecord.read`, `to_json`);
- `folders`: the one scanner of `checkpoints/step-N/`: a path a user gives turned into a checkpoint;
- `weights`, `meta`: the weights written and read (built on the meta device, allocated once);
- `trainer_state`, `training`, `plain_pickle`: the trainer's half (optimizer by name, RNG, counters), a run's
  checkpoints and best/ on disk, pickles read as plain data only;
- `convert`: convert-mqa-to-gqa on a folder (the pure regrouping is models/convert.py);
- `hf_*`, `gguf_export`: HuggingFace folders in and out, GGUF out;
- `run_record`, `model_card`, `finetune_card`: what a checkpoint's run recorded, and the model cards.

It sits between `models/` (the networks and their pure state-dict functions, which it builds and fills) and
`trainer/` (which writes a run's checkpoints through it).
"""
