"""`trainer.run.pretrain` end to end on a tiny corpus: exact resume (in-process and after SIGKILL),
init_from, refusing to mix runs, the last good checkpoint after divergence, and metrics.jsonl."""

import json
import math
import os
import shutil
import signal
import threading
import time
import traceback
from pathlib import Path

import pytest
import torch

from tfkit.checkpoints.run_record import read_metrics
from tfkit.checkpoints.weights import load_model
from tfkit.errors import CheckpointError, ConfigError, DataError
from tfkit.tokenization.train import TokenizerSpec, train_tokenizer
from tfkit.checkpoints.folders import latest_checkpoint, list_checkpoints
from tfkit.trainer import objectives
from tfkit.trainer.loop import TrainingDiverged
from tfkit.trainer.recipe import load_recipe
from tfkit.trainer.run import pretrain
from tfkit.trainer import loop as loop_module

from helpers import MAX_STEPS, losses, weights, write_corpus, write_recipe


@pytest.fixture(scope="module")
def reference(english_text, tmp_path_factory):
    """One uninterrupted run every resume is compared with."""
    folder = tmp_path_factory.mktemp("reference")
    recipe = write_recipe(folder, english_text)
    result = pretrain(load_recipe(str(recipe)), run_dir=folder / "run")
    return recipe, folder / "run", result


def test_metrics_and_run_folder(reference):
    recipe, run_dir, result = reference
    rows = read_metrics(run_dir / "metrics.jsonl")
    train = [r for r in rows if "loss" in r]
    valid = [r for r in rows if "val_loss" in r]
    assert [r["step"] for r in train] == list(range(1, MAX_STEPS + 1))
    assert all({"step", "loss", "accuracy", "lr", "grad_norm", "tokens", "tokens_per_sec"} <= set(r) for r in train)
    assert train[-1]["tokens"] == MAX_STEPS * 8 * 32
    assert [r["step"] for r in valid] == [0, 8, 16, MAX_STEPS]  # baseline, every eval_every, final
    assert all({"val_loss", "val_accuracy", "val_ppl"} <= set(r) for r in valid)
    print("reference val loss:", [round(r["val_loss"], 3) for r in valid])
    assert valid[-1]["val_loss"] < valid[0]["val_loss"] - 0.5
    assert result.final.loss == valid[-1]["val_loss"] and not result.interrupted
    assert {"recipe.yaml", "tokenizer", "data", "checkpoints", "metrics.jsonl"} <= {p.name for p in run_dir.iterdir()}
    assert load_recipe(str(run_dir / "recipe.yaml")).train.max_steps == MAX_STEPS
    config = json.loads((run_dir / "checkpoints" / f"step-{MAX_STEPS}" / "config.json").read_text())
    assert config["objective"] == "clm" and config["step"] == MAX_STEPS and config["recipe"] == "gpt"
    assert config["train_seq_len"] == 32  # what `tfkit eval` scores at by default
    model, _ = load_model(run_dir)  # the run folder resolves to its latest checkpoint
    assert model.config.vocab_size == 400


def test_resume_in_process_is_exact(reference, tmp_path):
    recipe, ref_dir, _ = reference
    pretrain(load_recipe(str(recipe)), run_dir=tmp_path / "resumed", resume=str(ref_dir / "checkpoints" / "step-12"))
    assert not list((tmp_path / "resumed").glob("recipe-before-*"))  # the same recipe: nothing to keep
    ref, got = losses(ref_dir), losses(tmp_path / "resumed")
    later = {k: v for k, v in ref.items() if k[0] > 12}
    assert later and {k: got[k] for k in later} == later  # every later loss, bit for bit
    final = f"checkpoints/step-{MAX_STEPS}"
    a, b = weights(ref_dir / final), weights(tmp_path / "resumed" / final)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_resume_may_switch_to_fp16(reference, tmp_path):
    """An fp32 checkpoint holds no loss-scaler state; resuming it in fp16 starts a fresh scaler."""
    recipe, ref_dir, _ = reference
    result = pretrain(load_recipe(str(recipe), ["train.precision=fp16"]), run_dir=tmp_path / "fp16",
                      resume=str(ref_dir / "checkpoints" / "step-20"))
    rows = read_metrics(tmp_path / "fp16" / "metrics.jsonl")
    assert [r["step"] for r in rows if "loss" in r] == list(range(21, MAX_STEPS + 1))
    assert math.isfinite(result.final.loss)


def test_resume_keeps_the_checkpoint_tokenizer(reference, tmp_path):
    """The weights were trained on the checkpoint's token ids: a resumed run cannot change its tokenizer,
    and saying so beats ignoring the new `tokenizer.path` while recipe.yaml records it as applied."""
    recipe, ref_dir, _ = reference
    other = tmp_path / "tok"
    train_tokenizer(TokenizerSpec(vocab_size=300), ["some other text to learn from"] * 50, other,
                    show_progress=False)
    step_12 = str(ref_dir / "checkpoints" / "step-12")
    with pytest.raises(ConfigError, match=rf"tokenizer.path {other}: differs from the tokenizer of .*step-12"):
        pretrain(load_recipe(str(recipe), [f"tokenizer.path={other}"]), run_dir=tmp_path / "branch", resume=step_12)
    assert not (tmp_path / "branch").exists()
    # Naming the run's own tokenizer, or other tokenizer keys, is moot: the run goes on and records the
    # tokenizer section that trained it, with no change reported.
    own = str(ref_dir / "tokenizer")
    pretrain(load_recipe(str(recipe), [f"tokenizer.path={own}", "tokenizer.vocab_size=999", "train.max_steps=13"]),
             run_dir=tmp_path / "branch", resume=step_12)
    kept = load_recipe(str(tmp_path / "branch" / "recipe.yaml"))
    assert kept.tokenizer == load_recipe(str(recipe)).tokenizer and kept.train.max_steps == 13


def test_seq2seq_trains_on_jsonl_pairs_with_jsonl_validation_and_counts_real_tokens(english_text, tmp_path):
    """JSONL pairs for both splits (the tokenizer's held-out report reads pairs, not a `text` field);
    `tokens` counts the real source and target tokens, not the padding of each row."""
    train, _ = write_corpus(tmp_path, english_text)
    lines = [line for line in train.read_text(encoding="utf-8").splitlines() if line.strip()]
    records = [json.dumps({"en": line, "fr": " ".join(reversed(line.split()))}) + "\n" for line in lines]
    (tmp_path / "train.jsonl").write_text("".join(records[:-200]), encoding="utf-8")
    (tmp_path / "valid.jsonl").write_text("".join(records[-200:]), encoding="utf-8")
    recipe = write_recipe(tmp_path, english_text, "transformer", train={"max_steps": 3},
                          data={"train": str(tmp_path / "train.jsonl"), "valid": str(tmp_path / "valid.jsonl"),
                                "source_field": "en", "target_field": "fr"})
    result = pretrain(load_recipe(str(recipe)), run_dir=tmp_path / "run")
    assert math.isfinite(result.final.loss)
    rows = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if "loss" in r]
    assert 0 < rows[-1]["tokens"] < 3 * 8 * 2 * 32 * 0.8  # 3 steps of 8 pairs, two sides of 32: mostly padding
    config = json.loads((tmp_path / "run" / "checkpoints" / "step-3" / "config.json").read_text())
    assert config["pair_fields"] == ["en", "fr"]


def test_resume_after_sigkill_is_exact(reference, tmp_path):
    recipe, ref_dir, _ = reference
    run_dir, stopped = tmp_path / "killed", tmp_path / "at-step-10"
    pid = os.fork()  # the run to kill in a copy of this process: no new interpreter importing torch and tfkit
    if pid == 0:  # the child: it never returns into pytest
        try:
            signal.alarm(120)  # one that hangs (a lock held by a thread of the parent) ends instead
            window = loop_module.run_window

            def stop_at_10(loop, *args):  # before the window from step 10 (past step-8, its rows logged) until
                if loop.state.step >= 10:  # killed: a point of the run's own progress, so the kill lands there
                    stopped.touch()  # however fast the machine is, never after the run ended
                    threading.Event().wait()
                return window(loop, *args)

            loop_module.run_window = stop_at_10
            pretrain(load_recipe(str(recipe)), run_dir=run_dir)
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(1)
    while not stopped.exists():
        assert os.waitpid(pid, os.WNOHANG) == (0, 0), "the run ended before step 10 (its stderr is above)"
        time.sleep(0.005)
    os.kill(pid, signal.SIGKILL)  # no chance to clean up: whatever it wrote past step-8 stays
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    killed_at = latest_checkpoint(run_dir)
    assert killed_at is not None and not (run_dir / "checkpoints" / f"step-{MAX_STEPS}").exists()
    print("killed after", killed_at.name, "metrics rows:", len(read_metrics(run_dir / "metrics.jsonl")))
    pretrain(load_recipe(str(recipe)), run_dir=run_dir, resume="auto")
    assert losses(run_dir) == losses(ref_dir)  # rows of the killed run past its checkpoint were replaced
    final = f"checkpoints/step-{MAX_STEPS}"
    a, b = weights(ref_dir / final), weights(run_dir / final)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_fresh_start_into_a_run_folder_with_checkpoints_is_refused(reference):
    recipe, ref_dir, _ = reference
    with pytest.raises(CheckpointError, match="already holds checkpoints; pass resume auto"):
        pretrain(load_recipe(str(recipe)), run_dir=ref_dir)


def test_resume_auto_of_a_finished_run_only_evaluates(reference):
    recipe, ref_dir, _ = reference
    before = weights(ref_dir / f"checkpoints/step-{MAX_STEPS}")
    rows = read_metrics(ref_dir / "metrics.jsonl")
    result = pretrain(load_recipe(str(recipe)), run_dir=ref_dir, resume="auto")
    assert result.state.step == MAX_STEPS and result.final is not None
    after = weights(ref_dir / f"checkpoints/step-{MAX_STEPS}")
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert read_metrics(ref_dir / "metrics.jsonl") == rows  # the final validation row is not logged twice


def _copy_run(reference, tmp_path) -> tuple[Path, Path]:
    recipe, ref_dir, _ = reference
    run_dir = tmp_path / "run"
    shutil.copytree(ref_dir, run_dir)
    return recipe, run_dir


def test_resuming_an_older_step_into_its_own_run_folder_is_refused(reference, tmp_path):
    """Resuming step-12 of a run that reached step-24 would overwrite step-24: branch into a new folder."""
    recipe, run_dir = _copy_run(reference, tmp_path)
    before = weights(run_dir / f"checkpoints/step-{MAX_STEPS}")
    with pytest.raises(CheckpointError, match=r"holds later checkpoints \(step-16, step-20, step-24\).*run_dir"):
        pretrain(load_recipe(str(recipe)), resume=str(run_dir / "checkpoints" / "step-12"))
    with pytest.raises(CheckpointError, match="checkpoints of another run"):
        pretrain(load_recipe(str(recipe)), run_dir=run_dir, resume=str(reference[1] / "checkpoints" / "step-24"))
    after = weights(run_dir / f"checkpoints/step-{MAX_STEPS}")
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_a_failed_resume_leaves_recipe_yaml_alone_and_a_changed_one_is_reported(reference, tmp_path, capsys):
    recipe, run_dir = _copy_run(reference, tmp_path)
    saved = (run_dir / "recipe.yaml").read_text()
    with pytest.raises(ConfigError, match="model.n_layers is 3 but the checkpoint has 2"):
        pretrain(load_recipe(str(recipe), ["model.n_layers=3"]), run_dir=run_dir, resume="auto")
    with pytest.raises(DataError, match="no such file"):  # a failure after the model checks, in the data
        pretrain(load_recipe(str(recipe), [f"data.train={tmp_path / 'gone.txt'}"]), run_dir=run_dir, resume="auto")
    assert (run_dir / "recipe.yaml").read_text() == saved
    assert not list(run_dir.glob("recipe-before-*"))
    for lr in ("0.001", "0.0005"):  # two resumes from the same step: the first saved recipe is the one kept
        pretrain(load_recipe(str(recipe), [f"train.max_steps={MAX_STEPS}", f"optim.lr={lr}"]), run_dir=run_dir,
                 resume="auto")
    out = " ".join(capsys.readouterr().out.split())
    assert f"the recipe changed since step {MAX_STEPS}" in out and "optim.lr: 0.003 -> 0.001" in out
    assert "optim.lr: 0.001 -> 0.0005" in out
    assert (run_dir / f"recipe-before-step-{MAX_STEPS}.yaml").read_text() == saved
    assert load_recipe(str(run_dir / "recipe.yaml")).optim.lr == 0.0005


def test_a_folder_tfkit_did_not_make_is_refused_as_run_folder(reference, tmp_path):
    """A hand-written recipe.yaml is never overwritten; a fresh start needs an empty or tfkit-made folder."""
    recipe = reference[0]
    mine = tmp_path / "exp"
    mine.mkdir()
    (mine / "recipe.yaml").write_text(recipe.read_text())
    with pytest.raises(CheckpointError, match="recipe.yaml was not written by tfkit pretrain"):
        pretrain(load_recipe(str(mine / "recipe.yaml")), run_dir=mine)
    assert (mine / "recipe.yaml").read_text() == recipe.read_text() and len(list(mine.iterdir())) == 1
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "todo.txt").write_text("keep me")
    with pytest.raises(CheckpointError, match=r"holds files a tfkit run does not make \(todo.txt\)"):
        pretrain(load_recipe(str(recipe)), run_dir=notes)
    (tmp_path / "afile").write_text("x")
    with pytest.raises(CheckpointError, match="exists and is not a folder"):
        pretrain(load_recipe(str(recipe)), run_dir=tmp_path / "afile")


def test_init_from_starts_a_new_run_from_the_checkpoint_weights(reference, tmp_path):
    recipe, ref_dir, ref_result = reference
    source = str(ref_dir / "checkpoints" / f"step-{MAX_STEPS}")
    overrides = [f"train.init_from={source}", "train.max_steps=4", "model.dropout=0.0", "tokenizer.vocab_size=300"]
    result = pretrain(load_recipe(str(recipe), overrides), run_dir=tmp_path / "init")
    rows = read_metrics(tmp_path / "init" / "metrics.jsonl")
    assert rows[0]["step"] == 0 and rows[0]["val_loss"] == pytest.approx(ref_result.final.loss, abs=1e-6)
    assert result.state.step == 4  # a new run: the step restarts
    config = json.loads((tmp_path / "init" / "checkpoints" / "step-4" / "config.json").read_text())
    assert (config["step"], config["prior_steps"]) == (4, MAX_STEPS)  # eval shows MAX_STEPS+4
    assert (tmp_path / "init" / "tokenizer" / "tokenizer.json").read_bytes() == \
        (ref_dir / "tokenizer" / "tokenizer.json").read_bytes()  # the checkpoint's tokenizer, not a new one
    with pytest.raises(ConfigError, match=r"model\.d_model is 64 but the checkpoint has 32.*model\.n_layers"):
        pretrain(load_recipe(str(recipe), [f"train.init_from={source}", "model.d_model=64", "model.n_layers=3"]),
                 run_dir=tmp_path / "conflict")
    assert not (tmp_path / "conflict").exists()  # refused before the run folder (and its tokenizer) was made


def test_divergence_stops_the_run_and_keeps_the_last_good_checkpoint(english_text, tmp_path, monkeypatch):
    recipe = write_recipe(tmp_path, english_text, train={"max_steps": 20, "max_bad_steps": 3, "eval_every": 100})
    original, calls = objectives.compute_loss, [0]

    def nan_after_six(model, batch, objective):
        out = original(model, batch, objective)
        if model.training:
            calls[0] += 1
            if calls[0] > 6:
                out.loss_sum = out.loss_sum * float("inf")
        return out

    monkeypatch.setattr(objectives, "compute_loss", nan_after_six)
    with pytest.raises(TrainingDiverged, match=r"3 updates in a row.*at step 6.*checkpoints/step-4"):
        pretrain(load_recipe(str(recipe)), run_dir=tmp_path / "run")
    assert [s for s, _ in list_checkpoints(tmp_path / "run")] == [4]
    model, _ = load_model(tmp_path / "run")
    assert all(torch.isfinite(p).all() for p in model.parameters())
    skipped = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if r.get("skipped")]
    assert [r["step"] for r in skipped] == [7, 7, 7]


def test_sigterm_saves_a_checkpoint_and_resume_is_exact(reference, tmp_path, monkeypatch):
    from tfkit.trainer import validation

    recipe, ref_dir, _ = reference
    original, calls = validation.validate, [0]

    def terminate_at_step_8(*args, **kwargs):
        calls[0] += 1
        if calls[0] == 2:  # validations run at steps 0, 8, 16, ...
            os.kill(os.getpid(), signal.SIGTERM)
        return original(*args, **kwargs)

    monkeypatch.setattr(validation, "validate", terminate_at_step_8)
    result = pretrain(load_recipe(str(recipe)), run_dir=tmp_path / "run")
    assert result.interrupted == signal.SIGTERM and result.final is None
    assert result.state.step == 8 and latest_checkpoint(tmp_path / "run").name == "step-8"
    monkeypatch.undo()
    pretrain(load_recipe(str(recipe)), run_dir=tmp_path / "run", resume="auto")
    assert losses(tmp_path / "run") == losses(ref_dir)


@pytest.mark.parametrize("arch", ["bert", "transformer"])
def test_other_objectives_train_and_checkpoint(arch, english_text, tmp_path):
    recipe = write_recipe(tmp_path, english_text, arch, train={"max_steps": 3, "eval_every": 100},
                          objective={"label_smoothing": 0.1} if arch == "transformer" else {})
    result = pretrain(load_recipe(str(recipe)), run_dir=tmp_path / "run")
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in rows if "loss" in r] == [1, 2, 3]
    assert 0 < result.final.loss < 10 and result.final.tokens > 0
    model, cfg = load_model(tmp_path / "run")
    assert cfg.arch == arch


def test_a_given_tokenizer_without_a_mask_token_is_named_for_mlm(english_text, tmp_path):
    from tfkit.tokenization.train import TokenizerSpec, train_tokenizer

    train_tokenizer(TokenizerSpec(kind="bpe", vocab_size=300), ["plain text " * 200], tmp_path / "bpe",
                    show_progress=False)
    recipe = write_recipe(tmp_path, english_text, "bert", tokenizer={"path": str(tmp_path / "bpe")})
    with pytest.raises(ConfigError, match=r"tokenizer.path .*bpe: a bpe tokenizer without a mask token, which "
                                          r"objective mlm needs; train one with .*--special-token '<\|mask\|>'"):
        pretrain(load_recipe(str(recipe)), run_dir=tmp_path / "run")


def test_a_branch_with_changed_keys_keeps_the_recipe_of_its_first_steps(reference, tmp_path, capsys):
    """Resuming step-12 into a new folder with another learning rate: the new folder says how its first
    12 steps were trained (the source run's recipe) and the change is reported."""
    recipe, ref_dir, _ = reference
    pretrain(load_recipe(str(recipe), ["train.max_steps=14", "optim.lr=0.001"]), run_dir=tmp_path / "branch",
             resume=str(ref_dir / "checkpoints" / "step-12"))
    out = " ".join(capsys.readouterr().out.split())
    assert "the recipe changed since step 12" in out and "optim.lr: 0.003 -> 0.001" in out
    assert (tmp_path / "branch" / "recipe-before-step-12.yaml").read_text() == (ref_dir / "recipe.yaml").read_text()
