"""The sections of a recipe, one dataclass each: every key with its type, default and meaning.

`recipe.py` assembles them into a `Recipe` and loads YAML onto them; each section's `problems()` names
every invalid value of its own keys (checks across sections live on `Recipe`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, fields

from ..errors import ConfigError
from ..models.config import ModelConfig, type_problem
from ..ranges import FRACTION, NON_NEGATIVE, OPEN_FRACTION, POSITIVE, UP_TO_ONE, float_problems
from ..models.head_config import POOLINGS
from ..runtime import PRECISIONS, check_device
from ..tokenization.labelled import Columns
from ..tokenization.mask_replace import MASK_REPLACE, mask_replace_problem
from ..tokenization.sources import is_mixture, source_problems
from ..tokenization.spec import TokenizerSpec
from .budget import parse_duration
from .task_names import BEST_BY_LOSS, BUILTIN_TASKS, best_key, score_names

OBJECTIVE_FOR_ARCH = {"bert": "mlm", "gpt": "clm", "transformer": "seq2seq"}
SCHEDULES = ("constant", "linear", "cosine", "noam", "wsd")
TRAIN_PRECISIONS = ("auto",) + PRECISIONS  # auto: bf16 where the hardware computes it natively (optim.resolve_precision)
FUSED_LOSS = ("auto", "on", "off")
OPTIMIZERS = ("adamw", "muon")
TASK_OBJECTIVES = {"classify": "classification", "regress": "regression"}  # objective.name -> the head's task
TASK_METRICS = {"classification": ("accuracy", "macro_f1", "matthews"), "regression": ("pearson", "spearman")}
TRUNCATIONS = ("head", "tail", "head+tail")
POOLING_NAMES = tuple(sorted({p for ps in POOLINGS.values() for p in ps}))  # cls, last, mean
AUTO_SIZE = "auto"  # model.size: the shape `tfkit plan` chooses for train.max_time on this machine


@dataclass
class ModelSection(ModelConfig):
    # named size (tiny, small) whose values fill every key not given here; auto = planned for train.max_time on
    # this machine at the start of the run (`tfkit plan`, trainer/plan.py), the keys given here kept
    size: str | None = None
    vocab_size: int | None = None  # null = the tokenizer's vocabulary size

    def problems(self, prefix: str = "model") -> list[str]:
        """ModelConfig's checks; an unset vocab_size (the tokenizer's, known only later) passes as 1."""
        return dataclasses.replace(self, vocab_size=self.vocab_size or 1).config().problems(prefix)

    def config(self, vocab_size: int | None = None) -> ModelConfig:
        """The plain ModelConfig, with the vocabulary size taken from the tokenizer when unset."""
        values = {f.name: getattr(self, f.name) for f in fields(ModelConfig)}
        values["vocab_size"] = self.vocab_size or vocab_size or 1
        return ModelConfig(**values)


@dataclass
class TokenizerSection(TokenizerSpec):
    path: str | None = None  # an existing tokenizer folder or tokenizer.json; null = train one
    max_train_mb: float | None = None  # train the tokenizer on at most this many MB of the corpus

    def problems(self, prefix: str = "tokenizer") -> list[str]:
        out = [] if self.path else super().problems(prefix)
        return out + float_problems(self, prefix, max_train_mb=POSITIVE)


@dataclass
class DataSection:
    # file, glob, folder, .jsonl, stdlib:docs|code; or a list of sources mixed by weight, [{name, path, weight,
    # repeat, text_field}] (docs/data.md); null = the init_from checkpoint's data
    train: str | list[dict] | None = "stdlib:docs:train"
    # null = hold out valid_fraction of data.train (chunks spread through it; of each source of a list); a list of
    # named sources [{name, path}] validates on each; a stdlib split that does not match data.train becomes null
    # unless given by --set
    valid: str | list[dict] | None = "stdlib:docs:valid"
    valid_fraction: float = 0.05  # with valid: null, the share of data.train (of each source) held out for validation
    text_field: str = "text"  # JSON/JSONL key or Parquet/Arrow column holding the text
    source_field: str = "source"  # seq2seq JSONL: field of the source text
    target_field: str = "target"  # seq2seq JSONL: field of the target text
    seq_len: int = 256  # tokens per training sequence (<= model.max_seq_len)
    # clm / mlm: attention only inside each packed document (its separator belongs to the document it ends),
    # boundaries from the token shards; a training option only: checkpoints, eval, generation and HF export are
    # as without it
    document_mask: bool = False
    reset_positions: bool = False  # with document_mask: positions restart at 0 at each document in a row
    cache_dir: str | None = None  # token-shard cache; null = <run folder>/data
    # text: documents to continue (pretraining); chat: instruction / chat fine-tuning of a GPT (objective clm,
    # usually train.init_from): data.train / data.valid are JSONL (.gz / .zst) or Parquet of {prompt, response}
    # or {messages: [{role: system|user|assistant, content}]}, framed by the chat template (the tokenizer and
    # the embeddings grow by its tokens), loss on the assistant's tokens only, conversations packed with
    # attention inside each one
    format: str = "text"
    # train on the first N training examples only (labelled rows, packed chat rows, or blocks of data.seq_len tokens),
    # for a quick trial (HF's max_train_samples); null = all of them. Validation data is not cut
    max_train_samples: int | None = None

    def problems(self, prefix: str = "data") -> list[str]:
        out = float_problems(self, prefix, valid_fraction=OPEN_FRACTION)
        out += source_problems(self.train, f"{prefix}.train")
        out += source_problems(self.valid, f"{prefix}.valid", valid=True)
        if is_mixture(self.train) and self.max_train_samples is not None:
            out.append(f"{prefix}.max_train_samples: keeps the first examples of one corpus; a list of sources "
                       f"(data.train) is sized by its weights (expected null)")
        if self.max_train_samples is not None and self.max_train_samples < 1:
            out.append(f"{prefix}.max_train_samples: got {self.max_train_samples}, expected a positive integer or null")
        if self.format not in ("text", "chat"):
            out.append(f"{prefix}.format: got {self.format!r}, expected text or chat")
        if self.seq_len < 2:
            out.append(f"{prefix}.seq_len: got {self.seq_len}, expected an integer >= 2")
        if self.reset_positions and not self.document_mask:
            out.append(f"{prefix}.reset_positions: needs {prefix}.document_mask: true (positions restart at the "
                       "documents the mask keeps apart)")
        return out


def auto_size_problems(model: ModelSection, train: TrainSection, fine_tuning: bool) -> list[str]:
    """model.size: auto plans for a time budget, from random weights, on one process."""
    if model.size != AUTO_SIZE:
        return []
    if fine_tuning or train.init_from:
        return ["model.size: auto plans a model to pretrain; a run from train.init_from takes the checkpoint's "
                "shape (expected null)"]
    if train.max_time is None:
        return ["model.size: auto plans the model for a time budget: give train.max_time (e.g. 10m)"]
    return []


def packing_problems(data: DataSection, objective: ObjectiveSection) -> list[str]:
    """Packing keys the objective cannot honour: seq2seq rows hold one padded pair each, nothing packed; and
    a list of sources, which mixes documents before packing (clm, mlm), under a key that reads one corpus."""
    for key in ("train", "valid"):
        if is_mixture(getattr(data, key)) and (data.format == "chat" or objective.name not in ("clm", "mlm")):
            what = "chat data (data.format: chat)" if data.format == "chat" else f"objective {objective.name}"
            return [f"data.{key}: a list of sources mixes pretraining text for objective clm or mlm; {what} reads "
                    "one corpus (a file, glob, folder or stdlib:...)"]
    if data.format == "chat" and objective.name != "clm":
        return [f"data.format: chat trains a GPT's next tokens (expected objective.name clm, got {objective.name})"]
    if data.document_mask and objective.name == "seq2seq":
        return ["data.document_mask: seq2seq rows are single pairs, not packed documents (expected false, or "
                "objective clm / mlm)"]
    return []


@dataclass
class ObjectiveSection:
    name: str = "clm"  # mlm (bert) | clm (gpt) | seq2seq (transformer) | classify | regress (fine-tuning: task section)
    mask_prob: float = 0.15  # mlm: fraction of non-special tokens chosen for prediction
    whole_word_mask: bool = False  # mlm: mask every piece of a chosen word together
    # mlm: shares of the chosen tokens that become [MASK], a random token, and stay unchanged (BERT's 80/10/10);
    # three non-negative numbers summing to 1
    mask_replace: list[float] = field(default_factory=lambda: list(MASK_REPLACE))
    label_smoothing: float = 0.0  # 0.1 in the original Transformer
    # clm / seq2seq output head: on = the chunked head + cross-entropy of trainer/fused_loss.py (no (N, V)
    # logits), off = logits then F.cross_entropy, auto = on for CPUs, off for GPUs (fused_loss.use_fused_loss).
    # YAML reads on/off as true/false; both spellings are accepted and stored as "on"/"off".
    fused_loss: str | bool = "auto"

    def __post_init__(self) -> None:
        if isinstance(self.fused_loss, bool):
            self.fused_loss = "on" if self.fused_loss else "off"
        if isinstance(self.mask_replace, list) and all(type_problem(v, float) is None for v in self.mask_replace):
            self.mask_replace = [float(v) for v in self.mask_replace]  # YAML's [1, 0, 0] holds ints

    def problems(self, prefix: str = "objective") -> list[str]:
        out = float_problems(self, prefix, mask_prob=OPEN_FRACTION, label_smoothing=FRACTION)
        replace = mask_replace_problem(self.mask_replace, f"{prefix}.mask_replace")
        if replace:
            out.append(replace)
        if self.name not in (*OBJECTIVE_FOR_ARCH.values(), *TASK_OBJECTIVES):
            out.append(f"{prefix}.name: got {self.name!r}, expected one of mlm, clm, seq2seq, classify, regress")
        if self.fused_loss not in FUSED_LOSS:
            out.append(f"{prefix}.fused_loss: got {self.fused_loss!r}, expected one of {', '.join(FUSED_LOSS)}")
        return out


@dataclass
class TaskSection:
    """Fine-tuning (objective classify / regress): where data.train's labelled rows keep their text and label,
    how a text longer than data.seq_len is read, and the head on the pooled vector (models/heads.py)."""

    text: str | int = "text"  # column (name, or position from 0) of the text
    text_pair: str | int | None = None  # column of a pair's second text; null = single texts
    label: str | int = "label"  # column of the class label (classify) or float target (regress)
    header: bool = True  # CSV / TSV: the first line names the columns
    truncation: str = "head"  # head | tail | head+tail: which tokens a text longer than data.seq_len keeps
    stride: int | None = None  # read long single texts whole, as windows this many tokens apart (logits averaged)
    # bert / gpt: each batch's examples back to back in as few rows of data.seq_len as fit, attention and
    # positions kept inside each (the same logits as padded rows, without computing the padding); false = one
    # example per row, padded to data.seq_len (the same shapes every step)
    packing: bool = True
    pooling: str | None = None  # cls | last | mean; null = the family's own (bert cls, gpt last, transformer mean)
    dropout: float = 0.1  # on the pooled vector, before the classifier (BERT's fine-tuning default)
    # the validation score that keep_best keeps and the report leads with: auto (accuracy for classify, pearson for
    # regress) | accuracy | macro_f1 | matthews | pearson | spearman
    metric: str = "auto"

    def problems(self, prefix: str = "task") -> list[str]:
        """Every key's own problems; whether the pooling suits the body is `Recipe.problems`' (the arch of a
        random-init control) or the trainer's (a checkpoint's arch, known once it is read)."""
        out = float_problems(self, prefix, dropout=FRACTION)
        columns = Columns(self.text, self.text_pair, self.label).problems()  # what the labelled reader refuses
        out += [p.replace("columns", prefix, 1) for p in columns]
        if self.pooling is not None and self.pooling not in POOLING_NAMES:
            out.append(f"{prefix}.pooling: got {self.pooling!r}, expected null (the family's own) or one of "
                       f"{', '.join(POOLING_NAMES)}")
        if self.truncation not in TRUNCATIONS:
            out.append(f"{prefix}.truncation: got {self.truncation!r}, expected one of {', '.join(TRUNCATIONS)}")
        if self.stride is not None and self.stride < 1:
            out.append(f"{prefix}.stride: got {self.stride}, expected a positive integer or null")
        metrics = [m for ms in TASK_METRICS.values() for m in ms]
        if self.metric != "auto" and self.metric not in metrics:
            out.append(f"{prefix}.metric: got {self.metric!r}, expected auto or one of {', '.join(metrics)}")
        return out

    def metric_for(self, task: str) -> str:
        return TASK_METRICS[task][0] if self.metric == "auto" else self.metric


@dataclass
class OptimSection:
    # adamw (every parameter) | muon (the blocks' matrices by Muon, momentum orthogonalised by Newton-Schulz;
    # embeddings, output head, norms and biases by AdamW with the keys below; trainer/muon.py)
    name: str = "adamw"
    lr: float = 3e-4  # peak learning rate (the noam schedule scales it as a multiplier)
    weight_decay: float = 0.1  # decoupled (AdamW); never applied to norms, biases, embeddings
    beta1: float = 0.9  # AdamW's first-moment decay
    beta2: float = 0.95  # AdamW's second-moment decay (0.999 in BERT, 0.95 in GPT-3)
    eps: float = 1e-8  # AdamW's denominator floor
    grad_clip: float | None = 1.0  # max global gradient norm; null = no clipping
    muon_lr: float = 0.02  # muon: peak learning rate of the Muon matrices (the schedule scales it as it scales lr)
    muon_momentum: float = 0.95  # muon: momentum of the Muon matrices (Nesterov)
    muon_weight_decay: float = 0.0  # muon: decoupled weight decay of the Muon matrices (lr * wd per step)

    def problems(self, prefix: str = "optim") -> list[str]:
        out = float_problems(self, prefix, lr=POSITIVE, weight_decay=NON_NEGATIVE, beta1=FRACTION,
                             beta2=FRACTION, eps=POSITIVE, grad_clip=POSITIVE, muon_lr=POSITIVE,
                             muon_momentum=FRACTION, muon_weight_decay=NON_NEGATIVE)
        if self.name not in OPTIMIZERS:
            out.append(f"{prefix}.name: got {self.name!r}, expected one of {', '.join(OPTIMIZERS)}")
        return out


@dataclass
class ScheduleSection:
    name: str = "cosine"  # constant | linear | cosine | noam | wsd
    warmup_steps: int = 100  # linear warmup from 0 to optim.lr
    min_lr: float = 0.0  # floor of the cosine / linear / wsd decay
    decay_fraction: float = 0.2  # wsd: final fraction of the steps spent decaying

    def problems(self, prefix: str = "schedule") -> list[str]:
        out = float_problems(self, prefix, min_lr=NON_NEGATIVE, decay_fraction=UP_TO_ONE)
        if self.name not in SCHEDULES:
            out.append(f"{prefix}.name: got {self.name!r}, expected one of {', '.join(SCHEDULES)}")
        if self.warmup_steps < 0:
            out.append(f"{prefix}.warmup_steps: got {self.warmup_steps}, expected >= 0")
        if self.name == "noam" and self.warmup_steps < 1:
            out.append(f"{prefix}.warmup_steps: noam needs warmup_steps >= 1")
        return out


@dataclass
class TrainSection:
    max_steps: int = 1000  # optimizer steps (with max_time: the most the run may take)
    # passes over the training examples (HF's num_train_epochs): sets max_steps from the data once it is read
    # (examples // batch_size updates an epoch, rounded up); null = max_steps decides
    epochs: float | None = None
    # a time budget such as 90s, 3m or 1h30m (the unit is required) for training proper (updates, validations,
    # checkpoints): the run ends, last checkpoint and validation written, when it is spent, its schedule decaying
    # over the steps that fit, validating at 8 evenly spaced points of them; setup before (tokenizer, token cache)
    # and the sample after come on top (trainer/budget.py); null = max_steps decides
    max_time: str | int | float | None = None
    batch_size: int = 32  # global batch in sequences per optimizer step (all ranks, all micro-batches)
    grad_accum: int = 1  # micro-batches per optimizer step
    seed: int = 1337  # initial weights, batch order, masks and dropout: one seed, one run
    log_every: int = 10  # steps between log lines / metrics.jsonl rows
    eval_every: int = 200  # steps between validations (with max_time, also 8 evenly spaced ones)
    save_every: int = 500  # steps between checkpoints (one is always written at the end)
    keep_last: int = 3  # checkpoints kept in the run folder
    # auto (bf16 where the device computes it natively, else fp32) | fp32 (TF32 matmuls on CUDA) | bf16 (autocast)
    # | fp16 (autocast + grad scaler)
    precision: str = "auto"
    compile: bool = False  # torch.compile the model
    activation_checkpointing: bool = False  # recompute block activations in backward to save memory
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    threads: int | str = "auto"  # CPU threads for torch: auto = the cores idle right now (within this process's), or N
    max_bad_steps: int = 10  # consecutive NaN/inf steps (skipped) before the run stops
    init_from: str | None = None  # checkpoint or run folder whose weights start this run
    keep_best: bool = False  # also keep the weights of the best validation loss in <run>/best/ (eval and generate take them)
    distributed: str = "ddp"  # ddp | fsdp, when launched with torchrun
    # several processes: write each sharded checkpoint from a thread while training goes on (its state staged in
    # host memory first, one more copy of each process's shard); one process always writes at once
    async_save: bool = False

    def problems(self, prefix: str = "train") -> list[str]:
        out = float_problems(self, prefix, epochs=POSITIVE)
        for name in ("max_steps", "batch_size", "grad_accum", "log_every", "eval_every", "save_every",
                     "keep_last", "max_bad_steps"):
            if getattr(self, name) < 1:
                out.append(f"{prefix}.{name}: got {getattr(self, name)}, expected a positive integer")
        if self.grad_accum >= 1 and self.batch_size % self.grad_accum:
            out.append(f"{prefix}.batch_size: {self.batch_size} is not divisible by "
                       f"{prefix}.grad_accum={self.grad_accum}")
        if self.precision not in TRAIN_PRECISIONS:
            out.append(f"{prefix}.precision: got {self.precision!r}, expected one of {', '.join(TRAIN_PRECISIONS)}")
        if self.distributed not in ("ddp", "fsdp"):
            out.append(f"{prefix}.distributed: got {self.distributed!r}, expected ddp or fsdp")
        try:
            check_device(self.device, f"{prefix}.device")
        except ConfigError as e:
            out.append(str(e))
        if self.threads != "auto" and (isinstance(self.threads, str) or not 1 <= self.threads <= 4096):
            out.append(f"{prefix}.threads: got {self.threads!r}, expected auto or a number of threads >= 1")
        if isinstance(self.max_time, (int, float)) and not isinstance(self.max_time, bool):
            out.append(f"{prefix}.max_time: got {self.max_time!r} without a unit (seconds? minutes?), expected a "
                       "duration such as 90s, 3m or 1h30m")
        elif self.max_time is not None:
            try:
                parse_duration(self.max_time, f"{prefix}.max_time")
            except ConfigError as exc:
                out.append(str(exc))
        return out


@dataclass
class EvalSection:
    batches: int = 20  # validation batches per evaluation (the same batches every time, spread through the set)
    batch_size: int | None = None  # null = the training micro-batch (train.batch_size / train.grad_accum)
    # causal models: text to continue after training; auto = the opening of the run's validation text; "" = from
    # the start of a document; null = no sample
    sample_prompt: str | None = None
    sample_tokens: int = 64  # length of the sample generated from sample_prompt at the end
    # downstream tasks scored on the live weights at validations (GPT models; trainer/downstream.py): task files
    # (multiple-choice / cloze JSONL, as `tfkit eval --task` reads), built-in stdlib:docs-cloze (last word of
    # held-out docstring sentences) and stdlib:docs-choice (4-way choice of a held-out sentence's ending), or
    # lm-eval:NAME (an lm-evaluation-harness multiple-choice task whose data its cache holds)
    tasks: list[str] = field(default_factory=list)
    # score eval.tasks / eval.probe every this many updates (a multiple of train.eval_every; step 0 and the last
    # validation always); null = at every validation
    task_every: int | None = None
    task_limit: int | None = None  # score the first N items of each task; null = every item
    task_batch_size: int = 8  # contexts per forward when scoring eval.tasks (`tfkit eval --task --batch-size`)
    # a linear probe on frozen pooled features (any model): {data: FILE, text: COLUMN, label: COLUMN, header: true},
    # or just the data, e.g. stdlib:topics (docstrings labelled by package): fitted on a seeded held-out split,
    # its held-out accuracy logged as task/probe-NAME/acc
    probe: dict | str | None = None
    # what train.keep_best keeps: val_loss, or task:NAME (that task's acc; task:NAME/acc_norm for another metric)
    best_by: str = "val_loss"

    def problems(self, prefix: str = "eval") -> list[str]:
        out = []
        if self.batches < 1:
            out.append(f"{prefix}.batches: got {self.batches}, expected a positive integer")
        if self.batch_size is not None and self.batch_size < 1:
            out.append(f"{prefix}.batch_size: got {self.batch_size}, expected a positive integer or null")
        return out + downstream_problems(self, prefix)


PROBE_KEYS = ("data", "text", "label", "header")


def downstream_problems(e: EvalSection, prefix: str = "eval") -> list[str]:
    """The keys of in-loop downstream scores (trainer/downstream.py); files are read when the run starts."""
    out = []
    for name in ("task_every", "task_limit"):
        if getattr(e, name) is not None and getattr(e, name) < 1:
            out.append(f"{prefix}.{name}: got {getattr(e, name)}, expected a positive integer or null")
    if e.task_batch_size < 1:
        out.append(f"{prefix}.task_batch_size: got {e.task_batch_size}, expected a positive integer")
    if any(not t.strip() for t in e.tasks):
        out.append(f"{prefix}.tasks: an empty entry (expected a task file, {', '.join(BUILTIN_TASKS)} or lm-eval:NAME)")
    for task in e.tasks:
        if task.startswith("stdlib:") and task not in BUILTIN_TASKS:
            out.append(f"{prefix}.tasks: no built-in task {task!r} (expected one of {', '.join(BUILTIN_TASKS)})")
    if isinstance(e.probe, dict):
        unknown = [k for k in e.probe if k not in PROBE_KEYS]
        if unknown:
            out.append(f"{prefix}.probe: unknown key(s) {', '.join(map(str, unknown))} "
                       f"(expected {', '.join(PROBE_KEYS)})")
        if not isinstance(e.probe.get("data"), str) or not e.probe["data"]:
            out.append(f"{prefix}.probe.data: expected the labelled file (or stdlib:topics), got "
                       f"{e.probe.get('data')!r}")
        out += [p.replace("columns.", f"{prefix}.probe.", 1) for p in
                Columns(e.probe.get("text", "text"), None, e.probe.get("label", "label")).problems()]
        if not isinstance(e.probe.get("header", True), bool):
            out.append(f"{prefix}.probe.header: got {e.probe['header']!r}, expected true or false")
    elif e.probe is not None and not e.probe:
        out.append(f"{prefix}.probe: empty (expected labelled data such as stdlib:topics, or null)")
    names = score_names(e.tasks, e.probe)
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        out.append(f"{prefix}.tasks: two tasks named {', '.join(twice)} (a file's name is its stem); rename one")
    if e.best_by != BEST_BY_LOSS:
        key = best_key(e.best_by) if e.best_by.startswith("task:") else None
        if key is None or key.split("/")[1] not in names:
            out.append(f"{prefix}.best_by: got {e.best_by!r}, expected val_loss or task:NAME with NAME one of "
                       f"{', '.join(names) or 'the scored tasks (eval.tasks, eval.probe: none given)'}")
    return out


def downstream_recipe_problems(e: EvalSection, train: TrainSection, arch: str, fine_tuning: bool) -> list[str]:
    """Downstream keys against the other sections (Recipe.problems)."""
    out = []
    if fine_tuning and (e.tasks or e.probe):
        out.append("eval.tasks: a fine-tuning run validates on its own task's labels (expected no eval.tasks or "
                   "eval.probe)")
    if e.tasks and arch != "gpt" and not train.init_from:
        out.append(f"eval.tasks: tasks are scored by a causal model's log-likelihoods; model.arch is {arch!r} "
                   "(an encoder gets a downstream score from eval.probe)")
    if e.task_every is not None and e.task_every >= 1 and train.eval_every >= 1 and e.task_every % train.eval_every:
        out.append(f"eval.task_every: {e.task_every} is not a multiple of train.eval_every={train.eval_every} "
                   "(tasks are scored at validations)")
    if e.best_by != BEST_BY_LOSS and not train.keep_best:
        out.append(f"eval.best_by: {e.best_by} chooses the checkpoint train.keep_best keeps; set train.keep_best: true")
    return out


@dataclass
class LogSection:
    run_dir: str | None = None  # null = runs/<recipe>-<timestamp>
    tensorboard: bool = True  # write event files when tensorboard is installed
    plot: bool = True  # write loss.png at the end when matplotlib is installed
    progress: bool = True  # progress bars
    # log metrics.jsonl's rows, the resolved recipe and the final validation to Weights & Biases (the trackers
    # extra; WANDB_MODE=offline needs no account and writes <run>/wandb/)
    wandb: bool = False
    wandb_project: str | None = None  # W&B project of log.wandb; null = tfkit (the run is named after its folder)

    def problems(self, prefix: str = "log") -> list[str]:
        from .trackers import wandb_problem  # any path and any booleans are valid; W&B needs its package

        problem = wandb_problem() if self.wandb else None
        return [problem] if problem else []
