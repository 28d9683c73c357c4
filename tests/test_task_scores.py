"""Downstream task scores (`tfkit eval --task FILE`): the log-likelihood of every choice equals one plain
forward over `context + choice` (the shared-context batching changes no number), lm-eval's framing of a
(context, continuation) pair, acc / acc_norm / standard errors by hand, cloze accuracy, and the command's
table and JSON for several checkpoints."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from tfkit.checkpoints.weights import save_model
from tfkit.cli.main import app
from tfkit.evaluation.loglikelihood import Group
from tfkit.evaluation.task_file import CLOZE, MULTIPLE_CHOICE, Item, Task, read_task
from tfkit.evaluation.task_scores import load_scorer, mean_and_stderr, task_metrics
from tfkit.models import ModelConfig, build_model
from tfkit.tokenization import TokenizerSpec, load_tokenizer, train_tokenizer

ITEMS = [  # choices of one token and of many, contexts of one length; a context longer than a 48-token model
    # sees (scored cut)
    {"context": "The module that writes files is", "choices": ["a", "files.py", "the one that renames a folder whole"],
     "gold": 1},
    {"context": "Return the number of ", "choices": ["items", "bytes in the buffer", "x"], "gold": 0},
    {"context": "A", "choices": ["b", "c"], "gold": 1},
    {"context": "B", "choices": ["two words", "and three more"], "gold": 1},  # as long as "A": run together
    {"context": "A", "choices": ["a longer answer", "x"], "gold": 0},
    {"context": " ".join(["This sentence goes on and on."] * 8), "choices": ["and on", "then it stops here"], "gold": 0},
]


@pytest.fixture(scope="module")
def tokenizer_dir(english_text: str, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("bpe")
    train_tokenizer(TokenizerSpec(kind="bpe", vocab_size=300), [english_text[:60_000]], folder, show_progress=False)
    return folder


def make_checkpoint(folder: Path, tokenizer_dir: Path, seed: int) -> Path:
    tok = load_tokenizer(tokenizer_dir)
    torch.manual_seed(seed)
    net = build_model(ModelConfig(arch="gpt", vocab_size=tok.vocab_size, d_model=32, n_layers=2, n_heads=4,
                                  max_seq_len=48, init_std=0.3))  # wide logits: choices far from ties
    save_model(net, folder, step=5)
    tok.save(folder)
    return folder


@pytest.fixture(scope="module")
def checkpoints(tokenizer_dir: Path, tmp_path_factory) -> list[Path]:
    root = tmp_path_factory.mktemp("ckpts")
    return [make_checkpoint(root / f"seed{seed}", tokenizer_dir, seed) for seed in (0, 1)]


@pytest.fixture(scope="module")
def task_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("task") / "mini.jsonl"
    path.write_text("".join(json.dumps(item) + "\n" for item in ITEMS), encoding="utf-8")
    return path


def plain_loglikelihood(model, ids_context: list[int], ids_choice: list[int], max_len: int) -> tuple[float, bool]:
    """The oracle: one forward over context + choice, cut from the left to max_len + 1 tokens."""
    whole = (ids_context + ids_choice)[-(max_len + 1):]
    with torch.no_grad():
        logprobs = model(torch.tensor([whole[:-1]]))[0].log_softmax(-1)  # (T, V)
    end = len(whole) - 1
    rows = logprobs[end - len(ids_choice):end]  # (len(choice), V)
    target = torch.tensor(ids_choice)
    return rows.gather(-1, target[:, None]).sum().item(), bool((rows.argmax(-1) == target).all())


@pytest.mark.parametrize("batch_size", [1, 2, 8])
def test_each_choice_scores_as_one_plain_forward_over_context_and_choice(checkpoints, task_file, tokenizer_dir,
                                                                         batch_size):
    scorer, _ = load_scorer(checkpoints[0], batch_size=batch_size)
    tok = load_tokenizer(tokenizer_dir)
    task = read_task(task_file)
    groups, expected = [], []
    for item in task.items:
        context = [tok.eos_id] + tok.encode(item.context)  # a document starts after the separator
        choices = [([tok.eos_id] + tok.encode(item.context + " " + c))[len(context):] for c in item.choices]
        groups.append(Group(context, choices))
        expected.append([plain_loglikelihood(scorer.model, context, c, 48) for c in choices])
    assert any(len(g.context) + max(map(len, g.continuations)) - 1 > 48 for g in groups)  # the cut path runs
    assert any(min(map(len, g.continuations)) == 1 for g in groups)  # so does the one-token one
    for got, want in zip(scorer.score(groups), expected):
        assert [greedy for _, greedy in got] == [greedy for _, greedy in want]
        assert [lp for lp, _ in got] == pytest.approx([lp for lp, _ in want], abs=1e-4)


def test_a_pair_is_split_as_lm_eval_splits_it(checkpoints, tokenizer_dir):
    scorer, _ = load_scorer(checkpoints[0])
    tok = load_tokenizer(tokenizer_dir)
    context, continuation = scorer.encode_pair("Return the number of ", "items")  # the space joins the answer
    assert context == [tok.eos_id] + tok.encode("Return the number of")
    assert context + continuation == [tok.eos_id] + tok.encode("Return the number of items")
    assert scorer.encode_pair("", "items") == ([tok.eos_id], tok.encode("items"))  # the prefix is the context


def test_acc_takes_the_likeliest_choice_and_acc_norm_the_likeliest_per_byte():
    items = (Item("q", ("a", "bbbb"), 1), Item("q", ("a", "bbbb"), 0), Item("q", ("ccc", "d"), 0),
             Item("q", ("é", "ee"), 0))
    scores = [[(-2.0, False), (-4.0, False)],  # acc: a (wrong); per byte -2 vs -1: bbbb (right)
              [(-2.0, False), (-4.0, False)],  # acc: a (right); acc_norm: bbbb (wrong)
              [(-3.0, False), (-3.0, False)],  # a tie goes to the first choice: right in both
              [(-3.0, False), (-2.5, False)]]  # é is 2 bytes: -1.5 vs -1.25 per byte, so ee in both (wrong)
    got = task_metrics(Task(Path("t.jsonl"), MULTIPLE_CHOICE, items), scores)
    assert got["acc"] == 0.5 and got["acc_norm"] == 0.5
    assert got["acc_stderr"] == pytest.approx(math.sqrt(1 / 3 / 4))  # sample variance 1/3 over 4 items


def test_cloze_accuracy_is_greedy_and_perplexity_the_exp_of_the_mean_nll():
    items = (Item("a", ("b",), 0), Item("c", ("d",), 0))
    got = task_metrics(Task(Path("l.jsonl"), CLOZE, items), [[(-1.0, True)], [(-3.0, False)]])
    assert got["acc"] == 0.5 and got["perplexity"] == pytest.approx(math.exp(2.0))
    assert mean_and_stderr([1.0]) == (1.0, 0.0)


def test_a_cloze_file_predicts_each_texts_last_word(tmp_path):
    path = tmp_path / "lambada.jsonl"
    path.write_text('{"text": "she handed him the key"}\n', encoding="utf-8")
    task = read_task(path)
    assert task.kind == CLOZE and task.items[0].context == "she handed him the"
    assert task.items[0].continuations == (" key",)


def test_eval_task_prints_a_row_per_checkpoint_and_writes_the_same_numbers(checkpoints, task_file, tmp_path):
    out = tmp_path / "scores.json"
    result = CliRunner().invoke(app, ["eval", *map(str, checkpoints), "--task", str(task_file), "--json", str(out)])
    assert result.exit_code == 0, result.output
    rows = json.loads(out.read_text())
    assert [r["checkpoint"] for r in rows] == [str(c) for c in checkpoints]
    for row in rows:
        assert row["task"] == "mini" and row["items"] == len(ITEMS) and row["kind"] == MULTIPLE_CHOICE
        assert row["acc"] in {k / len(ITEMS) for k in range(len(ITEMS) + 1)}
        assert f"{100 * row['acc']:.2f} ± {100 * row['acc_stderr']:.2f}" in result.stdout
        assert f"{100 * row['acc_norm']:.2f} ± {100 * row['acc_norm_stderr']:.2f}" in result.stdout
    again = CliRunner().invoke(app, ["eval", str(checkpoints[0]), "--task", str(task_file), "--json", str(out)])
    assert again.exit_code == 0, again.output  # earlier task results may be replaced
