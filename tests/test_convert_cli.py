"""`tfkit convert-mqa-to-gqa` end to end on tiny checkpoints with a tokenizer trained in the test."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from tfkit.checkpoints.weights import load_model, save_model
from tfkit.cli.main import app
from tfkit.errors import TfkitError
from tfkit.models import ModelConfig, build_model
from tfkit.tokenization import TokenizerSpec, load_tokenizer, train_tokenizer


def invoke(args: list[str]):
    return CliRunner().invoke(app, ["convert-mqa-to-gqa", *args])


def assert_user_error(result, *needles: str) -> None:
    """Exit 2 with one line naming the problem (real app), or the TfkitError itself (bare app)."""
    if isinstance(result.exception, TfkitError):
        message = str(result.exception)
    else:
        assert result.exit_code == 2, result.output
        message = result.stderr
        assert message.count("\n") <= 1 and result.stdout == ""
    for needle in needles:
        assert needle in message, message


@pytest.fixture(scope="module")
def run_folder(english_text: str, tmp_path_factory) -> Path:
    """A run folder holding checkpoints/step-9/: a GPT with 4 query and 2 key/value heads, non-zero biases.
    Its tokenizer is trained on 60 kB of English, also written beside the run as corpus.txt for --eval-data."""
    tmp = tmp_path_factory.mktemp("convert")
    text = english_text[:60_000]
    (tmp / "corpus.txt").write_text(text, encoding="utf-8")
    train_tokenizer(TokenizerSpec(kind="bpe", vocab_size=300), [text], tmp / "tok", show_progress=False)
    tok = load_tokenizer(tmp / "tok")
    torch.manual_seed(0)
    model = build_model(ModelConfig(vocab_size=tok.vocab_size, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2,
                                    max_seq_len=64, init_std=0.2))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.normal_(0.0, 0.1)
    folder = tmp / "run" / "checkpoints" / "step-9"
    save_model(model, folder, objective="clm", recipe="gpt-tiny", step=9)
    tok.save(folder)
    return tmp / "run"


def ids() -> torch.Tensor:
    return torch.randint(0, 300, (2, 16), generator=torch.Generator().manual_seed(0))  # (B, T)


def test_writes_a_complete_loadable_checkpoint_with_provenance(run_folder: Path, tmp_path: Path) -> None:
    source = run_folder / "checkpoints" / "step-9"
    out = tmp_path / "mha"
    result = invoke([str(run_folder), "--kv-heads", "4", "--out", str(out)])  # growing: exact replication
    assert result.exit_code == 0, result.output
    assert {"model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json"} <= {p.name for p in out.iterdir()}
    config = json.loads((out / "config.json").read_text())
    assert config["model"]["n_kv_heads"] is None  # 4 of 4 = MHA
    assert config["converted_from"] == str(source.resolve()) and config["method"] == "mean"
    assert config["objective"] == "clm" and "step" not in config
    assert config["prior_steps"] == 9  # the updates behind the weights it carries: eval shows 9+0
    before, _ = load_model(source)
    after, cfg = load_model(out)
    assert cfg.kv_heads == 4
    with torch.no_grad():
        torch.testing.assert_close(after(ids()), before(ids()), rtol=1e-5, atol=1e-5)
    assert load_tokenizer(out).encode("First Citizen") == load_tokenizer(source).encode("First Citizen")
    for needle in ("2 (GQA-2)", "4 (MHA)", "attention parameters", "6,336", "8,448"):
        assert needle in result.stdout, result.stdout
    row = next(line for line in result.stdout.splitlines() if "KV-cache bytes / token" in line)
    assert row.replace("│", " ").split()[-2:] == ["128", "256"]  # K and V * 2 layers * kv heads * 8 dims * 2 bytes


def test_mqa_with_each_method(run_folder: Path, tmp_path: Path) -> None:
    outs = {}
    for method in ("mean", "first", "random"):
        outs[method] = tmp_path / method
        result = invoke([str(run_folder), "-g", "1", "-o", str(outs[method]), "--method", method, "--seed", "5"])
        assert result.exit_code == 0, result.output
        assert "1 (MQA)" in result.stdout
        assert "--set model.n_kv_heads=1" in result.stdout  # the uptraining recipe's default is 2
    weights = {m: load_model(o)[0].state_dict()["blocks.0.attn.k_proj.weight"] for m, o in outs.items()}
    assert weights["mean"].shape == (8, 32)
    assert not torch.equal(weights["mean"], weights["first"]) and not torch.equal(weights["first"], weights["random"])
    assert json.loads((outs["random"] / "config.json").read_text())["seed"] == 5


def test_eval_data_reports_the_loss_before_and_after(run_folder: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("TFKIT_CACHE", str(tmp_path / "cache"))
    data = str(run_folder.parent / "corpus.txt")
    result = invoke([str(run_folder), "-g", "4", "-o", str(tmp_path / "mha"), "--eval-data", data,
                     "--eval-tokens", "2000"])
    assert result.exit_code == 0, result.output
    row = next(line for line in result.stdout.splitlines() if "validation loss" in line)
    before, after = (float(x) for x in row.replace("│", " ").split()[-2:])
    assert before == pytest.approx(after, abs=1e-4) and before > 1.0  # replication keeps the function
    result = invoke([str(run_folder), "-g", "1", "-o", str(tmp_path / "mqa"), "--eval-data", data,
                     "--eval-tokens", "2000"])
    row = next(line for line in result.stdout.splitlines() if "validation loss" in line)
    before, after = (float(x) for x in row.replace("│", " ").split()[-2:])
    assert before != after  # pooling changes the function


def test_never_overwrites_the_input_or_an_existing_folder(run_folder: Path, tmp_path: Path) -> None:
    source = run_folder / "checkpoints" / "step-9"
    snapshot = {p.name: p.read_bytes() for p in source.iterdir()}
    out = tmp_path / "out"
    assert invoke([str(run_folder), "-g", "1", "-o", str(out)]).exit_code == 0
    stamp = (out / "model.safetensors").read_bytes()
    assert_user_error(invoke([str(run_folder), "-g", "2", "-o", str(out)]), "--out", "--force")
    assert (out / "model.safetensors").read_bytes() == stamp
    assert invoke([str(run_folder), "-g", "2", "-o", str(out), "--force"]).exit_code == 0
    assert json.loads((out / "config.json").read_text())["model"]["n_kv_heads"] == 2
    for target in (source, run_folder, source / "gqa"):  # the input, its run folder, inside the checkpoint
        assert_user_error(invoke([str(run_folder), "-g", "1", "-o", str(target), "--force"]), "--out", "input")
    assert {p.name: p.read_bytes() for p in source.iterdir()} == snapshot
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary folder left behind


def test_force_never_replaces_a_training_checkpoint_or_a_foreign_model(run_folder: Path, tmp_path: Path) -> None:
    """--force replaces an earlier conversion only: a training checkpoint (trainer_state.pt), a HuggingFace
    folder and a config.json tfkit did not write are kept, each named for what it is."""
    source = run_folder / "checkpoints" / "step-9"
    trained, hf, other = tmp_path / "step-30", tmp_path / "hf", tmp_path / "other"
    for folder, config in ((trained, None), (hf, {"model_type": "gpt2", "transformers_version": "5.0"}),
                           (other, {"name": "mine"})):
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(config) if config else (source / "config.json").read_text())
        (folder / "model.safetensors").write_bytes(b"weights")
    (trained / "trainer_state.pt").write_bytes(b"optimizer state")
    for folder, what in ((trained, "a training checkpoint (it has trainer_state.pt)"),
                         (hf, "a HuggingFace model folder"), (other, "a folder whose config.json tfkit did not write")):
        before = {p.name: p.read_bytes() for p in folder.iterdir()}
        assert_user_error(invoke([str(run_folder), "-g", "1", "-o", str(folder), "--force"]),
                          f"--out {folder}: exists and is {what}", "--force replaces only a tfkit model folder")
        assert {p.name: p.read_bytes() for p in folder.iterdir()} == before


def test_out_inside_a_runs_checkpoints_folder_is_refused(run_folder: Path, tmp_path: Path) -> None:
    """A converted model written as <run>/checkpoints/step-999 would become what `tfkit eval <run>` reads
    as the run's latest checkpoint."""
    inside = run_folder / "checkpoints" / "step-999"
    for force in ([], ["--force"]):
        assert_user_error(invoke([str(run_folder / "checkpoints" / "step-9"), "-g", "1", "-o", str(inside), *force]),
                          f"--out {inside}: lies in the checkpoints folder of the training run {run_folder.resolve()}")
    assert not inside.exists()
    assert sorted(p.name for p in (run_folder / "checkpoints").iterdir()) == ["step-9"]


def test_eval_data_too_short_names_no_option_convert_lacks(run_folder: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("TFKIT_CACHE", str(tmp_path / "cache"))
    (tmp_path / "short.txt").write_text("All: Speak, speak.\n", encoding="utf-8")
    out = tmp_path / "never"
    result = invoke([str(run_folder), "-g", "1", "-o", str(out), "--eval-data", str(tmp_path / "short.txt")])
    assert_user_error(result, f"--eval-data {tmp_path / 'short.txt'}: too little text to score one sequence of 64 "
                      "tokens", "give more text")
    assert "--seq-len" not in result.output and "--batch-size" not in result.output
    assert not out.exists()


def test_impossible_head_counts_are_one_line_errors(run_folder: Path, tmp_path: Path) -> None:
    out = tmp_path / "never"
    assert_user_error(invoke([str(run_folder), "-g", "3", "-o", str(out)]), "--kv-heads 3", "4 query heads")
    assert_user_error(invoke([str(run_folder), "-g", "0", "-o", str(out)]), "--kv-heads")
    assert_user_error(invoke([str(run_folder), "-g", "2", "-o", str(out), "--method", "max"]), "--method")
    assert_user_error(invoke([str(tmp_path / "missing"), "-g", "2", "-o", str(out)]), "missing")
    assert not out.exists()


def test_uptrain_command_needs_no_override_for_gpt_tiny_with_two_kv_heads() -> None:
    from tfkit.cli.convert import uptrain_command
    from tfkit.trainer.recipe import load_recipe

    cfg = load_recipe("gpt-tiny").model.config(4096)
    assert uptrain_command(Path("ckpt"), ModelConfig(**{**cfg.to_dict(), "n_kv_heads": 2})) == \
        "tfkit pretrain gqa-uptrain --set train.init_from=ckpt"
    bert = ModelConfig(arch="bert", vocab_size=4096, d_model=128, n_layers=2, n_heads=4, n_kv_heads=1, max_seq_len=256)
    command = uptrain_command(Path("ckpt"), bert)
    assert "--set model.arch=bert" in command and "--set objective.name=mlm" in command
    assert "--set model.n_kv_heads=1" in command


@pytest.mark.parametrize(("source_steps", "up_steps"), [(41, 2), (300, 15), (20_000, 1000)])
def test_the_uptrain_command_trains_five_percent_of_the_source_steps(source_steps: int, up_steps: int) -> None:
    from tfkit.cli.convert import uptrain_command
    from tfkit.trainer.recipe import load_recipe

    cfg = ModelConfig(**{**load_recipe("gpt-tiny").model.config(4096).to_dict(), "n_kv_heads": 2})
    command = uptrain_command(Path("ckpt"), cfg, source_steps)
    overrides = command.split(" --set ")[1:]
    recipe = load_recipe("gqa-uptrain", overrides)  # what the user pastes is a valid recipe
    assert recipe.train.max_steps == up_steps
    assert recipe.train.save_every == up_steps and recipe.schedule.warmup_steps < up_steps
    if source_steps == 300:  # gpt-tiny's own 300 steps: the recipe as written
        assert overrides == ["train.init_from=ckpt"]


def test_the_printed_uptrain_command_follows_the_source_run(run_folder: Path, tmp_path: Path) -> None:
    result = invoke([str(run_folder), "-g", "1", "-o", str(tmp_path / "mqa")])
    assert result.exit_code == 0, result.output
    assert "--set train.max_steps=1 " in result.stdout  # 5% of its 9 steps, at least one
    assert "--set schedule.warmup_steps=0" in result.stdout  # the recipe's 2 would not fit


def test_a_checkpoint_without_tokenizer_converts_with_a_warning(run_folder: Path, tmp_path: Path) -> None:
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("model.safetensors", "config.json"):
        (bare / name).write_bytes((run_folder / "checkpoints" / "step-9" / name).read_bytes())
    result = invoke([str(bare), "-g", "1", "-o", str(tmp_path / "mqa")])
    assert result.exit_code == 0, result.output
    warning = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert len(warning) == 1 and "no tokenizer.json" in warning[0] and "tfkit generate" in warning[0]
    assert "warning" not in result.stdout and not (tmp_path / "mqa" / "tokenizer.json").exists()
    assert_user_error(invoke([str(bare), "-g", "1", "-o", str(tmp_path / "again"), "--eval-data", "x.txt"]),
                      "--eval-data", "no tokenizer.json")
    assert not (tmp_path / "again").exists()
    with_tokenizer = invoke([str(run_folder), "-g", "1", "-o", str(tmp_path / "ok")])
    assert "warning" not in with_tokenizer.stderr


def test_out_under_a_regular_file_is_one_line(run_folder: Path, tmp_path: Path) -> None:
    afile = tmp_path / "afile"
    afile.write_text("mine")
    assert_user_error(invoke([str(run_folder), "-g", "1", "-o", str(afile / "sub")]), str(afile), "not a folder")
    assert afile.read_text() == "mine"


def test_eval_data_that_cannot_be_scored_fails_before_out_is_written(run_folder: Path, tmp_path: Path) -> None:
    out = tmp_path / "never"
    result = invoke([str(run_folder), "-g", "1", "-o", str(out), "--eval-data", str(tmp_path / "nope.txt")])
    assert_user_error(result, "nope.txt")
    assert not out.exists()


def test_eval_counts_the_updates_behind_converted_and_uptrained_weights(run_folder: Path, tmp_path: Path) -> None:
    from tfkit.cli.evaluate import steps_text
    from tfkit.trainer.run import prior_steps

    out = tmp_path / "gqa"
    assert invoke([str(run_folder), "--kv-heads", "2", "--out", str(out)]).exit_code == 0
    assert prior_steps(out, resumed=False) == 9  # an uptraining run from it starts 9 updates in
    uptrained = tmp_path / "uptrained" / "checkpoints" / "step-3"
    model, _ = load_model(out)
    save_model(model, uptrained, step=3, prior_steps=9, objective="clm")
    load_tokenizer(out).save(uptrained)
    assert prior_steps(uptrained, resumed=True) == 9  # resuming the uptraining keeps counting its own steps
    assert prior_steps(uptrained, resumed=False) == 12  # and a run initialised from it starts after all 12
    result = CliRunner().invoke(app, ["eval", str(run_folder), str(out), str(uptrained),
                                      "--data", str(run_folder.parent / "corpus.txt"), "--max-tokens", "256"])
    assert result.exit_code == 0, result.output
    cells = [[c.strip() for c in line.split("│")] for line in result.stdout.splitlines() if line.count("│") > 5]
    steps = [row[3] for row in cells if row[1] and row[1] != "checkpoint"]
    assert steps == ["9", "9+0", "9+3"], result.stdout
    assert (steps_text(None, 0), steps_text(300, 0), steps_text(15, 300)) == ("-", "300", "300+15")
