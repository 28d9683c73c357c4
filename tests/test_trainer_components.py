"""Trainer components in isolation: parameter groups, objectives, checkpoint atomicity and pruning."""

import pytest
import torch
import torch.nn.functional as F

from tfkit.checkpoints.folders import resolve_checkpoint
from tfkit.checkpoints.weights import load_model
from tfkit.errors import CheckpointError
from tfkit.models import build_model
from tfkit.models.config import ModelConfig
from tfkit.checkpoints.folders import latest_checkpoint, list_checkpoints, resolve_resume
from tfkit.checkpoints.trainer_state import load_optimizer_state_by_name, optimizer_state_by_name, rng_state, seed_rank, set_rng_state
from tfkit.checkpoints.record import CheckpointRecord
from tfkit.checkpoints.training import save_checkpoint
from tfkit.checkpoints import training
from tfkit.trainer.metrics import mfu, peak_flops
from tfkit.trainer.objectives import IGNORE, compute_loss
from tfkit.trainer.optim import build_optimizer, param_groups
from tfkit.trainer.recipe import ObjectiveSection, OptimSection

TINY = dict(vocab_size=97, d_model=32, n_layers=2, n_heads=4, max_seq_len=32)


def _model(arch: str, **kw) -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model(ModelConfig(arch=arch, **{**TINY, **kw}))


@pytest.mark.parametrize("arch", ["gpt", "bert", "transformer"])
def test_no_weight_decay_on_norms_biases_and_embeddings(arch):
    model = _model(arch, norm="rmsnorm" if arch == "gpt" else "layernorm")
    decay, no_decay = param_groups(model, 0.1)
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    names = {id(p): n for n, p in model.named_parameters()}
    decayed = {names[id(p)] for p in decay["params"]}
    kept = {names[id(p)] for p in no_decay["params"]}
    embeddings = {names[id(m.weight)] for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    assert embeddings and embeddings <= kept
    assert all(n.endswith("bias") or "norm" in n or "ln" in n or n in embeddings for n in kept), kept
    assert not any(n.endswith("bias") or "norm" in n.split(".")[-2] for n in decayed), decayed
    assert all(model.get_parameter(n).ndim == 2 for n in decayed)
    # every parameter is in exactly one group (a tied head is its embedding, counted once)
    assert len(decayed) + len(kept) == len(list(model.parameters()))
    opt = build_optimizer(model, OptimSection(weight_decay=0.1), torch.device("cpu"))
    assert [g["weight_decay"] for g in opt.param_groups] == [0.1, 0.0]


def test_mlm_loss_equals_full_logits_restricted_to_masked_positions():
    model = _model("bert").eval()
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 97, (3, 16), generator=g)
    labels = torch.full_like(ids, IGNORE)
    chosen = torch.rand(3, 16, generator=g) < 0.3
    labels[chosen] = ids[chosen]
    mask = torch.ones(3, 16, dtype=torch.bool)
    mask[2, 12:] = False  # padding in the last row
    labels[2, 12:] = IGNORE
    batch = dict(input_ids=ids, attention_mask=mask, token_type_ids=torch.zeros_like(ids), labels=labels)
    out = compute_loss(model, batch, ObjectiveSection(name="mlm"))
    logits = model(ids, attention_mask=mask, token_type_ids=torch.zeros_like(ids))  # (B, T, V): every row
    full = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE)
    assert int(out.count) == int((labels != IGNORE).sum()) > 0
    torch.testing.assert_close(out.loss, full, rtol=1e-6, atol=1e-6)
    valid = labels != IGNORE
    assert int(out.correct) == int((logits.argmax(-1)[valid] == labels[valid]).sum())


def test_clm_and_seq2seq_losses_are_sums_over_labelled_tokens_with_label_smoothing():
    gpt = _model("gpt").eval()
    ids = torch.randint(0, 97, (2, 9))
    batch = dict(input_ids=ids[:, :-1], labels=ids[:, 1:])
    out = compute_loss(gpt, batch, ObjectiveSection(name="clm"))
    ref = F.cross_entropy(gpt(ids[:, :-1]).flatten(0, 1), ids[:, 1:].flatten(), reduction="sum")
    torch.testing.assert_close(out.loss_sum, ref)
    assert int(out.count) == 16
    t5 = _model("transformer").eval()
    src, tgt = torch.randint(3, 97, (2, 7)), torch.randint(3, 97, (2, 6))
    labels = tgt.roll(-1, 1)
    labels[1, 4:] = IGNORE
    b = dict(src_ids=src, src_mask=torch.ones_like(src, dtype=torch.bool), tgt_ids=tgt,
             tgt_mask=torch.ones_like(tgt, dtype=torch.bool), labels=labels)
    smooth = compute_loss(t5, b, ObjectiveSection(name="seq2seq", label_smoothing=0.1))
    logits = t5(src, tgt, src_mask=b["src_mask"], tgt_mask=b["tgt_mask"])
    ref = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE, label_smoothing=0.1,
                          reduction="sum")
    torch.testing.assert_close(smooth.loss_sum, ref)
    assert int(smooth.count) == 10


def _save(run_dir, step, model, tok_dir, keep_last=3):
    state = {"step": step, "rng": rng_state()}
    return save_checkpoint(run_dir, step, model, state, tok_dir, CheckpointRecord(model.config, objective="clm", recipe="t"),
                           keep_last)


def test_checkpoint_is_self_contained_and_trainer_state_loads_weights_only(tmp_path):
    model = _model("gpt")
    tok = tmp_path / "tok"
    tok.mkdir()
    (tok / "tokenizer.json").write_text("{}")
    folder = _save(tmp_path / "run", 3, model, tok)
    assert folder.name == "step-3"
    assert {"model.safetensors", "config.json", "tokenizer.json", "trainer_state.pt"} <= {p.name for p in folder.iterdir()}
    state = torch.load(folder / "trainer_state.pt", weights_only=True)
    assert state["step"] == 3 and isinstance(state["rng"]["python"], tuple)
    loaded, cfg = load_model(folder)
    assert cfg == model.config
    for (n, a), (_, b) in zip(model.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b), n


def test_a_failed_write_leaves_the_previous_checkpoint_as_the_latest(tmp_path, monkeypatch):
    model = _model("gpt")
    run = tmp_path / "run"
    _save(run, 2, model, tmp_path)

    def crash(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(training.torch, "save", crash)  # dies after the weights, before trainer_state.pt
    with pytest.raises(OSError):
        _save(run, 4, model, tmp_path)
    assert not (run / "checkpoints" / "step-4").exists()
    assert latest_checkpoint(run).name == "step-2"
    assert resolve_checkpoint(run).name == "step-2"
    load_model(run)
    # a process killed mid-write leaves a temp folder: never resolved, removed by the next save
    monkeypatch.undo()
    stale = run / "checkpoints" / ".step-6.tmp"
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"partial")
    assert resolve_checkpoint(run).name == "step-2"
    _save(run, 8, model, tmp_path)
    assert not stale.exists()


def test_keep_last_prunes_the_oldest(tmp_path):
    model = _model("gpt")
    run = tmp_path / "run"
    for step in (1, 2, 3, 4, 5):
        _save(run, step, model, tmp_path, keep_last=2)
    assert [s for s, _ in list_checkpoints(run)] == [4, 5]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-4", "step-5"]


def test_resume_path_must_hold_a_trainer_state(tmp_path):
    with pytest.raises(CheckpointError, match="not a training checkpoint"):
        resolve_resume(tmp_path)
    with pytest.raises(CheckpointError, match=r"^resume .*nonexist: no such file or folder"):
        resolve_resume(tmp_path / "nonexist")


def test_optimizer_state_round_trips_by_parameter_name():
    model = _model("gpt")
    opt = build_optimizer(model, OptimSection(), torch.device("cpu"))
    model(torch.randint(0, 97, (2, 8))).sum().backward()
    opt.step()
    named = optimizer_state_by_name(model, opt)
    assert "embed.tok.weight" in named["state"]
    fresh = build_optimizer(model, OptimSection(), torch.device("cpu"))
    load_optimizer_state_by_name(model, fresh, named)
    a, b = opt.state_dict(), fresh.state_dict()
    for i in a["state"]:
        assert torch.equal(a["state"][i]["exp_avg_sq"], b["state"][i]["exp_avg_sq"])


def test_an_optimizer_state_with_parameters_never_stepped_loads_where_they_are_frozen():
    """A fine-tuning checkpoint from before the trainer froze a classifier body's unused head holds that
    head in its optimizer's groups, with no state (it never had a gradient): it resumes. A parameter that
    was stepped there and is not trained here is a mismatch, named."""
    model = _model("gpt", tie_embeddings=False)
    opt = build_optimizer(model, OptimSection(), torch.device("cpu"))
    model(torch.randint(0, 97, (2, 8)), head=False).sum().backward()  # lm_head gets no gradient
    opt.step()
    named = optimizer_state_by_name(model, opt)
    assert "lm_head.weight" not in named["state"] and "lm_head.weight" in named["param_groups"][0]["params"]
    model.lm_head.weight.requires_grad_(False)
    frozen = build_optimizer(model, OptimSection(), torch.device("cpu"))
    load_optimizer_state_by_name(model, frozen, named)
    assert torch.equal(frozen.state[model.embed.tok.weight]["exp_avg"], opt.state[model.embed.tok.weight]["exp_avg"])
    model.embed.tok.weight.requires_grad_(False)
    with pytest.raises(CheckpointError, match="not trained here: .'embed.tok.weight'"):
        load_optimizer_state_by_name(model, build_optimizer(model, OptimSection(), torch.device("cpu")), named)


def test_ranks_build_the_same_weights_then_draw_their_own_dropout_masks():
    """Every rank builds its model from train.seed, then `seed_rank` gives each rank r > 0 its own dropout
    stream; rank 0 keeps its stream, so one process trains (and resumes) exactly as it did before ranks."""
    def masks():
        return torch.stack([F.dropout(torch.ones(256), 0.5) > 0 for _ in range(3)])

    def start(rank, step=0, seed_ranks=True):  # what Trainer does on this rank: build, then seed_rank
        model = _model("gpt", dropout=0.5)  # torch.manual_seed(0), then the initialisation
        if seed_ranks:
            seed_rank(0, rank, step)
        return model, masks()

    (model0, rank0), (model1, rank1) = start(0), start(1)
    assert all(torch.equal(a, b) for a, b in zip(model0.state_dict().values(), model1.state_dict().values()))
    assert not torch.equal(rank0, rank1)
    assert torch.equal(rank0, start(0, seed_ranks=False)[1])  # one process: the masks it always drew
    assert torch.equal(rank1, start(1)[1])  # a pure function of (seed, rank, step)
    assert not torch.equal(rank1, start(1, step=12)[1])  # a resumed rank does not replay its first masks
    saved = rng_state()  # exact resume on one process: the restored state is rank 0's own stream
    expected = masks()
    set_rng_state(saved)
    seed_rank(0, 0, step=12)
    assert torch.equal(masks(), expected)


@pytest.mark.parametrize("arch", ["gpt", "transformer"])
def test_activation_checkpointing_gives_the_same_gradients(arch):
    from tfkit.trainer.parallel import apply_activation_checkpointing

    batch = {"input_ids": torch.randint(0, 97, (2, 12)), "labels": torch.randint(0, 97, (2, 12))}
    if arch == "transformer":
        batch = {"src_ids": batch["input_ids"], "tgt_ids": batch["labels"], "labels": batch["labels"].roll(1, 1)}
    objective = ObjectiveSection(name="clm" if arch == "gpt" else "seq2seq")
    grads = []
    for checkpointed in (False, True):
        model = _model(arch, dropout=0.2)  # dropout: recomputation must replay the same random masks
        if checkpointed:
            assert apply_activation_checkpointing(model) == (2 if arch == "gpt" else 4)
        torch.manual_seed(5)
        compute_loss(model, batch, objective).loss.backward()
        grads.append({n: p.grad for n, p in model.named_parameters()})
        assert [n for n, _ in model.named_parameters()] == list(grads[0])  # names (checkpoints) unchanged
    for name in grads[0]:
        torch.testing.assert_close(grads[0][name], grads[1][name], rtol=1e-5, atol=1e-6)


def test_metrics_writer_mirrors_scalars_to_tensorboard_and_truncates_on_resume(tmp_path, monkeypatch):
    import sys
    import types

    from tfkit.checkpoints.run_record import read_metrics
    from tfkit.trainer.metrics import MetricsWriter, plot_loss

    scalars = []

    class SummaryWriter:  # stands in for torch.utils.tensorboard's, which needs the tensorboard package
        def __init__(self, log_dir, purge_step=None):
            self.log_dir, self.purge_step = log_dir, purge_step

        def add_scalar(self, tag, value, step):
            scalars.append((tag, value, step))

        def close(self):
            pass

    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", types.SimpleNamespace(SummaryWriter=SummaryWriter))
    writer = MetricsWriter(tmp_path, enabled=True, tensorboard=True)
    assert writer._tb.purge_step == 0  # a fresh start drops the events a killed attempt left in the folder
    for step in (1, 2, 3):
        writer.log({"step": step, "loss": 4.0 - step, "lr": 1e-3, "tokens_per_sec": 10.0})
    writer.log({"step": 3, "val_loss": 2.5, "val_accuracy": 0.1})
    writer.log({"step": 4, "skipped": True, "loss": None})
    writer.close()
    assert ("loss", 1.0, 3) in scalars and ("val_loss", 2.5, 3) in scalars
    assert not any(tag in ("step", "skipped") for tag, _, _ in scalars)
    resumed = MetricsWriter(tmp_path, enabled=True, tensorboard=False, resume_step=2)  # rows after 2 are redone
    resumed.close()
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1, 2]
    pytest.importorskip("matplotlib")
    assert plot_loss(tmp_path / "metrics.jsonl", tmp_path / "loss.png").stat().st_size > 1000


@pytest.mark.parametrize("name, peak", [("NVIDIA H100 80GB HBM3", 989e12), ("NVIDIA H100 PCIe", 756e12),
                                        ("NVIDIA H200", 989e12), ("NVIDIA L40S", 362e12), ("NVIDIA L40", 181e12),
                                        ("NVIDIA L4", 121e12), ("NVIDIA A100-SXM4-80GB", 312e12),
                                        ("Some Future GPU", None)])
def test_peak_flops_matches_the_most_specific_device_name(name, peak):
    assert peak_flops(name) == peak_flops(name, "fp16") == peak
    assert peak_flops(name, "fp32") == (None if peak is None else peak / 2)  # TF32 tensor cores


def test_mfu_is_achieved_over_peak_flops_of_every_gpu():
    # GPT-2 124M at ~6 * 124M FLOPs/token: 400k tok/s on one H100 SXM is ~30% MFU; two GPUs halve it.
    assert mfu(6 * 124e6, 400e3, 989e12, 1) == pytest.approx(0.3009, abs=1e-4)
    assert mfu(6 * 124e6, 400e3, 989e12, 2) == pytest.approx(0.3009 / 2, abs=1e-4)
    assert mfu(6 * 124e6, 400e3, None, 1) is None


def test_an_explicit_gpu_index_under_torchrun_is_refused(monkeypatch):
    from tfkit.errors import ConfigError
    from tfkit.trainer.distributed import init_distributed

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    with pytest.raises(ConfigError, match=r"train.device: 'cuda:0' would put all 2 torchrun processes on one GPU"):
        init_distributed("cuda:0")
