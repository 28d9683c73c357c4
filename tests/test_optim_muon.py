"""`optim.name: muon`: the blocks' matrices by Muon, the rest by AdamW, as one optimizer the loop steps.

The Muon update is checked against torch.optim.Muon; the skip of a non-finite update must leave weights,
moments and step counts exactly as they were (no host read decides it); a run lowers the loss, and a
resumed run continues bit for bit.
"""

from __future__ import annotations

import io

import pytest
import torch
from torch import nn

from tfkit.checkpoints.trainer_state import load_optimizer_state_by_name, optimizer_state_by_name
from tfkit.errors import ConfigError
from tfkit.models import build_model
from tfkit.trainer.loop import TrainingDiverged, TrainState, run_loop
from tfkit.trainer.muon import MuonAdamW, muon_parameters
from tfkit.trainer.optim import build_optimizer
from tfkit.trainer.recipe import load_recipe
from tfkit.trainer.sections import OptimSection

from helpers import losses, poison_loss, tiny_cfg, tiny_loop, weights, write_recipe


def muon_only(weight: nn.Parameter, lr: float, decay: float) -> MuonAdamW:
    group = {"params": [weight], "name": "muon", "lr_scale": 1.0, "momentum": 0.95, "nesterov": True, "ns_steps": 5,
             "weight_decay": decay}
    return MuonAdamW([group], lr=lr, fused=True)


@pytest.mark.parametrize("shape", [(12, 5), (5, 12)], ids=["tall", "wide"])
@pytest.mark.parametrize("tensor_lr", [False, True], ids=["float-lr", "tensor-lr"])
def test_muon_steps_as_torch_muon_does(shape, tensor_lr):
    torch.manual_seed(0)
    mine = nn.Parameter(torch.randn(shape))
    theirs = nn.Parameter(mine.detach().clone())
    ours, reference = muon_only(mine, 0.02, 0.1), torch.optim.Muon([theirs], lr=0.02, momentum=0.95, weight_decay=0.1)
    for _ in range(4):
        grad = torch.randn(shape)
        mine.grad, theirs.grad = grad.clone(), grad.clone()
        if tensor_lr:  # as the training loop writes it: a device tensor, never read back
            ours.param_groups[0]["lr"] = torch.tensor(0.02)
        ours.step()
        reference.step()
    torch.testing.assert_close(mine, theirs, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(ours.state[mine]["momentum_buffer"], reference.state[theirs]["momentum_buffer"])
    assert float(ours.state[mine]["step"]) == 4


def test_hidden_matrices_go_to_muon_and_everything_else_to_adamw():
    model = build_model(tiny_cfg("gpt", tie_embeddings=False))
    optimizer = build_optimizer(model, OptimSection(name="muon", lr=1e-3, muon_lr=0.04), torch.device("cpu"))
    groups = {g["name"]: g for g in optimizer.param_groups}
    names = {id(p): n for n, p in model.named_parameters()}
    muon = sorted(names[id(p)] for p in groups["muon"]["params"])
    assert muon and all(n.startswith("blocks.") and n.endswith(".weight") and "norm" not in n for n in muon)
    assert len(muon) == 2 * (4 + 2)  # per block: q, k, v, o projections and the FFN's up and down
    adamw = {names[id(p)] for g in ("decay", "no_decay") for p in groups[g]["params"]}
    assert {"embed.tok.weight", "embed.pos.weight", "lm_head.weight", "ln_f.weight"} <= adamw
    assert adamw.isdisjoint(muon) and len(adamw) + len(muon) == len(list(model.parameters()))
    assert groups["muon"]["lr_scale"] == pytest.approx(40.0) and optimizer.defaults["fused"]


def test_bert_heads_stay_with_adamw():
    model = build_model(tiny_cfg("bert"))
    names = {id(p): n for n, p in model.named_parameters()}
    assert all(names[id(p)].startswith("blocks.") for p in muon_parameters(model))


def test_a_skipped_update_leaves_weights_moments_and_steps_untouched():
    model = build_model(tiny_cfg("gpt"))
    optimizer = build_optimizer(model, OptimSection(name="muon", weight_decay=0.1, muon_weight_decay=0.1),
                                torch.device("cpu"))
    ids = torch.randint(0, 61, (2, 9))
    for _ in range(2):  # real updates first, so there are moments and momenta to keep
        nn.functional.cross_entropy(model(ids[:, :-1]).flatten(0, 1), ids[:, 1:].flatten()).backward()
        optimizer.step()
        optimizer.zero_grad()
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    state = {id(p): {k: v.clone() for k, v in s.items()} for p, s in optimizer.state.items()}
    for p in model.parameters():
        p.grad = torch.full_like(p, float("nan"))
    for group in optimizer.param_groups:
        group["lr"] = torch.tensor(3e-4)
    optimizer.found_inf = torch.ones(())  # what the loop sets for a non-finite update
    optimizer.step()
    del optimizer.found_inf
    assert all(torch.equal(params[n], p) for n, p in model.named_parameters())
    for p, s in optimizer.state.items():
        assert all(torch.equal(state[id(p)][k], v) for k, v in s.items())


def test_muon_lowers_the_loss_and_a_run_of_non_finite_updates_changes_nothing(monkeypatch):
    flags = ["optim.name=muon", "optim.muon_lr=0.02", "schedule.name=constant", "train.batch_size=4"]
    clean, rows, _ = tiny_loop([*flags, "train.max_steps=12"])
    run_loop(clean)
    assert rows[-1]["loss"] < rows[0]["loss"] - 0.1
    two, _, _ = tiny_loop([*flags, "train.max_steps=2"])
    run_loop(two)
    poison_loss(monkeypatch, set(range(2, 100)))  # every update after the second is non-finite
    poisoned, _, _ = tiny_loop([*flags, "train.max_steps=12", "train.max_bad_steps=3"])
    with pytest.raises(TrainingDiverged):
        run_loop(poisoned)
    assert poisoned.state.step == 2
    for a, b in zip(two.update.model.parameters(), poisoned.update.model.parameters()):
        assert torch.equal(a, b)


def test_muon_is_refused_where_matrices_are_sharded():
    model = build_model(tiny_cfg("gpt"))
    model.blocks[0].attn.q_proj.weight.full_tensor = lambda: None  # what FSDP2's DTensors have
    with pytest.raises(ConfigError, match="optim.name: muon needs whole matrices.*train.distributed=fsdp"):
        muon_parameters(model)


def test_resuming_from_the_saved_state_continues_bit_for_bit():
    """What a checkpoint keeps of the optimizer (by parameter name, through torch.save and a weights_only load)
    lets a fresh optimizer continue exactly where the first one was: both groups' state, Muon's momentum too."""
    flags = ["optim.name=muon", "train.batch_size=4", "train.max_steps=8", "train.save_every=4"]
    whole, rows, _ = tiny_loop(flags)
    run_loop(whole)
    first, _, _ = tiny_loop(flags)
    saved = {}

    def save(state):
        if state.step == 4:
            buffer = io.BytesIO()
            torch.save({"model": first.update.model.state_dict(), "state": state.to_dict(),
                        "optimizer": optimizer_state_by_name(first.update.model, first.update.optimizer)}, buffer)
            saved["bytes"] = buffer.getvalue()

    first.save = save
    run_loop(first)
    payload = torch.load(io.BytesIO(saved["bytes"]), weights_only=True)
    resumed, resumed_rows, _ = tiny_loop(flags)
    resumed.update.model.load_state_dict(payload["model"])
    load_optimizer_state_by_name(resumed.update.model, resumed.update.optimizer, payload["optimizer"])
    assert any("momentum_buffer" in s for s in payload["optimizer"]["state"].values())
    resumed.state = TrainState.from_dict(payload["state"])
    run_loop(resumed)
    assert [r["loss"] for r in resumed_rows] == [r["loss"] for r in rows[4:]]
    assert all(torch.equal(a, b) for a, b in zip(whole.update.model.parameters(), resumed.update.model.parameters()))


@pytest.mark.slow
def test_a_resumed_muon_pretrain_is_exact(english_text, tmp_path):
    from tfkit.trainer.run import pretrain

    recipe = write_recipe(tmp_path, english_text, optim={"name": "muon", "lr": 3e-3, "muon_lr": 0.02},
                          train={"max_steps": 8, "save_every": 4, "eval_every": 8})
    pretrain(load_recipe(str(recipe)), run_dir=tmp_path / "ref")
    pretrain(load_recipe(str(recipe)), run_dir=tmp_path / "resumed", resume=str(tmp_path / "ref/checkpoints/step-4"))
    ref, got = losses(tmp_path / "ref"), losses(tmp_path / "resumed")
    later = {k: v for k, v in ref.items() if k[0] > 4}
    assert later and {k: got[k] for k in later} == later
    a, b = weights(tmp_path / "ref/checkpoints/step-8"), weights(tmp_path / "resumed/checkpoints/step-8")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
