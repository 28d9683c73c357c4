"""The memory a plan predicts (trainer/memory.py): the activations its per-layer counts give against what
autograd really saves, family by family, and the parts that follow the layout (sharding, checkpointing)."""

import pytest
import torch

from tfkit.models import build_model
from tfkit.trainer.memory import Layout, activation_bytes, estimate_memory
from tfkit.trainer.objectives import LossModule
from tfkit.trainer.pace import synthetic_batch
from tfkit.trainer.recipe import load_recipe


def saved_bytes(recipe, cfg, batch: int) -> int:
    """Bytes of the distinct storages autograd saves for the backward pass of one micro-batch, the weights
    aside (they are counted as weights)."""
    torch.manual_seed(0)
    model = build_model(cfg)
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    storages: dict[int, int] = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in weights:
            storages[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        LossModule(model, recipe.objective)(synthetic_batch(cfg, recipe.objective.name, batch, recipe.data.seq_len))
    return sum(storages.values())


@pytest.mark.parametrize("name,sets", [
    ("quickstart", ["model.size=tiny"]),  # quickstart's own size is planned: tiny's shape here
    ("quickstart", ["model.size=null", "model.d_model=192", "model.n_layers=3", "model.n_heads=6"]),
    ("llama-tiny", []),
    ("bert-tiny", []),
    ("transformer-tiny", []),
])
def test_predicted_activations_are_what_autograd_saves(name, sets):
    recipe = load_recipe(name, sets + ["data.seq_len=64"])
    cfg = recipe.model.config(recipe.tokenizer.vocab_size)
    layout = Layout(4, 64, objective=recipe.objective.name, fused_loss=True)
    assert activation_bytes(cfg, layout) == pytest.approx(saved_bytes(recipe, cfg, 4), rel=0.10)


def test_the_layout_moves_the_estimate_as_it_should():
    recipe = load_recipe("quickstart", ["model.size=null", "model.d_model=256", "model.n_layers=8", "model.n_heads=4"])
    cfg = recipe.model.config(recipe.tokenizer.vocab_size)
    one = estimate_memory(cfg, Layout(16, 128))
    assert estimate_memory(cfg, Layout(16, 128, activation_checkpointing=True)).activations < one.activations / 2
    assert estimate_memory(cfg, Layout(8, 128)).activations < one.activations
    sharded = estimate_memory(cfg, Layout(16, 128, processes=4, distributed="fsdp"))
    assert sharded.optimizer == one.optimizer // 4 and sharded.gradients == one.gradients // 4
    assert one.weights / 4 < sharded.weights < one.weights  # a shard, plus the root and two blocks whole
    ddp = estimate_memory(cfg, Layout(16, 128, processes=4, distributed="ddp"))
    assert ddp.gradients == 2 * one.gradients  # DDP's buckets beside the gradients
