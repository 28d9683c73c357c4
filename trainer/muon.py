"""Muon for the blocks' matrices, AdamW for the rest: one optimizer the training loop treats as AdamW.

Muon (Keller Jordan, 2024; `torch.optim.Muon`) keeps a Nesterov momentum per weight matrix and applies it
orthogonalised: a few Newton-Schulz iterations map the momentum M = U S V^T to about U V^T, so every
direction of the update moves by the same amount instead of the few dominant ones. That is defined for
matrices that map one hidden space onto another, so Muon takes the weight matrices of the linear layers
inside the transformer blocks (attention projections, feed-forward); the embeddings, the output head, the
pooler and MLM transform, norms and biases go to AdamW, as modded-nanogpt splits them.

`MuonAdamW` is one `torch.optim.AdamW(fused=True)` whose last group, `muon`, it steps itself, because the
training loop relies on two things only one optimizer object gives (trainer/step.py):
- the rate is written into every group as a device tensor each step; the muon group holds `lr_scale =
  optim.muon_lr / optim.lr`, so its rate follows the schedule at its own peak;
- a non-finite update is skipped with no host read: the fused AdamW groups take the loop's `found_inf`,
  and the muon group computes its new momentum and weights and keeps the old ones where the flag is set
  (`torch.where`), so parameters, momentum and its step count are left exactly as they were.
One state_dict holds both (AdamW's moments and Muon's `momentum_buffer`), keyed by parameter name by the
checkpoint like any optimizer's, so exact resume needs nothing more. torch's own Muon takes neither a
tensor rate (it reads it back) nor a skip flag, hence the update is written out here, as it computes it.

FSDP shards every matrix across ranks, and Newton-Schulz needs whole matrices: Muon is refused there.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..errors import ConfigError
from ..models.base import Block
from .sections import OptimSection

NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)  # the quintic of Keller Jordan's Muon (torch.optim.Muon's default)
NS_STEPS = 5


def muon_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The weight matrices of the linear layers inside the blocks (trainable, each once), for Muon."""
    out, seen = [], set()
    for block in (m for m in model.modules() if isinstance(m, Block)):
        for layer in (m for m in block.modules() if isinstance(m, nn.Linear)):
            weight = layer.weight
            if weight.requires_grad and id(weight) not in seen:
                seen.add(id(weight))
                out.append(weight)
    if any(hasattr(p, "full_tensor") for p in out):  # a DTensor: FSDP holds one shard of each matrix
        raise ConfigError("optim.name: muon needs whole matrices for its Newton-Schulz step, which "
                          "train.distributed=fsdp shards across ranks; use train.distributed=ddp or optim.name=adamw")
    return out


def newton_schulz(g: Tensor, steps: int = NS_STEPS, eps: float = 1e-7) -> Tensor:
    """About U V^T for g = U S V^T (m, n), in bf16: the quintic iteration X <- aX + (bA + cA^2)X, A = XX^T,
    from X = g / ||g||_F (spectral norm <= 1), on the wide orientation so that A is the smaller Gram."""
    a, b, c = NS_COEFFICIENTS
    x = g.bfloat16()
    tall = g.shape[0] > g.shape[1]
    if tall:
        x = x.T  # (n, m): A is n x n
    x = x / x.norm().clamp(min=eps)
    for _ in range(steps):
        gram = x @ x.T  # (r, r), r = min(m, n)
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)  # (r, max(m, n))
    return x.T if tall else x  # (m, n)


class MuonAdamW(torch.optim.AdamW):
    """Fused AdamW over every group but the last, `muon`, which gets the Muon update (module docstring).

    The muon group's keys: `lr_scale` (its peak rate over AdamW's), `momentum`, `nesterov`, `ns_steps`,
    `weight_decay` (decoupled: W <- W * (1 - lr * wd)). Its rate is `lr * lr_scale` with `lr` whatever the
    loop or `set_lr` wrote, float or device tensor."""

    def step(self, closure=None):  # noqa: ANN001 - the signature of torch.optim.Optimizer.step
        groups = self.param_groups
        self.param_groups = [g for g in groups if g.get("name") != "muon"]
        try:
            loss = super().step(closure)  # AdamW, with the loop's found_inf when it set one
        finally:
            self.param_groups = groups
        skip = getattr(self, "found_inf", None)  # () float, 1 = leave everything as it is
        for group in groups:
            if group.get("name") == "muon":
                self._muon_step(group, None if skip is None else skip.bool())
        return loss

    @torch.no_grad()
    def _muon_step(self, group: dict, skip: Tensor | None) -> None:
        lr, momentum, decay = group["lr"] * group["lr_scale"], group["momentum"], group["weight_decay"]
        for p in group["params"]:
            if p.grad is None:
                continue
            state = self.state[p]
            if not state:  # "step" too: AdamW's load_state_dict expects one in every parameter's state
                state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
                state["momentum_buffer"] = torch.zeros_like(p)
            buf, grad = state["momentum_buffer"], p.grad
            new_buf = buf.lerp(grad, 1 - momentum)  # (m, n): momentum * buf + (1 - momentum) * grad
            update = grad.lerp(new_buf, momentum) if group["nesterov"] else new_buf
            rate = lr * max(1.0, p.shape[0] / p.shape[1]) ** 0.5  # equal update RMS for tall matrices
            new_p = p * (1 - lr * decay) if decay else p
            new_p = new_p - rate * newton_schulz(update, group["ns_steps"]).to(p.dtype)  # (m, n)
            if skip is None:
                buf.copy_(new_buf)
                p.copy_(new_p)
                state["step"] += 1
            else:  # a skipped update: the old values, bit for bit, chosen on the device
                buf.copy_(torch.where(skip, buf, new_buf))
                p.copy_(torch.where(skip, p, new_p))
                state["step"] += (~skip).float()


def build_muon_adamw(model: nn.Module, matrices: list[nn.Parameter], adamw_groups: list[dict],
                     optim: OptimSection) -> MuonAdamW:
    """MuonAdamW: `adamw_groups` (without the `matrices`, from `muon_parameters`) and the muon group."""
    muon = {"params": matrices, "name": "muon", "lr_scale": optim.muon_lr / optim.lr,
            "momentum": optim.muon_momentum, "nesterov": True, "ns_steps": NS_STEPS,
            "weight_decay": optim.muon_weight_decay}
    return MuonAdamW([*adamw_groups, muon], lr=optim.lr, betas=(optim.beta1, optim.beta2), eps=optim.eps,
                     fused=True)
