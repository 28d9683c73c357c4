"""`train.compile: true`: every objective compiles to one graph (no break, no recompilation as the MLM
target count changes), and a compiled training run computes what the eager one does."""

import pytest
import torch
import torch._dynamo as dynamo

from tfkit.models import build_model
from tfkit.models.config import ModelConfig
from tfkit.trainer.objectives import DYNAMO_SETTINGS, LossModule, compile_loss_module
from tfkit.trainer.recipe import ObjectiveSection

SLOW = pytest.mark.slow  # compiled-model checks: TorchDynamo traces every objective

OBJECTIVE = {"gpt": "clm", "bert": "mlm", "transformer": "seq2seq"}


def _batch(arch: str, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 64, (4, 24), generator=g)  # (B, T)
    if arch == "gpt":
        return {"input_ids": ids, "labels": ids.roll(-1, dims=1)}
    if arch == "bert":  # a different number of targets in every batch
        masked = torch.rand(4, 24, generator=g) < 0.1 + 0.05 * seed
        return {"input_ids": ids, "labels": ids.masked_fill(~masked, -100), "token_type_ids": torch.zeros_like(ids)}
    padding = torch.arange(24)[None, :] < torch.tensor([[24], [20], [16], [24]])  # (B, T): real tokens
    return {"src_ids": ids, "src_mask": padding, "tgt_ids": ids, "tgt_mask": padding,
            "labels": ids.masked_fill(~padding, -100)}


def _loss_module(arch: str) -> LossModule:
    torch.manual_seed(0)
    cfg = ModelConfig(arch=arch, vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=32,
                      pad_token_id=0)  # as pretrain builds it (the tokenizer's pad id)
    return LossModule(build_model(cfg), ObjectiveSection(name=OBJECTIVE[arch]))


@pytest.fixture(autouse=True)
def fresh_dynamo():
    dynamo.reset()
    yield
    dynamo.reset()


@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated")  # torch.compile's first import
def test_compiling_the_loss_module_leaves_dynamo_s_settings_as_they_were():
    """Its dynamo settings are the loss module's own: a later compile in the same process (generate
    --compile, a user's code) gets dynamo's defaults. (Compiling is lazy: nothing is traced here.)"""
    before = dynamo.config.get_config_copy()
    compile_loss_module(_loss_module("bert"))
    assert dynamo.config.get_config_copy() == before


@SLOW
@pytest.mark.parametrize("arch", sorted(OBJECTIVE))
def test_every_objective_traces_as_one_graph(arch):
    module = _loss_module(arch)
    with dynamo.config.patch(DYNAMO_SETTINGS):  # what compile_loss_module traces the module with
        explained = dynamo.explain(module.forward)(_batch(arch, 0))
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons


@SLOW
def test_mlm_with_fixed_positions_traces_without_data_dependent_shapes():
    """MlmDataset's batches carry mlm_positions (B, K): the objective is one graph even where dynamo may not
    capture data-dependent output sizes, because it has none."""
    from tfkit.tokenization.batches import mlm_targets

    module = _loss_module("bert")
    batch = _batch("bert", 2)
    batch["mlm_positions"], batch["mlm_labels"] = mlm_targets(batch["labels"], 24)
    with dynamo.config.patch(capture_dynamic_output_shape_ops=False):
        explained = dynamo.explain(module.forward)(batch)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons


@SLOW
def test_compiled_bert_training_equals_eager_across_target_counts():
    """Inductor on the CPU: the losses and gradients of the compiled objective equal the eager ones while
    the number of masked targets changes from batch to batch, without recompiling (the module's own
    settings apply to its calls), and dynamo's settings are as they were after them."""
    eager, compiled = _loss_module("bert"), _loss_module("bert")
    before = dynamo.config.get_config_copy()
    compile_loss_module(compiled)
    counts = []
    with dynamo.config.patch(error_on_recompile=True):  # a new target count must not recompile
        _compare_three_batches(eager, compiled, counts)
    assert len(set(counts)) == 3  # the batches really had different target counts
    assert dynamo.config.get_config_copy() == before


def _compare_three_batches(eager: LossModule, compiled: LossModule, counts: list[int]) -> None:
    for seed in range(3):
        batch = _batch("bert", seed)
        results = []
        for module in (eager, compiled):
            module.zero_grad()
            loss_sum, correct, count = module(batch)
            loss_sum.backward()
            results.append((loss_sum.detach(), correct, count, [p.grad.clone() for p in module.parameters()
                                                                 if p.grad is not None]))
        (l_e, c_e, n_e, g_e), (l_c, c_c, n_c, g_c) = results
        assert torch.allclose(l_c, l_e, rtol=1e-5) and int(c_c) == int(c_e) and int(n_c) == int(n_e)
        assert len(g_c) == len(g_e) and all(torch.allclose(a, b, rtol=1e-4, atol=1e-6) for a, b in zip(g_c, g_e))
        counts.append(int(n_e))
