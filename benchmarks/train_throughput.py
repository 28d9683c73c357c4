"""Training throughput: tfkit's real training step against HuggingFace models and a nanoGPT-style GPT.

The tfkit side is `trainer.step.train_step`, the function `tfkit pretrain` calls every update: the
objective (`LossModule`: forward + loss, MLM on the gathered masked rows only), backward, gradient-norm
clipping and the AdamW step of `build_optimizer`, under `autocast_context`. Only the data pipeline is
replaced, by a dataset that returns one fixed batch, so the comparison is about the model and the trainer.

The baseline is what a HuggingFace user runs: `model(**batch, labels=...).loss`, backward,
`clip_grad_norm_`, and the *same* optimizer (`build_optimizer` on the HF model: same AdamW, same groups,
fused on CUDA) under the same autocast. HF models are built locally from config objects with
`attn_implementation="sdpa"`; both sides get the same batch, shape, activation, dropout and precision.

- `gpt` (GPT-2 layout) vs `GPT2LMHeadModel`;
- `gpt` with RoPE + RMSNorm + SwiGLU + n_kv_heads < n_heads vs `LlamaForCausalLM` (GQA);
- `bert` (MLM) vs `BertForMaskedLM`;
- `gpt` vs `reference_gpt.ReferenceGPT`, the minimal nanoGPT-style model a lean research codebase
  trains (one fused qkv Linear, SDPA `is_causal`, plain cross-entropy), stepped as nanoGPT steps it:
  forward with targets, backward, clip, its own AdamW (`configure_optimizers`: nanoGPT's groups, fused
  kernel). HF pays for generality; this baseline shows what is left without it. CPU: nanoGPT's shape in
  fp32 and, on a CPU that multiplies bf16 natively (where `train.precision: auto` trains in bf16), with
  bf16 autocast on both sides; GPU: GPT-2 124M in bf16 (goal 1.25x compiled);
- GPU only: tfkit's chunked fused head (`objective.fused_loss: on`) against its plain head (off) on GPT-2
  124M: the measurement `FUSED_LOSS_AUTO`'s CUDA default should follow.

On GPU, MFU uses tfkit's `flops_per_token` (model FLOPs, PaLM's convention) for both sides, so the two
MFUs are in proportion to tokens/s even where tfkit skips work (the MLM head on unmasked rows).
"""

from __future__ import annotations

import dataclasses
import gc
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from tfkit.models import ModelConfig, build_model, sized_config
from tfkit.trainer.distributed import DistInfo
from tfkit.trainer.loop import Loop, StopFlag, replay, run_window
from tfkit.trainer.metrics import mfu, peak_flops
from tfkit.trainer.objectives import IGNORE, LossModule, compile_loss_module, move_batch
from tfkit.trainer.optim import autocast_context, build_optimizer, grad_scaler, native_bf16
from tfkit.trainer.recipe import OBJECTIVE_FOR_ARCH, ObjectiveSection, OptimSection, Recipe, TrainSection
from tfkit.trainer.step import Update

from .common import Context, Goal, Row, median, paired_ratio, peak_memory_mb, time_interleaved
from .kernel_profile import top_kernels
from .reference_gpt import ReferenceGPT, configure_optimizers

MASK_PROB = 0.15  # MLM: fraction of positions that carry a label (BERT's)
MASK_ID = 4  # any id: the batch is random tokens


@dataclass(frozen=True)
class Case:
    name: str  # short label for the table
    cfg: ModelConfig  # the tfkit model; the HF model is derived from it
    batch: int
    seq_len: int
    precision: str  # fp32 | bf16, as train.precision
    goal_eager: Goal | None = None
    goal_compiled: Goal | None = None
    baseline: str = "hf"  # hf (the HuggingFace model of cfg's shape) | reference (reference_gpt.ReferenceGPT)
    # | plain-head (tfkit itself with objective.fused_loss off: what the fused head is measured against)
    fused_loss: str = "auto"  # tfkit's objective.fused_loss


def llama_like(cfg: ModelConfig, n_kv_heads: int) -> ModelConfig:
    """The same size with Llama's choices, so LlamaForCausalLM has the identical shape: RoPE, RMSNorm,
    SwiGLU, no biases, untied head (Llama's default), grouped key/value heads."""
    return dataclasses.replace(cfg, positions="rope", norm="rmsnorm", activation="swiglu", bias=False,
                               tie_embeddings=False, n_kv_heads=n_kv_heads).validate()


def cases(ctx: Context) -> list[Case]:
    """CPU: the `tiny` sizes at B=16, T=256 (smaller for --quick), and nanoGPT's shape of GPT (d=256, 4
    layers, 4 heads, V=8,192, learned positions, pre-LN, exact GELU, biases, tied head) against the
    reference GPT at the same B, T. GPU: GPT-2 124M at B=16, T=1024 and BERT-base at T=128, B=256 and
    T=512, B=64, in bf16 (the shipped gpt2-small / bert-base recipes)."""
    if ctx.suite == "cpu":
        gpt, bert = sized_config("gpt", "tiny"), sized_config("bert", "tiny")
        batch, seq = (2, 32) if ctx.quick else (16, 256)
        cpu_goal = Goal(">= 1.2x HF eager", 1.2)
        nano = ModelConfig(arch="gpt", vocab_size=8192, d_model=256, n_layers=4, n_heads=4, max_seq_len=256,
                           positions="learned", norm="layernorm", norm_placement="pre", activation="gelu",
                           bias=True, tie_embeddings=True, dropout=0.0, attn_dropout=0.0).validate()
        reference_goal = Goal(">= 1.2x reference GPT", 1.2)
        # bf16 autocast on both sides where this CPU multiplies bf16 natively (what train.precision: auto
        # picks there); on other CPUs bf16 is emulated and slower than fp32 for both, so it is not measured.
        precisions = ("fp32", "bf16") if native_bf16(torch.device("cpu")) else ("fp32",)
        return [Case("gpt tiny vs HF GPT2LMHeadModel", gpt, batch, seq, "fp32", goal_eager=cpu_goal),
                Case("gpt tiny GQA vs HF LlamaForCausalLM", llama_like(gpt, 2), batch, seq, "fp32"),
                Case("bert tiny MLM vs HF BertForMaskedLM", bert, batch, seq, "fp32")] + [
                Case("gpt d=256 L=4 H=4 V=8192 vs reference GPT (nanoGPT-style)", nano, batch, seq, precision,
                     goal_eager=reference_goal, baseline="reference") for precision in precisions]
    # gpt2-small recipe: vocab padded to 50304, no dropout; bert-base keeps BERT's 0.1 dropouts.
    gpt = sized_config("gpt", "small", vocab_size=50304, dropout=0.0, attn_dropout=0.0)
    bert = sized_config("bert", "small")
    if ctx.quick:
        gpt, bert = dataclasses.replace(gpt, n_layers=2), dataclasses.replace(bert, n_layers=2)
    goal = Goal(">= 1.3x HF compiled", 1.3)
    bert_goal = Goal(">= 1.4x HF compiled", 1.4)  # the goal 2, at T=128 and T=512
    nanogpt = dataclasses.replace(gpt, activation="gelu")  # nanoGPT's exact GELU, so the two compute the same
    return [Case("gpt 124M vs reference GPT (nanoGPT-style)", nanogpt, 16, 1024, "bf16",
                 goal_compiled=Goal(">= 1.25x reference GPT", 1.25), baseline="reference"),
            Case("gpt 124M fused loss vs plain head", gpt, 16, 1024, "bf16", baseline="plain-head", fused_loss="on"),
            Case("gpt 124M vs HF GPT2LMHeadModel", gpt, 16, 1024, "bf16", goal_compiled=goal),
            Case("gpt 124M GQA (4 kv) vs HF LlamaForCausalLM", llama_like(gpt, 4), 16, 1024, "bf16"),
            Case("bert-base MLM T=128 vs HF BertForMaskedLM", bert, 256, 128, "bf16", goal_compiled=bert_goal),
            Case("bert-base MLM T=512 vs HF BertForMaskedLM", bert, 64, 512, "bf16", goal_compiled=bert_goal)]


def make_batch(cfg: ModelConfig, batch: int, seq_len: int, seed: int = 0) -> dict[str, Tensor]:
    """A batch in tfkit's contract (ARCHITECTURE.md): clm = input_ids + next-token labels from blocks of
    T+1 tokens; mlm = packed rows (every position real, so no attention mask), as MlmDataset makes them:
    the same number of positions (15%) labelled in every row and replaced by a mask id, also given as
    mlm_positions / mlm_labels (B, K), the fixed-size gather the objective uses."""
    g = torch.Generator().manual_seed(seed)
    if cfg.arch == "gpt":
        block = torch.randint(0, cfg.vocab_size, (batch, seq_len + 1), generator=g)  # (B, T+1)
        return {"input_ids": block[:, :-1].contiguous(), "labels": block[:, 1:].contiguous()}
    ids = torch.randint(0, cfg.vocab_size, (batch, seq_len), generator=g)  # (B, T)
    k = max(1, round(MASK_PROB * seq_len))  # targets per row
    positions = torch.rand(batch, seq_len, generator=g).argsort(dim=1)[:, :k].sort(dim=1).values  # (B, K)
    masked = torch.zeros(batch, seq_len, dtype=torch.bool).scatter_(1, positions, True)  # (B, T)
    return {"input_ids": ids.masked_fill(masked, MASK_ID), "token_type_ids": torch.zeros_like(ids),
            "labels": ids.masked_fill(~masked, IGNORE), "mlm_positions": positions,
            "mlm_labels": ids.gather(1, positions)}


def hf_inputs(cfg: ModelConfig, batch: dict[str, Tensor]) -> dict[str, Tensor]:
    """The same batch as HF expects it: causal LMs shift labels themselves (labels = input_ids). Neither
    side gets an attention mask (HF's default is all ones, which its SDPA path drops anyway)."""
    if cfg.arch == "gpt":
        return {"input_ids": batch["input_ids"], "labels": batch["input_ids"]}
    return {k: batch[k] for k in ("input_ids", "token_type_ids", "labels")}


def hf_model(cfg: ModelConfig) -> nn.Module:
    """The HuggingFace model with tfkit's shape, from a config object (nothing is downloaded)."""
    import transformers as tr

    tr.logging.set_verbosity_error()  # e.g. GPT-2's default bos id outside a small vocabulary
    act = {"gelu_tanh": "gelu_new"}.get(cfg.activation, cfg.activation)  # HF's name for GPT-2's tanh GELU
    common = dict(vocab_size=cfg.vocab_size, tie_word_embeddings=cfg.tie_embeddings, bos_token_id=0, eos_token_id=0,
                  pad_token_id=0)
    if cfg.arch == "bert":
        config = tr.BertConfig(hidden_size=cfg.d_model, num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads,
                               intermediate_size=cfg.ffn_dim, hidden_dropout_prob=cfg.dropout,
                               attention_probs_dropout_prob=cfg.attn_dropout, max_position_embeddings=cfg.max_seq_len,
                               type_vocab_size=cfg.type_vocab_size, layer_norm_eps=cfg.norm_eps, hidden_act=act,
                               **common)
        cls = tr.BertForMaskedLM
    elif cfg.positions == "rope":
        config = tr.LlamaConfig(hidden_size=cfg.d_model, intermediate_size=cfg.ffn_dim, num_hidden_layers=cfg.n_layers,
                                num_attention_heads=cfg.n_heads, num_key_value_heads=cfg.kv_heads,
                                max_position_embeddings=cfg.max_seq_len, rms_norm_eps=cfg.norm_eps,
                                rope_theta=cfg.rope_theta, attention_dropout=cfg.attn_dropout, **common)
        cls = tr.LlamaForCausalLM
    else:
        config = tr.GPT2Config(n_embd=cfg.d_model, n_layer=cfg.n_layers, n_head=cfg.n_heads, n_inner=cfg.ffn_dim,
                               activation_function=act, n_positions=cfg.max_seq_len, resid_pdrop=cfg.dropout,
                               embd_pdrop=cfg.dropout, attn_pdrop=cfg.attn_dropout, layer_norm_epsilon=cfg.norm_eps,
                               **common)
        cls = tr.GPT2LMHeadModel
    return cls._from_config(config, attn_implementation="sdpa")


class FixedBatch:
    """A dataset whose every batch is the same tensors: the loop without a data pipeline."""

    def __init__(self, batch: dict[str, Tensor]) -> None:
        self._batch = batch

    def batch(self, i: int, batch_size: int, rank: int = 0, world_size: int = 1) -> dict[str, Tensor]:
        return self._batch


def tfkit_step(case: Case, batch: dict[str, Tensor], device: torch.device, compile: bool) -> tuple[Callable, nn.Module]:
    """One call = one `train_step` of tfkit's loop, built the way trainer.run builds it, in a window of one
    update whose record is read at once (as at a log row), so each call ends when the update has."""
    recipe = Recipe(objective=ObjectiveSection(name=OBJECTIVE_FOR_ARCH[case.cfg.arch], fused_loss=case.fused_loss),
                    train=TrainSection(batch_size=case.batch, precision=case.precision, compile=compile))
    model = build_model(case.cfg).to(device)
    module = LossModule(model, recipe.objective)
    if compile:
        compile_loss_module(module)
    update = Update.of(recipe, model, module, build_optimizer(model, recipe.optim, device),
                       grad_scaler(case.precision, device), DistInfo(device=device))
    loop = Loop(recipe, update, FixedBatch(batch), log=lambda row: None, save=lambda state: None,
                validate=lambda step: {})
    stop = StopFlag()  # never entered: no signal handlers, signum stays 0
    return lambda: list(replay(loop, run_window(loop, stop, 1))), model


def hf_step(case: Case, batch: dict[str, Tensor], device: torch.device, compile: bool) -> tuple[Callable, nn.Module]:
    """One call = one HF training step: forward with labels, backward, clip, the same AdamW."""
    model = hf_model(case.cfg).to(device).train()
    if compile:
        model.compile()
    optimizer = build_optimizer(model, OptimSection(), device)
    clip = OptimSection().grad_clip
    inputs = hf_inputs(case.cfg, batch)

    def step() -> None:
        with autocast_context(case.precision, device):
            loss = model(**move_batch(inputs, device)).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step, model


def reference_step(case: Case, batch: dict[str, Tensor], device: torch.device,
                   compile: bool) -> tuple[Callable, nn.Module]:
    """One call = one nanoGPT training step of the reference GPT: forward with targets (plain cross-entropy),
    backward, clip, nanoGPT's AdamW groups with tfkit's default hyperparameters (lr, betas, decay, clip)."""
    cfg, optim = case.cfg, OptimSection()
    model = ReferenceGPT(cfg.vocab_size, cfg.d_model, cfg.n_layers, cfg.n_heads, cfg.max_seq_len,
                         dropout=cfg.dropout, bias=cfg.bias).to(device).train()
    if compile:
        model.compile()
    optimizer = configure_optimizers(model, optim.weight_decay, optim.lr, (optim.beta1, optim.beta2), device.type)
    x, y = batch["input_ids"].to(device), batch["labels"].to(device)  # (B, T) each

    def step() -> None:
        with autocast_context(case.precision, device):
            _, loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), optim.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step, model


def plain_head_step(case: Case, batch: dict[str, Tensor], device: torch.device,
                    compile: bool) -> tuple[Callable, nn.Module]:
    """One call = one tfkit step with the plain head (objective.fused_loss: off): the logits, then
    cross-entropy, which torch.compile fuses its own way; against it, the chunked fused head (goal 6)."""
    return tfkit_step(dataclasses.replace(case, fused_loss="off"), batch, device, compile)


BASELINES = {"hf": hf_step, "reference": reference_step, "plain-head": plain_head_step}


def measure(ctx: Context, case: Case, compiled: bool) -> Row:
    """Tokens/s of both steps, interleaved; MFU and peak memory on GPU."""
    batch = make_batch(case.cfg, case.batch, case.seq_len)
    mode = "compiled" if compiled else "eager"
    name = case.baseline  # the baseline's key in the samples and the JSON
    torch.manual_seed(0)
    ours, model = tfkit_step(case, batch, ctx.device, compiled)
    theirs, reference = BASELINES[name](case, batch, ctx.device, compiled)
    if ctx.quick:
        warmup, rounds, calls = 1, 2, 1
    else:
        warmup, rounds, calls = (2, 6, 1) if ctx.suite == "cpu" else (3, 6, 3)
    warmup += 2 if compiled else 0  # compilation happens on the first calls
    ctx.log(f"train: {case.name} B={case.batch} T={case.seq_len} {case.precision} {mode}")
    samples = time_interleaved({"tfkit": ours, name: theirs}, ctx.device, warmup=warmup, rounds=rounds, calls=calls,
                               timer=ctx.timer)
    if ctx.profile and compiled == ctx.compile:  # the step a user runs: compiled where compiling is measured
        ctx.log(f"train: where the time of tfkit's step goes, {case.name} {mode}\n{top_kernels(ours, ctx.device)}")
    tokens = case.batch * case.seq_len
    tfkit_rate, base_rate = tokens / median(samples["tfkit"]), tokens / median(samples[name])
    extra = {"samples_s": samples, "tfkit_params": model.num_params(),
             f"{name}_params": sum(p.numel() for p in reference.parameters()), "tokens_per_step": tokens}
    note = ""
    if ctx.device.type == "cuda":
        peak, flops = peak_flops(torch.cuda.get_device_name(ctx.device)), model.flops_per_token(case.seq_len)
        extra.update({"tfkit_mfu": mfu(flops, tfkit_rate, peak, 1), f"{name}_mfu": mfu(flops, base_rate, peak, 1),
                      "tfkit_peak_mb": peak_memory_mb(ours, ctx.device),
                      f"{name}_peak_mb": peak_memory_mb(theirs, ctx.device)})
        if extra["tfkit_mfu"] is not None:
            note = f"MFU {100 * extra['tfkit_mfu']:.1f}% vs {100 * extra[f'{name}_mfu']:.1f}%"
        note += f"; peak {extra['tfkit_peak_mb']:,.0f} vs {extra[f'{name}_peak_mb']:,.0f} MB"
    goal = case.goal_compiled if compiled else case.goal_eager
    label = f"{case.name}, B={case.batch} T={case.seq_len} {case.precision} {mode}"
    return Row("train", label, "tok/s", tfkit_rate, base_rate, goal=goal, note=note.strip("; "),
               paired=paired_ratio(samples["tfkit"], samples[name]), extra=extra)


def run(ctx: Context, match: str = "") -> list[Row]:
    """Every case of `cases` whose name contains `match` (run.py's --case); the HF ones only where
    transformers is installed (the reference GPT needs nothing but torch)."""
    chosen = [case for case in cases(ctx) if match in case.name]
    if not chosen:
        ctx.skip(f"train: no {ctx.suite} case's name contains {match!r}: " + "; ".join(c.name for c in cases(ctx)))
    has_hf = importlib.util.find_spec("transformers") is not None
    if not has_hf and any(case.baseline == "hf" for case in chosen):
        ctx.skip("train: transformers is not installed (pip install -e '.[test]'), no HF baseline")
    rows = []
    for case in chosen:
        if case.baseline == "hf" and not has_hf:
            continue
        for compiled in [mode for mode, wanted in ((False, ctx.eager), (True, ctx.compile)) if wanted]:
            try:
                rows.append(measure(ctx, case, compiled))
                ctx.log(rows[-1].line())
            except Exception as exc:  # noqa: BLE001 - one failing backend must not cost the rest of the run
                ctx.skip(f"train: {case.name} {'compiled' if compiled else 'eager'} failed: "
                         f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}")
            gc.collect()  # here, not in the except block, whose traceback still holds the models
            if ctx.device.type == "cuda":
                torch.cuda.empty_cache()
    return rows
