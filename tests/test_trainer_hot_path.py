"""The training hot path never waits for the host between log rows (STYLE.md 12-13): the host reads the
step's tensors once per log row, a skipped update is decided and counted on the device with the same rows
and weights as a loop that reads every update, the next batches are prepared on a thread, MLM gathers a
fixed number of rows, and `objective.fused_loss` picks the output head per device."""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tfkit.models import build_model
from tfkit.models.config import ModelConfig
from tfkit.tokenization.batches import MlmDataset, Seq2SeqDataset
from tfkit.trainer import objectives
from tfkit.trainer.distributed import DistInfo
from tfkit.trainer.fused_loss import use_fused_loss
from tfkit.trainer.loop import Loop, TrainingDiverged, run_loop
from tfkit.trainer.objectives import LossModule, compute_loss
from tfkit.trainer.optim import build_optimizer, grad_scaler
from tfkit.trainer.recipe import ObjectiveSection, load_recipe
from tfkit.trainer.step import Update

from helpers import RowDataset, poison_loss

V = 48
RECIPE = {"clm": "gpt-tiny", "mlm": "bert-tiny", "seq2seq": "transformer-tiny"}
ARCH = {"clm": "gpt", "mlm": "bert", "seq2seq": "transformer"}


def _tokenizer() -> SimpleNamespace:
    """What the MLM and denoising datasets read from a tokenizer: ids 0-3 are special."""
    return SimpleNamespace(pad_id=0, cls_id=1, bos_id=1, sep_id=2, eos_id=2, mask_id=3, vocab_size=V,
                           special_ids=[0, 1, 2, 3], kind="wordpiece", path="synthetic")


def _dataset(objective: str):
    tokens = np.random.default_rng(0).integers(4, V, 6000)
    if objective == "clm":
        return RowDataset(vocab=V)
    if objective == "mlm":
        return MlmDataset(tokens, 16, 0, _tokenizer())
    tokens[49::50] = 2  # a separator closes every document of 50 tokens
    shards = SimpleNamespace(tokens=tokens, doc_starts=np.arange(0, 6001, 50), separator_id=2)
    return Seq2SeqDataset.denoising(shards, _tokenizer(), 0, max_src_len=16, max_tgt_len=16)


def _loop(objective: str, overrides: list[str], rows: list | None = None) -> Loop:
    recipe = load_recipe(RECIPE[objective], ["schedule.warmup_steps=2", "log.progress=false", "train.eval_every=1000",
                                             "train.save_every=1000", "train.batch_size=4", "train.precision=fp32",
                                             "model.dropout=0.0", *overrides])
    torch.manual_seed(0)
    model = build_model(ModelConfig(arch=ARCH[objective], vocab_size=V, d_model=32, n_layers=2, n_heads=4,
                                    max_seq_len=32, pad_token_id=0))
    info = DistInfo()
    log = (rows if rows is not None else []).append
    update = Update.of(recipe, model, LossModule(model, recipe.objective), build_optimizer(model, recipe.optim, info.device),
                       grad_scaler("fp32", info.device), info)
    return Loop(recipe, update, _dataset(objective), log, lambda state: None,
                lambda step: {"val_loss": 0.0, "val_ppl": 1.0, "val_accuracy": 0.0})


# --- host reads ---------------------------------------------------------------------------------------------

PYTHON_READS = ("item", "tolist", "__bool__", "__int__", "__float__", "cpu", "numpy", "nonzero")
SYNCING_OPS = ("aten._local_scalar_dense", "aten.nonzero", "aten.masked_select", "aten.unique", "aten._unique",
               "aten.repeat_interleave.Tensor")


class HostReads(TorchDispatchMode):
    """Counts what makes a host wait for the device, on the thread that trains: the Python reads of a
    tensor (patched methods below) and, at the dispatcher, the ops that read inside torch (`bool(t)` and
    `t.item()` reach `_local_scalar_dense`; a boolean-mask index has a data-dependent size, a sync on a GPU).
    The loader thread prepares batches in host memory: its reads wait for no device and are not counted."""

    def __init__(self, reads: Counter) -> None:
        super().__init__()
        self.reads = reads

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func)
        if name.startswith(SYNCING_OPS) or (name.startswith(("aten.index.Tensor", "aten.index_put"))
                                            and _has_mask_index(args)):
            self.reads[name] += 1
        return func(*args, **(kwargs or {}))


def _has_mask_index(args) -> bool:
    indices = args[1] if len(args) > 1 and isinstance(args[1], (list, tuple)) else []
    return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices)


def count_host_reads(monkeypatch, run) -> Counter:
    reads, main = Counter(), threading.get_ident()

    def counting(name, original):
        def read(*args, **kwargs):
            if threading.get_ident() == main:
                reads[name] += 1
            return original(*args, **kwargs)
        return read

    for name in PYTHON_READS:
        monkeypatch.setattr(torch.Tensor, name, counting(name, getattr(torch.Tensor, name)))
    monkeypatch.setattr(torch, "nonzero", counting("torch.nonzero", torch.nonzero))
    with HostReads(reads):
        run()
    monkeypatch.undo()
    return reads


def test_the_read_counter_sees_a_data_dependent_gather(monkeypatch):
    """The counter has teeth: MLM on a batch made by hand (labels only) gathers `hidden[labels != -100]`."""
    loop = _loop("mlm", [])
    batch = {k: v for k, v in loop.dataset.batch(0, 4).items() if not k.startswith("mlm_")}
    reads = count_host_reads(monkeypatch, lambda: loop.update.train_module(batch))
    assert reads == Counter({"aten.index.Tensor": 2})  # the masked rows and their labels


@pytest.mark.parametrize("objective", ["clm", "mlm", "seq2seq"])
def test_the_host_reads_once_per_log_row(objective, monkeypatch):
    """4 updates of 2 micro-batches, log_every 4: the one read of the log row, a `.tolist()` of the window's
    stacked records (loss sum, correct, count, tokens, grad norm, applied, bad per update). With log_every 2,
    two windows, two reads."""
    for log_every, reads_expected in ((4, 1), (2, 2)):
        rows = []
        loop = _loop(objective, ["train.max_steps=4", "train.grad_accum=2", f"train.log_every={log_every}"], rows)
        reads = count_host_reads(monkeypatch, lambda: run_loop(loop))
        assert reads == Counter({"tolist": reads_expected}), reads
        assert [r["step"] for r in rows] == list(range(log_every, 5, log_every))
        assert loop.state.step == 4 and loop.state.batches == 8


# --- skipped updates with reads every log_every updates -------------------------------------------------------

def _run(overrides, monkeypatch, bad_calls=(), scaler=None):
    monkeypatch.undo()
    if bad_calls:
        poison_loss(monkeypatch, set(bad_calls))
    rows = []
    loop = _loop("clm", overrides, rows)
    if scaler:
        loop.update.scaler = scaler()
    error = None
    try:
        run_loop(loop)
    except TrainingDiverged as e:
        error = str(e)
    return loop, rows, error


def _same_run(a, b, log_every: int) -> None:
    """b (reading every log_every updates) wrote a's rows (read every update) at its log steps, every
    skipped row, and ends with a's state, weights and optimizer state, bit for bit."""
    (loop_a, rows_a, err_a), (loop_b, rows_b, err_b) = a, b
    timing = ("tokens_per_sec", "loss_mean", "accuracy_mean")  # and the means over each logging interval
    expected = [{k: v for k, v in r.items() if k not in timing} for r in rows_a
                if r.get("skipped") or r["step"] % log_every == 0 or r["step"] == loop_a.recipe.train.max_steps]
    assert [{k: v for k, v in r.items() if k not in timing} for r in rows_b] == expected
    interval = {"since_log_loss": 0.0, "since_log_correct": 0.0, "since_log_count": 0.0}  # sums since a row: differ
    assert err_a == err_b and replace(loop_a.state, **interval) == replace(loop_b.state, **interval)
    for p, q in zip(loop_a.update.model.parameters(), loop_b.update.model.parameters()):
        assert torch.equal(p, q)
    sa, sb = loop_a.update.optimizer.state_dict()["state"], loop_b.update.optimizer.state_dict()["state"]
    assert all(torch.equal(sa[i][k], sb[i][k]) for i in sa for k in sa[i])


def test_a_skipped_update_is_skipped_and_counted_on_the_device(monkeypatch):
    common = ["train.max_steps=12", "train.max_bad_steps=3", "train.grad_accum=2"]
    every = _run(common + ["train.log_every=1"], monkeypatch, bad_calls={4, 5, 9})
    tenth = _run(common + ["train.log_every=10"], monkeypatch, bad_calls={4, 5, 9})
    skipped = [r for r in tenth[1] if r.get("skipped")]
    assert [(r["step"], r["bad_steps"], r["loss"]) for r in skipped] == [(3, 1, None), (4, 2, None)]
    assert tenth[0].state.step == 12 and tenth[0].state.bad_steps == 2 and tenth[0].state.batches == 28
    _same_run(every, tenth, 10)


def test_divergence_is_found_at_the_log_row_with_the_state_of_the_diverging_update(monkeypatch):
    """Updates 3.. are all NaN: the device stops applying updates at the 4th bad one in a row, the host learns
    it at the read and raises with the state at that update, as when it read every update."""
    common = ["train.max_steps=20", "train.max_bad_steps=4"]
    every = _run(common + ["train.log_every=1"], monkeypatch, bad_calls=set(range(2, 100)))
    tenth = _run(common + ["train.log_every=10"], monkeypatch, bad_calls=set(range(2, 100)))
    assert "4 updates in a row" in tenth[2] and "at step 2" in tenth[2]
    assert tenth[0].state.step == 2 and tenth[0].state.batches == 6
    _same_run(every, tenth, 10)


def test_fp16_overflows_are_decided_on_the_device(monkeypatch):
    common = ["train.max_steps=6", "train.precision=fp16", "train.max_bad_steps=2"]
    scaler = lambda: torch.amp.GradScaler("cpu", init_scale=2.0**20)  # noqa: E731 - overflows a few times
    every = _run(common + ["train.log_every=1"], monkeypatch, scaler=scaler)
    tenth = _run(common + ["train.log_every=10"], monkeypatch, scaler=scaler)
    assert any(r.get("reason") == "fp16 overflow" for r in tenth[1])
    assert every[0].update.scaler.get_scale() == tenth[0].update.scaler.get_scale()
    _same_run(every, tenth, 10)


# --- the loader thread ----------------------------------------------------------------------------------------

def test_batches_are_prepared_on_a_thread_one_update_ahead():
    loop = _loop("clm", ["train.max_steps=3", "train.grad_accum=2", "train.log_every=1"])
    calls, batch = [], loop.dataset.batch
    loop.dataset.batch = lambda i, *a: calls.append((i, threading.current_thread().name)) or batch(i, *a)
    run_loop(loop)
    assert [i for i, _ in calls] == list(range(8))  # 3 updates of 2, and the 4th update's, read ahead
    assert all(name.startswith("tfkit-batches") for _, name in calls)
    assert loop.loader is None  # the thread is gone with the loop


# --- MLM's fixed-size gather ----------------------------------------------------------------------------------

def test_fixed_size_mlm_gather_equals_the_masked_rows_gather():
    """The same batch with and without mlm_positions: the same loss (1e-6), correct count, count and grads."""
    loop = _loop("mlm", [])
    batch = loop.dataset.batch(3, 8)
    assert batch["mlm_positions"].shape == (8, loop.dataset.num_targets)
    results = []
    for b in (batch, {k: v for k, v in batch.items() if not k.startswith("mlm_")}):
        loop.update.model.zero_grad()
        out = compute_loss(loop.update.model, b, loop.recipe.objective)
        out.loss_sum.backward()
        results.append((out, [p.grad.clone() for p in loop.update.model.parameters() if p.grad is not None]))
    (fixed, g_fixed), (gathered, g_gathered) = results
    torch.testing.assert_close(fixed.loss_sum, gathered.loss_sum, rtol=1e-6, atol=1e-6)
    assert int(fixed.correct) == int(gathered.correct) and int(fixed.count) == int(gathered.count) > 8
    assert len(g_fixed) == len(g_gathered)
    for a, b in zip(g_fixed, g_gathered):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


# --- objective.fused_loss -------------------------------------------------------------------------------------

def test_fused_loss_auto_is_on_for_cpus_off_for_gpus_and_yaml_on_off_are_accepted(tmp_path, monkeypatch):
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert use_fused_loss("auto", cpu) and not use_fused_loss("auto", cuda)
    assert use_fused_loss("on", cuda) and not use_fused_loss("off", cpu)
    path = tmp_path / "r.yaml"
    path.write_text("model: {arch: gpt}\nobjective: {name: clm, fused_loss: off}\n")
    assert load_recipe(str(path)).objective.fused_loss == "off"  # YAML's off is False
    assert load_recipe(str(path), ["objective.fused_loss=on"]).objective.fused_loss == "on"
    assert "objective.fused_loss: got 'sometimes', expected one of auto, on, off" in \
        ObjectiveSection(fused_loss="sometimes").problems()[0]
    heads = []
    monkeypatch.setattr(objectives, "linear_cross_entropy",
                        lambda *a: heads.append("fused") or (torch.zeros(()), torch.zeros((), dtype=torch.long)))
    gpt = build_model(ModelConfig(arch="gpt", vocab_size=V, d_model=32, n_layers=1, n_heads=4, max_seq_len=32))
    batch = RowDataset(vocab=V).batch(0, 2)
    for setting in ("auto", "on", "off"):
        compute_loss(gpt, batch, ObjectiveSection(name="clm", fused_loss=setting))
    assert heads == ["fused", "fused"]  # auto (CPU) and on; off computed the logits
