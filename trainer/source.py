"""What a run takes from the checkpoint it starts from: the resumed one (`--resume`) or `train.init_from`.

The model config of such a run is the checkpoint's: a recipe key that contradicts it is an error, except
the MAY_DIFFER keys that do not change the weights' shapes; an `init_from` run takes the checkpoint's
model wholesale, its dropouts and attention kernel too unless the recipe writes them out (`source_model`). `data.train: null` means the checkpoint's data, `train.precision: auto`
of a resume the precision it trained in (and `train.threads: auto` its thread count), and a resume
keeps the checkpoint's tokenizer. `resolve_recipe` applies these to the recipe before the run writes
anything, on every rank.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from ..checkpoints.record import CheckpointRecord
from ..errors import ConfigError
from ..layout import RECIPE_FILE
from ..models.config import ModelConfig
from ..threads import set_threads
from ..tokenization.train import load_tokenizer
from .optim import resolve_precision
from .recipe import OBJECTIVE_FOR_ARCH, PRECISIONS, Recipe
from .run_folder import read_run_recipe

MAY_DIFFER = ("dropout", "attn_dropout", "attention")  # regularisation / kernel choice, not the weights' shape


def resolve_recipe(recipe: Recipe, init_from: Path | None, resume_from: Path | None, device, out=None) -> Recipe:
    """The recipe as the checkpoint a run starts from and the device decide it, checked before rank 0
    writes anything: a resume keeps its tokenizer, an init_from run takes the checkpoint's shape (said on
    `out`, the start block, when given), a recipe contradicting the checkpoint fails on every rank,
    `data.train: null` becomes the source's data and `train.precision: auto` a precision."""
    source = resume_from or init_from
    if resume_from is not None:
        check_tokenizer_kept(recipe, resume_from)
    if init_from is not None:  # its shape, unless --set model.KEY says otherwise
        recipe = source_model(recipe, init_from, out)
    if source is not None:
        model_config(recipe, None, source)
    recipe = source_data(recipe, source)
    return source_precision(recipe, device, resume_from)


def keep_threads(recipe: Recipe, resumed_from: Path | None) -> None:
    """A resumed run with `train.threads: auto` computes with the CPU thread count its checkpoint trained
    with (config.json's cpu_threads), as it keeps its precision: an exact resume needs the same reductions."""
    if resumed_from is not None and recipe.train.threads == "auto":
        set_threads(CheckpointRecord.read(resumed_from).cpu_threads or "auto")


def prior_steps(source: Path | None, resumed: bool) -> int:
    """Optimizer updates behind the weights a run starts from, before its own step 0: none for a fresh
    run, the resumed checkpoint's own count on resume, and all of an `init_from` checkpoint's (its prior
    steps and its steps; a converted checkpoint carries its source's), so an uptrained model reads as
    300+15 steps rather than 15."""
    if source is None:
        return 0
    record = CheckpointRecord.read(source)
    return record.prior_steps if resumed else record.total_steps


def source_data(recipe, source: Path | None):
    """The recipe with `data.train: null` resolved: the training and validation data the source checkpoint
    (train.init_from, or the run being resumed) was trained on, as its config.json records them. An
    uptraining recipe can then follow the run it starts from instead of training a model of one corpus on
    another. A recipe that names its data is returned as it is."""
    if recipe.data.train is not None:
        return recipe
    if source is None:
        raise ConfigError("data.train: null means the data of the train.init_from checkpoint, but the run starts "
                          "from none; set data.train or train.init_from")
    data = CheckpointRecord.read(source).data
    if data is None or data.train is None:
        raise ConfigError(f"data.train: null means the data {source} was trained on, but its config.json does not "
                          "record it (an imported or older checkpoint); set data.train")
    known = {"train": data.train, "valid": data.valid, "text_field": data.text_field}
    if data.valid_fraction is not None:
        known["valid_fraction"] = data.valid_fraction
    return dataclasses.replace(recipe, data=dataclasses.replace(recipe.data, **known))


def source_precision(recipe, device, resumed_from: Path | None):
    """The recipe with `train.precision: auto` decided for `device` (optim.resolve_precision), so recipe.yaml,
    the start block and every checkpoint say what ran. A resumed run keeps the precision its checkpoint
    trained with, as it keeps its CPU thread count: an exact resume needs the same arithmetic."""
    if recipe.train.precision != "auto":
        return recipe
    saved = trained_precision(resumed_from) if resumed_from is not None else None
    precision = saved if saved in PRECISIONS else resolve_precision("auto", device)
    return dataclasses.replace(recipe, train=dataclasses.replace(recipe.train, precision=precision))


def trained_precision(checkpoint: Path) -> object:
    """The precision a checkpoint trained in: its config.json's, or for one written before `auto` existed,
    its run's recipe.yaml's (<run>/checkpoints/step-N -> <run>/recipe.yaml); None when neither says."""
    saved = CheckpointRecord.read(checkpoint).precision
    run_recipe = checkpoint.parent.parent / RECIPE_FILE
    if saved is not None or not run_recipe.is_file():
        return saved
    train = read_run_recipe(run_recipe, run_recipe.read_bytes()).get("train")
    return train.get("precision") if isinstance(train, dict) else None


def check_tokenizer_kept(recipe, resumed_from: Path) -> None:
    """A resumed run keeps its checkpoint's tokenizer: the weights were trained on its token ids. The
    tokenizer section is moot then (recipe.yaml keeps the one that trained the run, see `write_recipe`),
    but a `tokenizer.path` naming a different tokenizer would be silently ignored: that is an error."""
    path = recipe.tokenizer.path
    if not path or not (resumed_from / "tokenizer.json").is_file():
        return
    if load_tokenizer(path).fingerprint() != load_tokenizer(resumed_from).fingerprint():
        raise ConfigError(f"tokenizer.path {path}: differs from the tokenizer of {resumed_from}, which a resumed "
                          "run keeps (its weights were trained on those token ids); leave tokenizer.path out, "
                          "or start a new run")


def source_model(recipe, source: Path, out=None):
    """The recipe of a run started from a checkpoint (train.init_from) with the checkpoint's model: every
    model key is the checkpoint's, except those given by `--set model.KEY` (which `model_config` then checks)
    and the MAY_DIFFER ones the recipe writes out. A user continuing an imported model names the checkpoint,
    not its shape, and fine-tunes it with the dropout it was trained with (an imported BERT's 0.1 attention
    dropout) unless the recipe says otherwise, as HF's `from_pretrained` keeps the checkpoint's config.
    What came from the checkpoint, and the recipe's own dropouts where they differ from the checkpoint's,
    are said in one line each on `out` (the start block), when given."""
    saved = CheckpointRecord.read(source).model
    wanted = recipe.model.config(saved.vocab_size)
    explicit = {key.split(".", 1)[1] for key in recipe.overrides if key.startswith("model.")}
    written = {key.split(".", 1)[1] for key in recipe.given if key.startswith("model.")}
    kept = explicit | (set(MAY_DIFFER) & written)
    changed = [f for f in dataclasses.fields(ModelConfig) if f.name not in ("vocab_size", "pad_token_id")
               and getattr(wanted, f.name) != getattr(saved, f.name)]
    replaced = [f"{f.name} {getattr(wanted, f.name)!r} -> {getattr(saved, f.name)!r}" for f in changed
                if f.name not in kept]
    own = [f"{f.name} {getattr(wanted, f.name)!r} (the checkpoint has {getattr(saved, f.name)!r})" for f in changed
           if f.name in kept and f.name in MAY_DIFFER]
    values = {f.name: getattr(wanted if f.name in kept else saved, f.name) for f in dataclasses.fields(ModelConfig)}
    model = type(recipe.model)(**values, size=None)
    if recipe.data.format == "chat" and model.arch != "gpt":
        raise ConfigError(f"{source}: a {model.arch} model; data.format: chat fine-tunes a GPT (expected a gpt "
                          "checkpoint in train.init_from)")
    expected = OBJECTIVE_FOR_ARCH.get(model.arch)
    if expected and recipe.head_task is None and recipe.objective.name != expected:
        raise ConfigError(f"{source}: a {model.arch} model, which objective.name={recipe.objective.name!r} does not "
                          f"train (expected {expected!r}; set objective.name={expected})")
    if recipe.data.seq_len > model.max_seq_len:
        raise ConfigError(f"data.seq_len: {recipe.data.seq_len} exceeds the max_seq_len {model.max_seq_len} of "
                          f"{source}; set data.seq_len <= {model.max_seq_len}")
    if replaced and out is not None:
        out.print(f"model: as {source}, not the recipe's: " + "; ".join(replaced), highlight=False, markup=False)
    if own and out is not None:
        out.print("model: the recipe's, not the checkpoint's: " + "; ".join(own), highlight=False, markup=False)
    return dataclasses.replace(recipe, model=model)


def model_config(recipe, tokenizer, source: Path | None) -> ModelConfig:
    """The model config of this run: the recipe's (vocabulary from the tokenizer) for a fresh start, the
    checkpoint's when resuming or initialising from one. A recipe key that contradicts the checkpoint is an
    error naming every such key; only MAY_DIFFER keys (dropout, attention kernel) follow the recipe."""
    if source is None:
        cfg = recipe.model.config(tokenizer.vocab_size)
        if cfg.pad_token_id is None and tokenizer.pad_id is not None:
            cfg = dataclasses.replace(cfg, pad_token_id=tokenizer.pad_id)
        return cfg.validate()
    saved = CheckpointRecord.read(source).model
    wanted = recipe.model.config(saved.vocab_size)
    skip = set(MAY_DIFFER) | {"pad_token_id"}
    conflicts = [f"model.{f.name} is {getattr(wanted, f.name)!r} but the checkpoint has {getattr(saved, f.name)!r}"
                 for f in dataclasses.fields(ModelConfig)
                 if f.name not in skip and getattr(wanted, f.name) != getattr(saved, f.name)]
    if conflicts:
        raise ConfigError(f"{source}: the recipe's model does not match the checkpoint's: " + "; ".join(conflicts)
                          + " (set these keys to the checkpoint's values)")
    return dataclasses.replace(saved, **{k: getattr(wanted, k) for k in MAY_DIFFER}).validate()
