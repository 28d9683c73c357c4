"""Downstream scores in the training loop (`eval.tasks`, `eval.probe`, `eval.best_by`): the score a run logs at
update N equals `tfkit eval --task` / `--probe` on the checkpoint it wrote at N, exactly, for a GPT and a BERT;
keep_best by a task score keeps the right checkpoint; a resume continues the task rows as one run would have;
bad input is refused in one line before any training."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tfkit.checkpoints.run_record import read_metrics
from tfkit.cli.main import app

from helpers import one_error_line, write_recipe

ITEMS = [{"context": "Return the", "choices": ["sum of the values.", "zebra of the river."], "gold": 0},
         {"context": "Raise ValueError if", "choices": ["the value is negative.", "purple sings."], "gold": 0},
         {"context": "The name of the", "choices": ["file", "module to import", "dog"], "gold": 1},
         {"context": "If", "choices": ["true, return the list of names.", "x"], "gold": 0}] * 3
FAST = {"eval_every": 2, "save_every": 2, "max_steps": 4, "log_every": 2}


def task_file(folder: Path, items=ITEMS, name: str = "choice.jsonl") -> Path:
    path = folder / name
    path.write_text("".join(json.dumps(item) + "\n" for item in items), encoding="utf-8")
    return path


def run(recipe: Path, run_dir: Path, *sets: str):
    return CliRunner().invoke(app, ["pretrain", str(recipe), "--run-dir", str(run_dir),
                                    *[a for s in sets for a in ("--set", s)]])


def offline(args: list[str], out: Path) -> dict:
    result = CliRunner().invoke(app, ["eval", *args, "--json", str(out)])
    assert result.exit_code == 0, result.output
    return json.loads(out.read_text())[0]


def validation_rows(run_dir: Path) -> dict[int, dict]:
    return {r["step"]: r for r in read_metrics(run_dir / "metrics.jsonl") if "val_loss" in r}


def test_a_gpt_logs_at_each_validation_what_tfkit_eval_scores_on_that_checkpoint(english_text, tmp_path):
    tasks = task_file(tmp_path)
    recipe = write_recipe(tmp_path, english_text, "gpt", train={**FAST, "keep_last": 5},
                          eval={"tasks": [str(tasks), "stdlib:docs-cloze"], "probe": "stdlib:topics"})
    done = run(recipe, tmp_path / "run")
    assert done.exit_code == 0, done.output
    assert "eval: task docs-cloze (cloze, 554 items)" in done.output
    rows = validation_rows(tmp_path / "run")
    assert sorted(rows) == [0, 2, 4]
    assert {"task/choice/acc", "task/choice/acc_norm", "task/docs-cloze/acc", "task/docs-cloze/perplexity",
            "task/probe-topics/acc", "tokens"} <= set(rows[4])
    assert rows[4]["tokens"] == 4 * 8 * 32  # updates x batch x seq_len: the x axis of the task curves
    for step in (2, 4):
        checkpoint = str(tmp_path / "run" / "checkpoints" / f"step-{step}")
        choice = offline([checkpoint, "--task", str(tasks)], tmp_path / "a.json")
        cloze = offline([checkpoint, "--task", "stdlib:docs-cloze"], tmp_path / "b.json")
        probe = offline([checkpoint, "--probe", "stdlib:topics"], tmp_path / "c.json")
        row = rows[step]
        assert (row["task/choice/acc"], row["task/choice/acc_norm"]) == (choice["acc"], choice["acc_norm"])
        assert (row["task/docs-cloze/acc"], row["task/docs-cloze/perplexity"]) == (cloze["acc"], cloze["perplexity"])
        assert row["task/probe-topics/acc"] == probe["acc"]
    assert "choice acc_norm" in done.output and "docs-cloze perplexity" in done.output  # the final table


def test_a_bert_probe_in_the_loop_equals_the_probe_fitted_offline(english_text, tmp_path):
    labelled = tmp_path / "labelled.csv"  # a file of the user's own, columns named in the recipe
    lines = ["sentence,topic"] + [f"{text.replace(',', ' ')},{topic}" for topic, text in
                                  [("io", "read the file and return its bytes"), ("net", "open a socket to the host"),
                                   ("io", "write the buffer to disk"), ("net", "send the request over http")] * 15]
    labelled.write_text("\n".join(lines) + "\n", encoding="utf-8")
    probe = {"data": str(labelled), "text": "sentence", "label": "topic"}
    recipe = write_recipe(tmp_path, english_text, "bert", train=FAST, eval={"probe": probe})
    done = run(recipe, tmp_path / "run")
    assert done.exit_code == 0, done.output
    rows = validation_rows(tmp_path / "run")
    for step in (2, 4):
        checkpoint = str(tmp_path / "run" / "checkpoints" / f"step-{step}")
        spec = json.dumps(probe)  # JSON is YAML: the flag takes the recipe key's mapping
        fitted = offline([checkpoint, "--probe", spec], tmp_path / "p.json")
        assert rows[step]["task/probe-labelled/acc"] == fitted["acc"]


def test_the_probe_fit_is_scikit_learns_ridge_classifier():
    """The oracle of the closed-form fit: RidgeClassifier(alpha=1) on the same standardised features."""
    import torch
    from sklearn.linear_model import RidgeClassifier

    from tfkit.evaluation.probe import fit_and_score

    gen = torch.Generator().manual_seed(0)
    centres = torch.randn(3, 16, generator=gen, dtype=torch.float64)
    y, y_valid = torch.randint(0, 3, (120,), generator=gen), torch.randint(0, 3, (60,), generator=gen)
    x = centres[y] + 1.5 * torch.randn(120, 16, generator=gen, dtype=torch.float64)
    x_valid = centres[y_valid] + 1.5 * torch.randn(60, 16, generator=gen, dtype=torch.float64)
    mean, std = x.mean(0), x.std(0)
    oracle = RidgeClassifier(alpha=1.0).fit(((x - mean) / std).numpy(), y.numpy())
    expected = float((oracle.predict(((x_valid - mean) / std).numpy()) == y_valid.numpy()).mean())
    assert fit_and_score(x, y, x_valid, y_valid, 3) == expected
    assert 0.5 < expected < 1.0  # a task the probe neither fails nor trivially solves


def test_keep_best_by_a_task_score_keeps_the_checkpoint_of_the_highest_score(english_text, tmp_path):
    recipe = write_recipe(tmp_path, english_text, "gpt", train={**FAST, "eval_every": 1, "max_steps": 6,
                                                                "keep_best": True},
                          optim={"lr": 3e-2}, model={"max_seq_len": 128},
                          eval={"tasks": ["stdlib:docs-choice"], "task_limit": 60,
                                                    "best_by": "task:docs-choice/acc_norm"})
    done = run(recipe, tmp_path / "run")
    assert done.exit_code == 0, done.output
    rows = validation_rows(tmp_path / "run")
    scores = {step: row["task/docs-choice/acc_norm"] for step, row in rows.items() if step > 0}
    best = max(scores, key=lambda s: (scores[s], -s))  # the first of the highest: a tie keeps the earlier
    kept = json.loads((tmp_path / "run" / "best" / "config.json").read_text())
    assert (kept["step"], kept["val_loss"]) == (best, -scores[best])
    assert f"step {best}, the highest docs-choice acc_norm" in " ".join(done.output.split())
    assert len(set(scores.values())) > 1  # the scores moved, so the choice was a real one


def test_a_resumed_run_continues_the_task_rows_as_one_run_would_have(english_text, tmp_path):
    tasks = task_file(tmp_path)
    recipe = write_recipe(tmp_path, english_text, "gpt", train={**FAST, "max_steps": 8},
                          schedule={"name": "constant", "warmup_steps": 0},  # the lr does not depend on max_steps
                          eval={"tasks": [str(tasks)], "probe": "stdlib:topics"})
    assert run(recipe, tmp_path / "whole").exit_code == 0
    assert run(recipe, tmp_path / "split", "train.max_steps=4").exit_code == 0
    resumed = CliRunner().invoke(app, ["pretrain", str(tmp_path / "split" / "recipe.yaml"), "--resume", "auto",
                                       "--run-dir", str(tmp_path / "split"), "--set", "train.max_steps=8"])
    assert resumed.exit_code == 0, resumed.output
    whole, split = validation_rows(tmp_path / "whole"), validation_rows(tmp_path / "split")
    assert sorted(split) == sorted(whole) == [0, 2, 4, 6, 8]
    keys = ("task/choice/acc", "task/choice/acc_norm", "task/probe-topics/acc", "tokens")
    assert [[split[s][k] for k in keys] for s in split] == [[whole[s][k] for k in keys] for s in whole]


def test_eval_task_every_scores_at_its_multiples_the_baseline_and_the_end(english_text, tmp_path):
    tasks = task_file(tmp_path)
    recipe = write_recipe(tmp_path, english_text, "gpt", train={**FAST, "eval_every": 1, "max_steps": 5},
                          eval={"tasks": [str(tasks)], "task_every": 2})
    assert run(recipe, tmp_path / "run").exit_code == 0
    rows = validation_rows(tmp_path / "run")
    assert sorted(rows) == [0, 1, 2, 3, 4, 5]
    assert [s for s, r in sorted(rows.items()) if "task/choice/acc" in r] == [0, 2, 4, 5]


class FakeTask:
    """An lm-evaluation-harness multiple-choice task as its API shows one (doc_to_text / choice / target)."""
    OUTPUT_TYPE = "multiple_choice"
    eval_docs = [{"q": "The sky is", "options": ["blue", "loud"], "answer": 0},
                 {"q": "Fire is", "options": ["cold", "hot"], "answer": "hot"}]

    def doc_to_text(self, doc):
        return doc["q"]

    def doc_to_choice(self, doc):
        return doc["options"]

    def doc_to_target(self, doc):
        return doc["answer"]


@pytest.fixture
def fake_lm_eval(monkeypatch):
    """lm_eval.tasks with one task in its cache (`cached`) and none other: the real harness would read the
    network or a user's cache, which a test has neither of."""
    import sys
    import types

    module = types.ModuleType("lm_eval.tasks")
    module.TaskManager = lambda: None

    def get_task_dict(names, manager):
        if names != ["cached"]:
            raise ConnectionError(f"Couldn't reach '{names[0]}' on the Hub (OfflineModeIsEnabled)")
        return {"cached": FakeTask()}

    module.get_task_dict = get_task_dict
    monkeypatch.setitem(sys.modules, "lm_eval", types.ModuleType("lm_eval"))
    monkeypatch.setitem(sys.modules, "lm_eval.tasks", module)
    for name in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(name, raising=False)  # restored after the test: the refusal sets them
    return module


def test_an_lm_eval_multiple_choice_task_becomes_items_scored_as_a_task_file(fake_lm_eval):
    from tfkit.evaluation.lm_eval_tasks import lm_eval_task

    task = lm_eval_task("cached")
    assert [(i.context, i.choices, i.gold) for i in task.items] == [("The sky is", ("blue", "loud"), 0),
                                                                    ("Fire is", ("cold", "hot"), 1)]
    assert task.kind == "multiple_choice" and lm_eval_task("cached", limit=1).items == task.items[:1]


@pytest.mark.parametrize("case", ["missing", "malformed", "probe-column", "too-long", "lm-eval", "encoder"])
def test_bad_downstream_input_is_one_line_exit_2_before_any_training(case, english_text, tmp_path, fake_lm_eval):
    arch, eval_keys = "gpt", {}
    if case == "missing":
        eval_keys, expected = {"tasks": [str(tmp_path / "nope.jsonl")]}, "nope.jsonl: no such file"
    elif case == "malformed":
        bad = task_file(tmp_path)
        bad.write_text(bad.read_text() + '{"context": "x", "choices": ["a"], "gold": 0}\n')
        eval_keys, expected = {"tasks": [str(bad)]}, f'{bad}:13: "choices" is ["a"]'
    elif case == "probe-column":
        data = tmp_path / "rows.csv"
        data.write_text("text,label\nread a file,io\nopen a socket,net\n" * 10)
        eval_keys, expected = {"probe": {"data": str(data), "label": "topic"}}, "topic"
    elif case == "too-long":
        long = [{"context": "A", "choices": [" ".join(["word"] * 200), "b"], "gold": 0}] + ITEMS
        eval_keys = {"tasks": [str(task_file(tmp_path, long, "long.jsonl"))]}
        expected = "long: 1 of 13 items have a choice longer than the model's context (model.max_seq_len=64 tokens)"
    elif case == "lm-eval":
        eval_keys, expected = {"tasks": ["lm-eval:arc_easy"]}, "lm-eval:arc_easy is not available offline"
    else:
        arch, eval_keys, expected = "bert", {"tasks": ["stdlib:docs-cloze"]}, "an encoder gets a downstream score"
    recipe = write_recipe(tmp_path, english_text, arch, train=FAST, eval=eval_keys)
    done = run(recipe, tmp_path / "run")
    assert done.exit_code == 2, done.output
    if case == "too-long":  # known once the run's tokenizer is: after its lines, before the model is built
        line = done.output.strip().splitlines()[-1]
        assert line.startswith("error:") and "Traceback" not in done.output and "val_loss" not in done.output
    else:
        line = one_error_line(done)
    assert expected in line, line
    assert not (tmp_path / "run").exists()  # refused before the run folder was claimed, or the failed start removed it


def test_tasks_split_across_processes_give_the_scores_of_one(tmp_path, english_text):
    """ContinuationScorer.score's `part`: the shares of two processes, put together, are one process's scores to
    the bit (the 2-process run itself: tests/test_inloop_distributed.py)."""
    import torch

    from tfkit.evaluation.builtin_tasks import load_task
    from tfkit.evaluation.loglikelihood import ContinuationScorer
    from tfkit.evaluation.task_scores import task_groups
    from tfkit.models import ModelConfig, build_model
    from tfkit.tokenization import TokenizerSpec, load_tokenizer, train_tokenizer

    train_tokenizer(TokenizerSpec(kind="bpe", vocab_size=300), [english_text[:60_000]], tmp_path, show_progress=False)
    tokenizer = load_tokenizer(tmp_path)
    torch.manual_seed(0)
    model = build_model(ModelConfig(arch="gpt", vocab_size=tokenizer.vocab_size, d_model=32, n_layers=2, n_heads=4,
                                    max_seq_len=96)).eval()
    groups = [g for name in ("stdlib:docs-choice", "stdlib:docs-cloze")
              for g in task_groups(tokenizer, load_task(name, 40))]
    scorer = ContinuationScorer(model, tokenizer, batch_size=4)
    one = scorer.score(groups)
    halves = [scorer.score(groups, (rank, 2)) for rank in (0, 1)]
    assert all((a is None) != (b is None) for a, b in zip(*halves))  # each item scored by one process
    assert [a if a is not None else b for a, b in zip(*halves)] == one
    assert sum(a is not None for a in halves[0]) not in (0, len(groups))  # both processes had work


def test_the_built_in_tasks_are_named_by_recipes_keys_and_the_same_every_time():
    from tfkit.evaluation.builtin_tasks import BUILTIN, load_task

    shown = " ".join(CliRunner().invoke(app, ["recipes", "keys", "eval"]).output.split())
    assert all(name in shown for name in BUILTIN) and "eval.probe" in shown and "stdlib:topics" in shown
    cloze, choice = load_task("stdlib:docs-cloze"), load_task("stdlib:docs-choice")
    assert (cloze.kind, choice.kind) == ("cloze", "multiple_choice") and len(cloze.items) > 500 < len(choice.items)
    assert all(len(item.choices) == 4 and item.choices.count(item.choices[item.gold]) == 1 for item in choice.items)
    assert load_task("stdlib:docs-choice", 3).items == choice.items[:3]


def test_loss_png_draws_the_task_scores_against_tokens(tmp_path):
    from tfkit.trainer.metrics import plot_loss
    from tfkit.trainer.task_curves import token_curves

    rows = [{"step": 0, "val_loss": 8.0, "task/a/acc": 0.2, "task/a/perplexity": 900.0, "tokens": 0},
            {"step": 1, "loss": 7.5, "tokens": 512}, {"step": 2, "loss": 7.0, "tokens": 1024},
            {"step": 2, "val_loss": 7.1},  # a validation that scored no task: its tokens from the training row
            {"step": 4, "loss": 6.0, "tokens": 2048}, {"step": 4, "val_loss": 6.2, "task/a/acc": 0.4, "tokens": 2048}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    loss, tasks = token_curves(rows)
    assert loss == [(0, 8.0), (1024, 7.1), (2048, 6.2)] and tasks == {"task/a/acc": [(0, 0.2), (2048, 0.4)]}
    pytest.importorskip("matplotlib")
    assert plot_loss(tmp_path / "metrics.jsonl", tmp_path / "loss.png") and (tmp_path / "loss.png").stat().st_size
