"""`model.share_layers` (ALBERT's all-shared cross-layer sharing, Lan et al., 2020, section 3.1).

The reference is an unshared model of the same config whose every block was loaded with the shared block's
weights (n independent copies): the shared model's forward must equal it, and the shared block's gradient must
equal the sum of the copies' gradients. Then what sharing must keep: the KV cache, counts that hold the block
once, a checkpoint that stores it once and ties it again on load, the one-line refusals (exports, depth checks,
an eval override that would tie what a checkpoint holds apart, several processes) and a whole training run."""

import dataclasses
import json

import pytest
import torch
from safetensors import safe_open
from typer.testing import CliRunner

from tfkit.checkpoints.gguf_export import gguf_layout
from tfkit.checkpoints.hf_state import export_family
from tfkit.checkpoints.weights import load_model, save_model
from tfkit.cli.main import app
from tfkit.errors import CheckpointError, ConfigError
from tfkit.evaluation.model_overrides import with_model_overrides
from tfkit.models import ModelConfig, build_model
from tfkit.trainer.memory import block_matrix_params
from tfkit.trainer.parallel import check_one_process_keys
from tfkit.trainer.resources import count_parameters

from helpers import tiny_cfg

ARCHS = ["gpt", "bert", "transformer"]
STACKS = {"gpt": ("blocks",), "bert": ("blocks",), "transformer": ("encoder", "decoder")}


def shared_and_copies(arch: str, **kw) -> tuple[torch.nn.Module, torch.nn.Module]:
    """A shared model of 3 layers and an unshared one holding 3 separate copies of its block (and its other
    weights), both in eval mode."""
    torch.manual_seed(0)
    cfg = tiny_cfg(arch, n_layers=3, share_layers=True, **kw)
    shared = build_model(cfg).eval()
    copies = build_model(dataclasses.replace(cfg, share_layers=False)).eval()
    copies.load_state_dict(shared.state_dict())  # the state dict names blocks.0..2: each copy gets the block
    for stack in STACKS[arch]:
        blocks = getattr(copies, stack)
        assert len({id(b) for b in blocks}) == 3 and blocks[0].ffn.up.weight is not blocks[1].ffn.up.weight
    return shared, copies


def ids(T: int = 10, B: int = 2) -> torch.Tensor:
    return torch.randint(1, 61, (B, T), generator=torch.Generator().manual_seed(0))


def run(model: torch.nn.Module, arch: str) -> torch.Tensor:
    x = ids()
    return model(x, x[:, :6]) if arch == "transformer" else model(x)  # logits (B, T, V)


@pytest.mark.parametrize("arch", ARCHS)
def test_one_block_object_per_stack(arch):
    shared, _ = shared_and_copies(arch)
    for stack in STACKS[arch]:
        blocks = getattr(shared, stack)
        assert len(blocks) == 3 and blocks[0] is blocks[1] is blocks[2]
    if arch == "transformer":  # each stack shares within itself, never across
        assert shared.encoder[0] is not shared.decoder[0]


@pytest.mark.parametrize("arch", ARCHS)
def test_forward_equals_unshared_copies_of_the_block(arch):
    shared, copies = shared_and_copies(arch, positions="rope" if arch == "gpt" else "learned")
    with torch.no_grad():
        torch.testing.assert_close(run(shared, arch), run(copies, arch), atol=1e-5, rtol=1e-5)
    with torch.no_grad():  # and the copies' own forward depends on each copy: change one, the output moves
        getattr(copies, STACKS[arch][0])[2].ffn.down.weight.mul_(3.0)
        assert (run(shared, arch) - run(copies, arch)).abs().max() > 1e-3


@pytest.mark.parametrize("arch", ARCHS)
def test_the_shared_gradient_is_the_sum_over_layers_of_the_copies_gradients(arch):
    shared, copies = shared_and_copies(arch)
    for model in (shared, copies):
        run(model, arch).square().mean().backward()
    grads = dict(shared.named_parameters())  # one name per tensor: blocks.0.* for the shared block
    for stack in STACKS[arch]:
        for name, param in getattr(shared, stack)[0].named_parameters():
            total = sum(getattr(copies, stack)[i].get_parameter(name).grad for i in range(3))
            torch.testing.assert_close(param.grad, total, atol=1e-6, rtol=1e-5)
            assert grads[f"{stack}.0.{name}"] is param
    torch.testing.assert_close(shared.lm_head.weight.grad if arch != "bert" else shared.mlm.dense.weight.grad,
                               copies.lm_head.weight.grad if arch != "bert" else copies.mlm.dense.weight.grad)


def test_activation_checkpointing_wraps_the_shared_block_once_and_keeps_its_gradient():
    from tfkit.trainer.parallel import apply_activation_checkpointing

    shared, _ = shared_and_copies("gpt")
    plain, _ = shared_and_copies("gpt")
    assert apply_activation_checkpointing(shared) == 1  # one module, recomputed at each of its 3 layers
    for model in (shared, plain):
        run(model, "gpt").square().mean().backward()
    torch.testing.assert_close(shared.blocks[0].ffn.up.weight.grad, plain.blocks[0].ffn.up.weight.grad)


@pytest.mark.parametrize("arch", ["gpt", "transformer"])
def test_the_kv_cache_decodes_as_a_full_forward(arch):
    """Per-layer cache slots stay per layer when the weights are one block: prefill of 4, then one token at a
    time, equals one full forward."""
    shared, _ = shared_and_copies(arch, positions="rope")
    x = ids(10, B=1)
    with torch.no_grad():
        if arch == "gpt":
            full, step = shared(x), lambda part, **kw: shared(part, **kw)
        else:
            memory = shared.encode(x)
            full, step = shared.decode(x, memory), lambda part, **kw: shared.decode(part, memory, **kw)
        cache = shared.new_kv_cache(1)
        out = [step(x[:, :4], kv_cache=cache)]
        out += [step(x[:, t:t + 1], kv_cache=cache, start_pos=torch.tensor(t)) for t in range(4, 10)]
    torch.testing.assert_close(torch.cat(out, dim=1), full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("arch", ARCHS)
def test_counts_hold_the_shared_block_once_and_flops_every_layer(arch):
    shared, copies = shared_and_copies(arch)
    per_stack = sum(sum(p.numel() for p in getattr(shared, s)[0].parameters()) for s in STACKS[arch])
    assert copies.num_params() - shared.num_params() == 2 * per_stack  # 3 layers stored as 1
    assert shared.num_params(non_embedding=True) == copies.num_params(non_embedding=True) - 2 * per_stack
    assert shared.flops_per_token(16) == copies.flops_per_token(16)  # the compute is every layer's
    cfg = shared.config  # the key-only counts the planner and the memory check use agree on the difference
    assert count_parameters(copies.config) - count_parameters(cfg) == 2 * per_stack
    assert block_matrix_params(copies.config) == 3 * block_matrix_params(cfg)


@pytest.mark.parametrize("arch", ARCHS)
def test_a_checkpoint_stores_the_block_once_and_loads_it_tied(arch, tmp_path):
    shared, _ = shared_and_copies(arch)
    save_model(shared, tmp_path / "ckpt")
    with safe_open(str(tmp_path / "ckpt" / "model.safetensors"), framework="pt") as f:
        names = list(f.keys())
    for stack in STACKS[arch]:
        assert any(n.startswith(f"{stack}.0.") for n in names)
        assert not any(n.startswith((f"{stack}.1.", f"{stack}.2.")) for n in names)
    loaded, cfg = load_model(tmp_path / "ckpt")
    assert cfg.share_layers
    for stack in STACKS[arch]:
        blocks = getattr(loaded, stack)
        assert blocks[0].attn.q_proj.weight is blocks[2].attn.q_proj.weight
    assert loaded.num_params() == shared.num_params()
    with torch.no_grad():
        torch.testing.assert_close(run(loaded, arch), run(shared, arch))


def test_a_config_that_disagrees_about_sharing_with_its_weights_is_refused(tmp_path):
    shared, copies = shared_and_copies("gpt")
    save_model(shared, tmp_path / "shared")
    save_model(copies, tmp_path / "copies")
    config = json.loads((tmp_path / "shared" / "config.json").read_text())
    config["model"]["share_layers"] = False  # 3 blocks declared, 1 stored
    (tmp_path / "shared" / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"model.n_layers=3, but model.safetensors holds 1 block \(blocks.0"):
        load_model(tmp_path / "shared")
    config = json.loads((tmp_path / "copies" / "config.json").read_text())
    config["model"]["share_layers"] = True  # 1 block declared, 3 stored
    (tmp_path / "copies" / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="with model.share_layers .one block stored., but model.safetensors "
                                              "holds 3 blocks"):
        load_model(tmp_path / "copies")


def test_hf_and_gguf_export_refuse_sharing_in_one_line():
    cfg = ModelConfig(arch="gpt", vocab_size=61, d_model=32, n_layers=2, n_heads=4, share_layers=True)
    for refuse in (export_family, gguf_layout):
        with pytest.raises(ConfigError) as err:
            refuse(cfg)
        assert "model.share_layers=True" in str(err.value) and "\n" not in str(err.value)
    bert = ModelConfig(arch="bert", vocab_size=61, d_model=32, n_layers=2, n_heads=4, norm_placement="post",
                       share_layers=True)
    with pytest.raises(ConfigError, match="model.share_layers=True has no HuggingFace equivalent"):
        export_family(bert)


def test_an_eval_override_may_not_tie_what_the_checkpoint_holds_apart():
    """`tfkit eval --set model.share_layers=true` on an unshared checkpoint would run block 0 at every layer
    (every name of a tied group is filled from one): refused; the other way computes the same function."""
    shared, copies = shared_and_copies("gpt")
    with pytest.raises(ConfigError, match="model.share_layers=True changes the model's weights .blocks.1.* would be "
                                          "the same tensor as blocks.0"):
        with_model_overrides(copies, copies.config, ["model.share_layers=true"])
    untied = build_model(tiny_cfg("gpt", tie_embeddings=False))  # the same rule catches tying the embeddings
    with pytest.raises(ConfigError, match="model.tie_embeddings=True changes the model's weights"):
        with_model_overrides(untied, untied.config, ["model.tie_embeddings=true"])
    unshared, cfg = with_model_overrides(shared, shared.config, ["model.share_layers=false"])
    assert not cfg.share_layers
    with torch.no_grad():
        torch.testing.assert_close(run(unshared, "gpt"), run(shared, "gpt"))


def test_several_processes_are_refused_one_process_is_not():
    cfg = tiny_cfg("gpt", share_layers=True)
    check_one_process_keys(cfg, 1)
    check_one_process_keys(dataclasses.replace(cfg, share_layers=False), 4)
    with pytest.raises(ConfigError, match="^model.share_layers: .* one process only .*got 2 processes"):
        check_one_process_keys(cfg, 2)


def test_a_shared_run_trains_resumes_evaluates_and_generates(tmp_path, english_text):
    from helpers import losses, weights, write_recipe
    from tfkit.trainer.recipe import load_recipe
    from tfkit.trainer.run import pretrain

    recipe = write_recipe(tmp_path, english_text, model={"n_layers": 3, "share_layers": True, "dropout": 0.0},
                          train={"max_steps": 4, "save_every": 2, "eval_every": 2})
    pretrain(load_recipe(str(recipe)), run_dir=tmp_path / "run")
    model, cfg = load_model(tmp_path / "run")
    assert cfg.share_layers and model.blocks[0] is model.blocks[2]
    assert "3 layers of one shared block" in (tmp_path / "run" / "start.log").read_text()
    pretrain(load_recipe(str(recipe)), run_dir=tmp_path / "resumed",
             resume=str(tmp_path / "run" / "checkpoints" / "step-2"))  # optimizer state of the one block, by name
    later = {k: v for k, v in losses(tmp_path / "run").items() if k[0] > 2}
    assert later and {k: losses(tmp_path / "resumed")[k] for k in later} == later
    assert weights(tmp_path / "run" / "checkpoints" / "step-4").keys() == weights(
        tmp_path / "resumed" / "checkpoints" / "step-4").keys()
    runner = CliRunner()
    scored = runner.invoke(app, ["eval", str(tmp_path / "run"), "--data", str(tmp_path / "valid.txt"),
                                 "--max-batches", "1"])
    assert scored.exit_code == 0, scored.output
    made = runner.invoke(app, ["generate", str(tmp_path / "run"), "-p", "The", "-n", "4", "--temperature", "0"])
    assert made.exit_code == 0, made.output
    refused = runner.invoke(app, ["export-hf", str(tmp_path / "run"), "--out", str(tmp_path / "hf")])
    assert refused.exit_code == 2 and "model.share_layers=True" in refused.output


# --- the encoder-decoder's embeddings (model.tie_embeddings: three-way tying, Press and Wolf, 2017) ---

def test_three_way_tying_equals_three_copies_and_sums_their_gradients():
    """One matrix embeds the source and the target and makes the logits (Vaswani et al., 2017, section 3.4): an
    untied model given three copies of it computes the same, and the tied gradient is the sum of the three."""
    torch.manual_seed(0)
    tied = build_model(tiny_cfg("transformer")).eval()
    untied = build_model(tiny_cfg("transformer", tie_embeddings=False)).eval()
    untied.load_state_dict(tied.state_dict())  # the tied state dict names all three: each copy gets the matrix
    assert untied.src_embed.tok.weight is not untied.tgt_embed.tok.weight is not untied.lm_head.weight
    with torch.no_grad():
        torch.testing.assert_close(run(tied, "transformer"), run(untied, "transformer"))
    for model in (tied, untied):
        run(model, "transformer").square().mean().backward()
    three = untied.src_embed.tok.weight.grad + untied.tgt_embed.tok.weight.grad + untied.lm_head.weight.grad
    torch.testing.assert_close(tied.lm_head.weight.grad, three, atol=1e-6, rtol=1e-5)
    assert untied.num_params() - tied.num_params() == 2 * 61 * 32
