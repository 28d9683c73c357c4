"""The benchmark suite keeps running: `python -m benchmarks.run --quick` end to end, and the GPU suite's
refusal on a machine without CUDA. The numbers of a quick run mean nothing; that every section still
produces its rows, and the JSON its fields, is what these tests hold on to. The reference GPT (the
nanoGPT-style baseline) is checked for what makes it a fair one: loss ln V at init, causality, nanoGPT's
schedule and optimizer groups, and its char-level run scoring every validation byte once."""

from __future__ import annotations

import functools
import importlib
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]


def bench(*args: str, timeout: int = 180) -> subprocess.CompletedProcess:
    """The command as a user types it, from the repository root (benchmarks/ is not an installed package)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "benchmarks.run", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


def sections_left_to_the_checklist(tmp_path: Path) -> tuple[tuple[str, ...], set[str]]:
    """benchmarks.run's sections, and those the GPU checklist's `--quick` run measures (in CI, by
    tests/test_gpu_checklist.py, which checks their rows)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(ROOT))
        sections = importlib.import_module("benchmarks.run").SECTIONS
        steps = importlib.import_module("benchmarks.gpu_checklist").plan(tmp_path, quick=True, gpus=0)
    return sections, {s.argv[s.argv.index("--only") + 1] for s in steps if "benchmarks.run" in s.argv and not s.skip}


@pytest.mark.slow
def test_quick_suite_prints_one_table_and_writes_json(tmp_path):
    """Every section but those the GPU checklist's quick run measures (train, attention, decode, inloop,
    decode_1b: their rows are checked there), so that CI runs each section once."""
    sections, checklist = sections_left_to_the_checklist(tmp_path)
    assert {"train", "attention", "decode", "inloop"} <= checklist
    out = tmp_path / "results.json"
    done = bench("--quick", "--only", ",".join(s for s in sections if s not in checklist), "--json", str(out))
    assert done.returncode == 0, done.stderr[-2000:]
    table = [line for line in done.stdout.splitlines() if line.startswith("|")]
    assert table[0].split("|")[1].strip() == "section" and len(table) > 2
    result = json.loads(out.read_text())
    assert result["suite"] == "cpu" and result["quick"] is True and result["machine"]["torch"] == torch.__version__
    ran = {row["section"] for row in result["rows"]}
    assert {"tokenizer", "corpora", "batches", "cli", "sft", "mixture", "finetune"} <= ran, (ran, result["notes"])
    for row in result["rows"]:
        assert row["tfkit"] > 0 and math.isfinite(row["tfkit"]), row
        if row["baseline"] is not None:
            assert row["ratio"] > 0, row
        if row["goal"] is not None and row["goal"]["max_gap"] is not None:  # a parity goal: a gap, either side
            assert row["passed"] == (abs(row["tfkit"] - row["baseline"]) <= row["goal"]["max_gap"]), row
        elif row["goal"] is not None and row["ratio"] is not None:
            assert row["passed"] == (row["ratio"] >= row["goal"]["min_ratio"]), row
    # The CPU goals are on the table, whatever this run's verdict.
    goals = {row["goal"]["text"] for row in result["rows"] if row["goal"]}
    assert {"within 0.3 s of python -c pass", "<= 1.3x plain tokenizers"} <= goals
    assert all("stdlib:docs:train" in row["note"] for row in result["rows"] if row["section"] == "tokenizer")
    corpora = {row["case"].split()[1] for row in result["rows"] if row["section"] == "corpora"}
    assert {"txt", "jsonl.gz", "jsonl.zst", "parquet", "datasets"} <= corpora  # the data extra is in the test extra


def in_process(bm, capsys, *args: str) -> tuple[int, str, str]:
    """`python -m benchmarks.run ARGS`'s exit code, stdout and stderr, run in this process (a refusal comes
    before any work, so a subprocess would spend its time importing torch)."""
    try:
        code = bm.run.main(list(args))
    except SystemExit as stop:  # argparse's usage errors
        code = stop.code
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on machines without CUDA")
def test_gpu_suite_refuses_without_cuda_in_one_line(bm, capsys):
    code, out, err = in_process(bm, capsys, "--suite", "gpu")
    assert code == 2
    assert out == "" and len(err.strip().splitlines()) == 1
    assert "CUDA" in err and "--suite cpu" in err


def test_unknown_section_is_a_usage_error(bm, capsys):
    code, out, err = in_process(bm, capsys, "--only", "train,warp")  # the typed command: the slow test above
    assert code == 2 and out == "" and "warp" in err.splitlines()[-1] and "Traceback" not in err


@pytest.mark.parametrize("content, says", [
    (None, "is not a file"),
    ('"3","a title","a description"\n"x","no","class index"\n', "line 2: expected three columns, a class index"),
    ('"3","a title","a description"\n' * 5, "5 rows, fewer than the 6000 + 1600"),
])
def test_finetune_data_that_cannot_be_the_split_is_one_line_before_any_work(bm, capsys, tmp_path, content, says):
    data = tmp_path / "labelled.csv"
    if content is not None:
        data.write_text(content, encoding="utf-8")
    code, out, err = in_process(bm, capsys, "--only", "finetune", "--finetune-data", str(data))
    assert code == 2 and out == "", err
    (error,) = [line for line in err.splitlines() if "error:" in line]  # after argparse's usage lines
    assert error.startswith("python -m benchmarks.run: error: --finetune-data: ") and says in error, error
    assert str(data) in error


@pytest.fixture(scope="module")
def bm():
    """The benchmark modules as `python -m benchmarks...` imports them: from the repository root, since
    benchmarks/ is not an installed package. The path is restored after this module's tests."""
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(ROOT))
        names = ("reference_gpt", "nanogpt_char", "train_throughput", "common", "sft", "decode", "finetune",
                 "finetune_hf", "finetune_setup", "mixture", "run")
        yield SimpleNamespace(**{n: importlib.import_module(f"benchmarks.{n}") for n in names})


def test_reference_gpt_loss_at_init_is_about_ln_vocab(bm):
    """nanoGPT's init (std 0.02, tied head) makes every token about equally likely: loss ~ ln V."""
    torch.manual_seed(0)
    vocab = 512
    model = bm.reference_gpt.ReferenceGPT(vocab, 64, 2, 4, 32)
    idx, targets = torch.randint(0, vocab, (2, 4, 32)).unbind(0)  # (B, T) each, independent
    logits, loss = model(idx, targets)
    assert logits.shape == (4, 32, vocab)
    assert abs(loss.item() - math.log(vocab)) < 0.1, loss.item()
    assert model.lm_head.weight is model.wte.weight  # tied: one matrix
    proj = model.blocks[0].attn.c_proj.weight
    assert abs(proj.std().item() - 0.02 / math.sqrt(2 * 2)) < 0.002  # residual projections scaled by depth


def test_reference_gpt_is_causal(bm):
    """Changing the token at position t changes no logits before t, and the logits at t."""
    torch.manual_seed(0)
    model = bm.reference_gpt.ReferenceGPT(97, 32, 2, 4, 16).eval()
    idx = torch.randint(0, 97, (1, 16))  # (1, T)
    changed = idx.clone()
    changed[0, 9] = (idx[0, 9] + 1) % 97
    with torch.no_grad():
        before, after = model(idx)[0], model(changed)[0]  # (1, T, V) each
    torch.testing.assert_close(after[:, :9], before[:, :9], rtol=0, atol=1e-6)
    assert (after[:, 9] - before[:, 9]).abs().max() > 1e-3


def test_reference_lr_schedule_is_nanogpts(bm):
    lr = functools.partial(bm.reference_gpt.get_lr, learning_rate=1e-3, min_lr=1e-4, warmup_iters=100,
                           lr_decay_iters=2000)
    assert lr(0) == pytest.approx(1e-3 / 101)  # never 0
    assert lr(99) == pytest.approx(1e-3 * 100 / 101)
    assert lr(100) == pytest.approx(1e-3)
    assert lr(1050) == pytest.approx(1e-4 + 0.5 * 9e-4)  # half way down the cosine
    assert lr(2000) == pytest.approx(1e-4) and lr(2500) == 1e-4


def test_reference_optimizer_decays_only_matrices(bm):
    model = bm.reference_gpt.ReferenceGPT(50, 16, 1, 2, 8)
    decay, no_decay = bm.reference_gpt.configure_optimizers(model, 0.1, 1e-3, (0.9, 0.99), "cpu").param_groups
    assert decay["weight_decay"] == 0.1 and all(p.dim() >= 2 for p in decay["params"])
    assert no_decay["weight_decay"] == 0.0 and all(p.dim() < 2 for p in no_decay["params"])
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))  # tied tensor once


def test_bits_per_byte_scores_every_character_once(bm):
    """Non-overlapping windows plus a short tail: the NLL is the sum over every scored position, each
    predicted from the characters before it in its window."""
    torch.manual_seed(0)
    model = bm.reference_gpt.ReferenceGPT(11, 16, 1, 2, 8)
    stream = torch.randint(0, 11, (22,))  # one character of context, 21 to score: 2 windows of 8, a tail of 5
    score = bm.nanogpt_char.score_bits_per_byte(model, stream, scored_bytes=30, block_size=8, batch_size=1)
    with torch.no_grad():
        expected = 0.0
        for start in (0, 8, 16):
            window = stream[start:start + 9]
            logits, _ = model(window[None, :-1])  # (1, t, V)
            expected += F.cross_entropy(logits[0], window[1:], reduction="sum").item()
    assert score["chars"] == 21 and score["nll_nats"] == pytest.approx(expected, rel=1e-5)
    assert score["bits_per_byte"] == pytest.approx(expected / math.log(2) / 30, rel=1e-5)


def test_nanogpt_char_runs_end_to_end(bm, tmp_path, capsys):
    """Three iterations of the README recipe, shrunk, on a text written here: it trains, evaluates at the
    interval, and scores the validation tenth in bytes (a non-ASCII character counts 2)."""
    line = "First Citizen: Before we proceed any further, hear me speak.\nAll: Speak, speak.\n"
    text = line * 40 + "Caf\u00e9 du th\u00e9\u00e2tre.\n" * 5  # the accents land in the validation tenth
    data = tmp_path / "tiny.txt"
    data.write_text(text, encoding="utf-8")
    code = bm.nanogpt_char.main(["--data", str(data), "--max-iters", "3", "--eval-interval", "2", "--eval-iters", "2",
                                 "--block-size", "16", "--batch-size", "4", "--n-layer", "1", "--n-head", "2",
                                 "--n-embd", "32", "--warmup-iters", "1"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert out.count("train loss") == 2  # evaluations at iterations 0 and 2
    val = text[int(len(text) * 0.9):]
    match = re.search(r"validation: ([\d,]+) characters, ([\d,]+) bytes, ([\d.]+) nats/char, "
                      r"bits_per_byte ([\d.]+)", out)
    assert match, out
    chars, n_bytes, nats, bpb = (float(g.replace(",", "")) for g in match.groups())
    assert chars == len(val) and n_bytes == len(val.encode("utf-8")) > chars
    assert 0 < bpb < 8 and bpb == pytest.approx(nats * chars / math.log(2) / n_bytes, rel=1e-3)
    assert re.search(r"training: [\d.]+ s wall for 4 iterations", out)


def test_train_section_has_the_reference_gpt_case(bm, monkeypatch):
    """The CPU suite compares tfkit's step with the reference GPT at the issue's shape, with its goal: in
    fp32, and also in bf16 autocast on a CPU that multiplies bf16 natively."""
    ctx = bm.common.Context("cpu", False, False, torch.device("cpu"))
    for native, precisions in ((False, ["fp32"]), (True, ["fp32", "bf16"])):
        monkeypatch.setattr(bm.train_throughput, "native_bf16", lambda device: native)
        reference = [c for c in bm.train_throughput.cases(ctx) if c.baseline == "reference"]
        assert [case.precision for case in reference] == precisions
        for case in reference:
            cfg = case.cfg
            assert (cfg.d_model, cfg.n_layers, cfg.n_heads, cfg.vocab_size) == (256, 4, 4, 8192)
            assert (case.batch, case.seq_len) == (16, 256)
            assert case.goal_eager == bm.common.Goal(">= 1.2x reference GPT", 1.2)
        assert sum(c.baseline == "hf" for c in bm.train_throughput.cases(ctx)) == 3  # the HF rows stay


def test_reference_case_measures_both_steps(bm, monkeypatch):
    """The quick shape of the reference case through `measure`: both steps run, a row with a ratio."""
    monkeypatch.setattr(bm.train_throughput, "native_bf16", lambda device: False)
    ctx = bm.common.Context("cpu", True, False, torch.device("cpu"), clock="cpu")
    (case,) = [c for c in bm.train_throughput.cases(ctx) if c.baseline == "reference"]
    row = bm.train_throughput.measure(ctx, case, compiled=False)
    assert row.section == "train" and "reference GPT" in row.case and row.ratio > 0
    assert row.extra["tfkit_params"] == row.extra["reference_params"]  # the same model, parameter for parameter
    assert set(row.extra["samples_s"]) == {"tfkit", "reference"}


def test_sft_hf_twin_computes_tfkits_loss_with_the_document_mask(bm):
    """The SFT baseline is the same model on the same rows: the HF twin's cross-entropy with the 4D document
    mask equals tfkit's clm loss on a packed SFT batch, and without the mask it does not (conversations share
    rows, so the mask changes what each one sees)."""
    from tfkit.models import ModelConfig, build_model
    from tfkit.trainer.objectives import clm_loss

    cfg = ModelConfig(arch="gpt", vocab_size=512, d_model=64, n_layers=2, n_heads=4, max_seq_len=64,
                      positions="learned", bias=True, tie_embeddings=True).validate()
    torch.manual_seed(0)
    model = build_model(cfg).eval()
    batch = bm.sft.sft_batch(cfg, 4, 64)
    assert int(batch["doc_ids"].max()) >= 2 and (batch["labels"] != -100).any()
    twin = bm.sft.hf_twin(model).eval()
    ours = clm_loss(model, batch)
    inputs = {"input_ids": batch["input_ids"], "position_ids": batch["position_ids"]}
    with torch.no_grad():
        masked = twin(**inputs, attention_mask=bm.sft.document_mask(batch["doc_ids"])).logits  # (B, T, V)
        unmasked = twin(**inputs).logits  # (B, T, V)

    def loss(logits: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=-100)

    expected = (ours.loss_sum / ours.count).detach()
    torch.testing.assert_close(loss(masked), expected, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(loss(unmasked), expected, rtol=1e-4, atol=1e-4)


def test_sft_section_measures_both_steps(bm):
    """The quick sft section: one fp32 row, both steps timed, a positive ratio."""
    ctx = bm.common.Context("cpu", True, False, torch.device("cpu"), clock="cpu")
    (row,) = bm.sft.run(ctx)
    assert row.section == "sft" and "GPT2LMHeadModel" in row.case and row.ratio > 0
    assert set(row.extra["samples_s"]) == {"tfkit", "hf"} and 0 < row.extra["trained_fraction"] < 1


def test_the_decode_prediction_counts_every_weight_and_the_whole_cache(bm):
    """Goal 5's yardstick: a step reads the weights once and the cache of batch x context tokens; fewer KV
    heads shrink only the cache, so the predicted gain grows with the context and MQA's exceeds GQA's."""
    from tfkit.models import build_model, kv_cache_bytes_per_token

    shape = bm.decode.Shape(64, 2, 8, 512, (32, 32), 2)
    mha, gqa, mqa = (build_model(bm.decode.config(shape, kv, 2)) for kv in (8, 2, 1))
    weights = mha.num_params() * 2  # bf16
    expected = (weights + 4 * 32 * kv_cache_bytes_per_token(mha.config)) / \
        (gqa.num_params() * 2 + 4 * 32 * kv_cache_bytes_per_token(gqa.config))
    assert bm.decode.predicted_speedup(mha, gqa, 4, 32, torch.bfloat16) == pytest.approx(expected)
    gain = functools.partial(bm.decode.predicted_speedup, mha, dtype=torch.bfloat16)
    assert 1 < gain(gqa, 4, 32) < gain(gqa, 4, 320) < gain(mqa, 4, 320)


def test_a_parity_goal_passes_within_its_gap_on_either_side(bm):
    goal = bm.common.Goal("within 0.5 points of HF (mean)", 0.0, max_gap=0.5)
    row = lambda ours, theirs: bm.common.Row("finetune", "parity", "acc %", ours, theirs, goal=goal)  # noqa: E731
    assert row(90.4, 90.0).passed and row(89.6, 90.0).passed
    assert row(89.4, 90.0).passed is False and row(90.6, 90.0).passed is False  # ahead by too much is no parity


def test_the_hf_loop_draws_the_examples_tfkit_draws(bm, eval_tokenizers):
    """finetune_hf.batch_order is TaskDataset's order: per seed, the same examples in every update, across
    epochs (each example's target is its index, so the labels name the examples drawn)."""
    from tfkit.tokenization.labelled import Examples
    from tfkit.tokenization.task_batches import task_dataset
    from tfkit.tokenization.train import load_tokenizer

    items = bm.finetune_setup.synthetic_items(100)
    examples = Examples("bench", [t for _, t, _ in items], None, [float(k) for k in range(100)])
    data = task_dataset(examples, load_tokenizer(eval_tokenizers["wordpiece"]), "bert", max_len=16, seed=7,
                        regression=True, packed=True)
    order = list(bm.finetune_hf.batch_order(7, 100, 8, 30))  # 12 batches an epoch: three epochs begun
    assert [data.batch(i, 8)["labels"].long().tolist() for i in range(30)] == [idx.tolist() for idx in order]
    assert order[0].tolist() != list(bm.finetune_hf.batch_order(8, 100, 8, 1))[0].tolist()


@pytest.mark.slow  # about 6 s: the quick finetune section trains and scores a small classifier on each side
def test_finetune_section_runs_every_row_quickly(bm):
    """The quick finetune section end to end (made-up topics, a random BertModel saved by transformers and
    imported by tfkit import-hf, nothing downloaded): the two speed rows and parity with tfkit's tokens equal to
    HF's; nothing else (whether pretraining pays is experiments/finetune_pretraining.py's question)."""
    ctx = bm.common.Context("cpu", True, False, torch.device("cpu"), clock="cpu")
    rows = bm.finetune.run(ctx)
    assert not ctx.notes and [r.unit for r in rows] == ["ex/s", "ex/s", "acc %"]
    packed, padded, parity = rows
    assert packed.goal.min_ratio == 1.3 and padded.goal is None and packed.ratio > 0 and padded.ratio > 0
    assert set(packed.extra["samples_s"]) == {"packed", "padded", "hf"}
    assert parity.goal.max_gap == 0.5 and parity.extra["tokens_identical"] == 1.0
    seeds = len(bm.finetune.QUICK.seeds)
    assert all(len(parity.extra[k]) == seeds and all(0 <= a <= 1 for a in parity.extra[k]) for k in ("tfkit", "hf"))


# The experiments beside the benchmarks (experiments/, not a package of tfkit: run as `python -m experiments.NAME`
# from the repository root). Their quick modes check that each still runs; their numbers mean nothing.


@pytest.fixture(scope="module")
def ex(bm):
    """The experiment modules as `python -m experiments...` imports them (the path `bm` put first)."""
    names = ("finetune_pretraining", "gqa_experiment", "inloop_disagree")
    return SimpleNamespace(**{n: importlib.import_module(f"experiments.{n}") for n in names})


@pytest.mark.slow  # about 25 s: a plan and 4 s of pretraining, four small fine-tunings and HF's loops
def test_pretraining_experiment_runs_every_row_quickly(bm, ex, monkeypatch):
    """`python -m experiments.finetune_pretraining --quick`'s rows: a planned pretraining against its shape from
    random init on few labels (the goal, each start at its best rate) and on every label, and the raw-text paths
    with their CPU seconds."""
    fp, recipes, real = ex.finetune_pretraining, {}, ex.finetune_pretraining.run_recipe

    def recorded(env, command, name, recipe):
        out = real(env, command, name, recipe)
        recipes[name] = fp.checkpoint_record(out[0]).model if command == "pretrain" else recipe
        return out

    monkeypatch.setattr(fp, "run_recipe", recorded)
    ctx = bm.common.Context("cpu", True, False, torch.device("cpu"), clock="cpu")
    rows = fp.run(ctx)
    planned = recipes.pop("bert-planned")
    assert "planned for 4s" in rows[0].case and f"d_model {planned.d_model}, " in rows[0].case
    controls = [r["model"] for name, r in recipes.items() if name.startswith("few-random")]
    assert controls and all(m["size"] is None and (m["d_model"], m["n_layers"], m["n_heads"], m["norm_placement"]) ==
                            (planned.d_model, planned.n_layers, planned.n_heads, planned.norm_placement)
                            for m in controls)  # random init has the planned architecture, not the recipe's size
    assert not ctx.notes and [r.unit for r in rows] == ["acc %", "acc %", "acc %"]
    few, pretrained, raw = rows
    seeds = len(ex.finetune_pretraining.QUICK.seeds)
    for row, keys in ((pretrained, ("pretrained", "random")), (raw, ("tfkit", "hf"))):
        assert all(len(row.extra[k]) == seeds and all(0 <= a <= 1 for a in row.extra[k]) for k in keys), row
    for row in (few, pretrained):
        assert row.ratio == min(p / r for p, r in zip(row.extra["pretrained"], row.extra["random"]))
    assert few.goal.min_ratio == 1.0 and pretrained.goal is None  # the goal is judged where labels are few
    assert len(few.extra["pretrained"]) == seeds and set(few.extra["best_lr"]) == {"pretrained", "random"}
    assert all(len(pairs) == seeds for pairs in few.extra["every"].values())  # (held back, scored) per seed
    assert raw.extra["mlm_updates"] >= 1 and raw.extra["pretrain_cpu_s"] > 0 and raw.extra["tfkit_pretrain_cpu_s"] > 0


def test_pretraining_experiment_refuses_data_it_cannot_split_in_one_line(ex, capsys, tmp_path):
    data = tmp_path / "labelled.csv"
    data.write_text('"3","a title","a description"\n' * 5, encoding="utf-8")
    with pytest.raises(SystemExit) as stop:
        ex.finetune_pretraining.main(["--data", str(data)])
    out, err = capsys.readouterr()
    assert stop.value.code == 2 and out == ""
    assert err.splitlines()[-1].startswith("python -m experiments.finetune_pretraining: error: --data: ")
    assert "5 rows, fewer than the 6000 + 1600" in err


@pytest.mark.slow  # about a minute: a 40-step pretraining, six conversions, seven 2-step uptrainings, decoding
def test_gqa_experiment_runs_quickly(ex, tmp_path, capsys):
    """`python -m experiments.gqa_experiment --quick`: every conversion scored before and after uptraining, the
    MHA control, decoding timed for each layout, the tables printed and the JSON written where asked."""
    out = tmp_path / "gqa.json"
    assert ex.gqa_experiment.main(["--quick", "--work", str(tmp_path / "work"), "--json", str(out)]) == 0
    payload = json.loads(out.read_text())
    assert payload["quick"] is True and payload["uptrain_steps"] == 2
    expected = {"MHA", *(f"{layout} {method}" for layout in ("GQA-2", "MQA") for method in ("mean", "first", "random"))}
    assert set(payload["loss"]) == expected
    assert all(math.isfinite(r["converted"]) and math.isfinite(r["uptrained"]) for r in payload["loss"].values())
    assert all(set(case) == {"MHA", "GQA-2", "MQA"} for case in payload["decode"].values())
    assert "| GQA-2 | 2 | mean |" in capsys.readouterr().out


def test_mixture_section_measures_shares_throughput_and_memory(bm, capsys, tmp_path):
    """`python -m benchmarks.run --quick --only mixture`: the realised shares of both weight sets in the packed
    rows (deterministic: the same rows on every machine, so their verdict holds here too), the throughput
    against one source and the peak memory of two sizes, each a row with its goal."""
    out = tmp_path / "mixture.json"
    code, stdout, _ = in_process(bm, capsys, "--quick", "--only", "mixture", "--json", str(out))
    assert code == 0, stdout
    rows = json.loads(out.read_text())["rows"]
    shares = [r for r in rows if r["case"].startswith("share of")]
    assert len(shares) == 6 and all(r["passed"] for r in shares), shares
    assert {r["baseline"] for r in shares} >= {60.0, 1.0}
    rest = {r["unit"]: r for r in rows if not r["case"].startswith("share of")}
    assert set(rest) == {"tok/s", "MB"} and all(r["ratio"] > 0 for r in rest.values())
    assert rest["tok/s"]["goal"]["min_ratio"] == 0.95 and rest["MB"]["goal"]["min_ratio"] == pytest.approx(1 / 1.1)


@pytest.mark.slow  # about 25 s: two 4-update pretrainings with the probe at each validation, two 2-update fine-tunings
def test_inloop_disagree_experiment_runs_quickly(ex, tmp_path, capsys):
    """`python -m experiments.inloop_disagree --quick`: both recipes pretrained with the probe in the loop, each
    fine-tuned, the figure drawn and the table printed; a second call reuses the finished runs."""
    assert ex.inloop_disagree.main(["--quick", "--out", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    assert (tmp_path / "inloop-disagree.png").is_file() and "pretraining keep-all" in err
    assert [line.split("|")[1].strip() for line in out.splitlines()[2:]] == ["80/10/10", "keep-all"]
    assert ex.inloop_disagree.main(["--quick", "--out", str(tmp_path)]) == 0
    assert "pretraining" not in capsys.readouterr().err  # nothing trained again
