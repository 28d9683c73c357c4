"""Builders shared by several test files: tiny models, recipes, loops, HF folders and a fake clock.

Tests import these from here, never from another test file: importing a test module runs its module-level
setup and ties two files' fixtures together."""

import functools
import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tfkit.checkpoints.run_record import read_metrics
from tfkit.checkpoints.weights import save_model
from tfkit.evaluation.evaluate import EvalRequest, evaluate
from tfkit.models import ModelConfig, build_model
from tfkit.tokenization import load_tokenizer
from tfkit.trainer import objectives
from tfkit.trainer.distributed import DistInfo
from tfkit.trainer.loop import Loop
from tfkit.trainer.objectives import LossModule
from tfkit.trainer.optim import build_optimizer, grad_scaler
from tfkit.trainer.recipe import load_recipe
from tfkit.trainer.step import Update

# --- models ------------------------------------------------------------------------------------------------

def tiny_cfg(arch: str, **overrides) -> ModelConfig:
    """A model small enough that a test of every arch x position x head layout runs in seconds."""
    base = dict(arch=arch, vocab_size=61, d_model=32, n_layers=2, n_heads=4, max_seq_len=32)
    return ModelConfig(**{**base, **overrides})


# --- whole runs ----------------------------------------------------------------------------------------------

MAX_STEPS = 24  # the length of a `write_recipe` run
ONE_THREAD = {**os.environ, "OMP_NUM_THREADS": "1"}  # subprocesses compute exactly as this process does
TINY = ["train.max_steps=2", "train.batch_size=4", "eval.batch_size=4", "data.seq_len=32", "eval.batches=1",
        "tokenizer.vocab_size=400", "tokenizer.max_train_mb=0.1", "log.progress=false", "log.plot=false",
        "log.tensorboard=false", "eval.sample_prompt=null", "train.threads=1", "schedule.warmup_steps=1"]
"""`--set` overrides that shrink a shipped recipe to a two-step run."""


def write_corpus(folder: Path, text: str) -> tuple[Path, Path]:
    """62 kB of training text and the next 8 kB as validation text, from `text` (the English fixture)."""
    train, valid = folder / "train.txt", folder / "valid.txt"
    train.write_text(text[:62_000], encoding="utf-8")
    valid.write_text(text[62_000:70_000], encoding="utf-8")
    return train, valid


def write_recipe(folder: Path, text: str, arch: str = "gpt", **sections) -> Path:
    """A recipe small enough for CI: 2 layers of width 32, 8 sequences of 32 tokens, one CPU."""
    train, valid = write_corpus(folder, text)
    objective = {"gpt": "clm", "bert": "mlm", "transformer": "seq2seq"}[arch]
    recipe = {
        "model": {"arch": arch, "d_model": 32, "n_layers": 2, "n_heads": 4, "max_seq_len": 64, "dropout": 0.1},
        "tokenizer": {"kind": "wordpiece" if arch == "bert" else "bpe", "vocab_size": 400,
                      "special_tokens": ["<|mask|>"] if arch == "transformer" else []},
        "data": {"train": str(train), "valid": str(valid), "seq_len": 32},
        "objective": {"name": objective},
        "optim": {"lr": 3e-3},
        "schedule": {"name": "cosine", "warmup_steps": 4},
        "train": {"max_steps": MAX_STEPS, "batch_size": 8, "log_every": 1, "eval_every": 8, "save_every": 4,
                  "keep_last": 20, "device": "cpu",
                  "precision": "fp32"},  # the same arithmetic on every machine, in every process
        "eval": {"batches": 2, "sample_prompt": None},
        "log": {"progress": False, "plot": False, "tensorboard": False},
    }
    for section, values in sections.items():
        recipe[section] = {**recipe.get(section, {}), **values}
    path = folder / f"{arch}.yaml"
    path.write_text(json.dumps(recipe))  # JSON is YAML
    return path


def losses(run_dir: Path) -> dict:
    """{(step, key): value} for every loss-like number in metrics.jsonl."""
    return {(r["step"], k): r[k] for r in read_metrics(run_dir / "metrics.jsonl")
            for k in ("loss", "val_loss", "accuracy", "val_accuracy", "lr") if k in r}


def weights(folder: Path) -> dict:
    return load_file(str(folder / "model.safetensors"))


# --- the training loop alone -----------------------------------------------------------------------------------

class RowDataset:
    """Row r of the global stream is a pure function of (seed, r); batch i of size B holds rows i*B..i*B+B-1,
    so one batch of 8 equals two consecutive batches of 4 (what makes accumulation comparable)."""

    def __init__(self, seed: int = 0, seq_len: int = 16, vocab: int = 48) -> None:
        self.seed, self.seq_len, self.vocab = seed, seq_len, vocab

    def row(self, r: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + r)
        x = torch.randint(0, self.vocab, (self.seq_len + 1,), generator=g)
        x[1::2] = x[0::2][: len(x[1::2])]  # learnable: every odd token repeats the previous one
        return x

    def batch(self, i, batch_size, rank=0, world_size=1):
        per = batch_size // world_size
        rows = torch.stack([self.row(i * batch_size + rank * per + k) for k in range(per)])  # (B/world, T+1)
        return {"input_ids": rows[:, :-1], "labels": rows[:, 1:]}


def tiny_loop(overrides, rows=None,
              validate=lambda step: {"val_loss": 0.0, "val_ppl": 1.0, "val_accuracy": 0.0}):
    """A `Loop` of gpt-tiny over `RowDataset`, returning (loop, the metrics rows it logs, the steps it saves)."""
    recipe = load_recipe("gpt-tiny", ["schedule.warmup_steps=2", "train.log_every=1", "log.progress=false",
                                      "train.eval_every=1000", "train.save_every=1000", *overrides])
    torch.manual_seed(0)
    model = build_model(ModelConfig(arch="gpt", vocab_size=48, d_model=32, n_layers=2, n_heads=4, max_seq_len=32))
    info = DistInfo()
    rows = [] if rows is None else rows
    saves = []
    update = Update.of(recipe, model, LossModule(model, recipe.objective), build_optimizer(model, recipe.optim, info.device),
                       grad_scaler("fp32", info.device), info)
    loop = Loop(recipe, update, RowDataset(), rows.append, saves.append, validate)
    return loop, rows, saves


def poison_loss(monkeypatch, bad_calls):
    """Make the loss NaN on the given (0-based) calls of compute_loss: a hooked loss."""
    original, calls = objectives.compute_loss, [0]

    def hooked(model, batch, objective):
        out = original(model, batch, objective)
        calls[0] += 1
        if calls[0] - 1 in bad_calls:
            out.loss_sum = out.loss_sum * float("nan")
        return out

    monkeypatch.setattr(objectives, "compute_loss", hooked)


# --- HuggingFace folders ---------------------------------------------------------------------------------------

HF_TEXT = ["The quick brown fox jumps over the lazy dog.", "A lazy dog sleeps; the fox runs away!"] * 20


def byte_level_tokenizer(folder: Path) -> None:
    """A GPT-2-style tokenizer saved the way transformers saves one."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    transformers = pytest.importorskip("transformers")

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(HF_TEXT, trainers.BpeTrainer(vocab_size=290, special_tokens=["<|endoftext|>"],
                            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>",
                                         eos_token="<|endoftext|>").save_pretrained(folder)


def hf_folder(folder: Path, kind: str, tokenizer: bool = False) -> Path:
    """A tiny random llama, bert or gpt2 saved by transformers; the test is skipped where it is missing."""
    transformers = pytest.importorskip("transformers")

    torch.manual_seed(0)
    if kind == "llama":
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
            vocab_size=300, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=96, max_position_embeddings=64, bos_token_id=0, eos_token_id=0))
    elif kind == "bert":
        model = transformers.BertModel(transformers.BertConfig(
            vocab_size=300, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
            max_position_embeddings=64))
    else:
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
            vocab_size=300, n_embd=64, n_layer=2, n_head=4, n_positions=64, bos_token_id=0, eos_token_id=0))
    model.save_pretrained(folder)
    if tokenizer:
        byte_level_tokenizer(folder)
    return folder


# --- tiny HF models with random weights (the reference of the import and export tests) --------------------

V, D, L, H, T_MAX = 300, 64, 2, 4, 64  # vocab, width, layers, heads and context of the tiny HF models


def randomise(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Every parameter away from its init (norm weights around 1, the rest N(0, 0.1)): a swapped or
    transposed tensor, a missing bias or a wrong epsilon then shows in the logits."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            is_norm = "Norm" in type(module).__name__  # LayerNorm, LlamaRMSNorm, ...
            for name, p in module.named_parameters(recurse=False):
                noise = 0.1 * torch.randn(p.shape, generator=gen)
                p.copy_(1 + noise if is_norm and name == "weight" else noise)
    return model.eval()


def bert_config(**kw):
    transformers = pytest.importorskip("transformers")
    return transformers.BertConfig(vocab_size=V, hidden_size=D, num_hidden_layers=L, num_attention_heads=H,
                                   intermediate_size=4 * D, max_position_embeddings=T_MAX, **kw)


def gpt2_config(**kw):
    transformers = pytest.importorskip("transformers")
    kw.setdefault("activation_function", "gelu")
    return transformers.GPT2Config(vocab_size=V, n_embd=D, n_layer=L, n_head=H, n_positions=T_MAX,
                                   bos_token_id=0, eos_token_id=0, **kw)


def llama_config(**kw):
    transformers = pytest.importorskip("transformers")
    kw.setdefault("num_key_value_heads", 2)
    return transformers.LlamaConfig(vocab_size=V, hidden_size=D, num_hidden_layers=L, num_attention_heads=H,
                                    intermediate_size=96, max_position_embeddings=T_MAX, **kw)


def qwen3_config(**kw):
    transformers = pytest.importorskip("transformers")
    kw.setdefault("num_key_value_heads", 2)
    return transformers.Qwen3Config(vocab_size=V, hidden_size=D, num_hidden_layers=L, num_attention_heads=H,
                                    head_dim=D // H, intermediate_size=96, max_position_embeddings=T_MAX, **kw)


def save_hf(model, folder: Path) -> Path:
    """`model` with `randomise`d weights, saved as transformers saves it."""
    randomise(model).save_pretrained(folder)
    return folder


# --- checkpoints to evaluate ---------------------------------------------------------------------------------

def make_checkpoint(folder: Path, tokenizer_dir: Path, seed: int = 0, zero_embeddings: bool = False,
                    train_seq_len: int | None = None, **model) -> Path:
    """A random 2-layer model of width 32 saved with the tokenizer at `tokenizer_dir`; `zero_embeddings`
    makes it uniform over the vocabulary."""
    tok = load_tokenizer(tokenizer_dir)
    torch.manual_seed(seed)
    cfg = dict(vocab_size=tok.vocab_size, d_model=32, n_layers=2, n_heads=4, max_seq_len=64)
    net = build_model(ModelConfig(**{**cfg, **model}))
    if zero_embeddings:  # tied output head = 0: every logit is 0, the next-token distribution is uniform
        with torch.no_grad():
            net.embed.tok.weight.zero_()
    save_model(net, folder, step=5, train_seq_len=train_seq_len)
    tok.save(folder)
    return folder


def eval_score(path: Path, data: Path, tmp_path: Path, **kw) -> dict:
    """`evaluate` of one checkpoint on `data`, its token cache under `tmp_path`, without a progress bar."""
    return evaluate(path, str(data), EvalRequest(cache_dir=tmp_path / "cache", show_progress=False, **kw))


# --- time ---------------------------------------------------------------------------------------------------------

class Clock:
    """A clock a test sets by hand: `clock.now = 10.0`."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def fake_machine(monkeypatch, update: float = 0.05, validation: float = 0.1) -> Clock:
    """Runs under `train.max_time` as on a machine of a fixed speed, whatever this one's load: the time
    budget reads a `Clock` that moves only when the run works, `update` seconds per update and `validation`
    seconds per validation (checkpoints take none). On the real clock a loaded 2-core machine fits fewer
    steps in a budget and moves its validations; on this one a run's steps are the same everywhere."""
    from tfkit.trainer import loop, run
    from tfkit.trainer import validation as validation_module
    from tfkit.trainer.budget import TimeBudget

    clock = Clock()

    def taking(seconds: float, work):
        def timed(*args, **kwargs):
            clock.now += seconds
            return work(*args, **kwargs)
        return timed

    monkeypatch.setattr(run, "TimeBudget", functools.partial(TimeBudget, clock=clock))
    monkeypatch.setattr(loop, "train_step", taking(update, loop.train_step))  # as loop.run_window calls it
    monkeypatch.setattr(validation_module, "validate", taking(validation, validation_module.validate))
    return clock


def one_error_line(result) -> str:
    """The one line a refused CLI invocation prints (exit 2, no traceback), for the test to read."""
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), result.output
    assert "Traceback" not in result.output
    return lines[0]


# --- runs under torchrun, with hooks into the trainer --------------------------------------------------------

# The `tfkit` for torchrun workers that tests steer by TFKIT_HOOK_* variables: record each update's input ids,
# SIGKILL a worker or SIGUSR1 every process at a step, give rank 1 an extra override.
HOOKED_TFKIT = Path(__file__).resolve().parents[1] / "benchmarks" / "hooked_tfkit.py"


def update_ids(prefix: Path, updates: int, grad_accum: int = 1) -> list[list[list[int]]]:
    """Each update's rows of input ids, over every rank (sorted: which process computed a row is not the
    question), from the records benchmarks/hooked_tfkit.py wrote with TFKIT_HOOK_IDS=prefix (read back by batch index, the
    last record of each: a prefetch ahead of a kill is prepared again after the restart)."""
    rows: dict[tuple[str, int], list] = {}
    for file in sorted(prefix.parent.glob(prefix.name + ".rank*")):
        for line in file.read_text().splitlines():
            record = json.loads(line)
            rows[(file.name, record["first"])] = record["rows"]
    out = []
    for update in range(updates):
        first = update * grad_accum
        out.append(sorted(row for (_, f), r in rows.items() if f == first for row in r))
    return out


def shard_checkpoint(source: Path, out: Path) -> Path:
    """The checkpoint `source` rewritten as a sharded one at `out`, with the calls each rank of a run of several
    processes makes (here in one process, which holds every shard)."""
    from tfkit.checkpoints import sharded, training
    from tfkit.checkpoints.record import CheckpointRecord
    from tfkit.checkpoints.weights import load_model

    model, _ = load_model(source)
    record = CheckpointRecord.read(source)
    rest = training.sharded_rest(model, source, record, None, step=record.step)
    training.ShardedSave.start(out, {sharded.MODEL: sharded.model_state(model)}, rest, lambda folder: folder).finish()
    return out


def fixed_pace(monkeypatch, seconds: float = 0.01) -> list[int]:
    """`tfkit plan` and `model.size: auto` measure every shape at `seconds` per update (CPU time, a whole CPU),
    whatever this machine's speed and load: what a planned recipe trains is then the same on any machine.
    Returns the widths measured."""
    from tfkit.trainer import pace
    from tfkit.trainer.pace import Pace

    widths: list[int] = []

    def measure(recipe, cfg, device, **options):
        widths.append(cfg.d_model)
        return Pace(seconds=seconds, wall=seconds, tokens=recipe.train.batch_size * recipe.data.seq_len)

    monkeypatch.setattr(pace, "measure_pace", measure)
    return widths
