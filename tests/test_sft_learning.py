"""Chat fine-tuning teaches a tiny GPT a deterministic instruction task it could not do before: reversing a
short word letter by letter, answered through the chat template and ended at the end-of-turn token."""

import dataclasses
import json
import random

import pytest
import torch
from test_run_start_block import TINY
from typer.testing import CliRunner

from tfkit.checkpoints.folders import resolve_checkpoint
from tfkit.checkpoints.weights import load_with_tokenizer
from tfkit.cli.main import app
from tfkit.models import build_model
from tfkit.models.framing import frame_chat
from tfkit.models.generation import generate
from tfkit.models.resize import grow_vocab

LETTERS = "abcdefgh"
QUIET = ["log.progress=false", "log.plot=false", "log.tensorboard=false", "train.threads=1", "train.precision=fp32"]


def reverse_task(n: int, seed: int) -> list[tuple[str, str]]:
    """(instruction, answer) pairs: `reverse c a f e` -> `e f a c`, four letters."""
    rng = random.Random(seed)
    words = [[rng.choice(LETTERS) for _ in range(4)] for _ in range(n)]
    return [("reverse " + " ".join(w), " ".join(reversed(w))) for w in words]


def write_chats(path, pairs: list[tuple[str, str]]) -> None:
    """Half as {prompt, response}, half as chat messages: both layouts train the same turns."""
    with open(path, "w") as f:
        for k, (prompt, answer) in enumerate(pairs):
            record = ({"prompt": prompt, "response": answer} if k % 2 else
                      {"messages": [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}]})
            f.write(json.dumps(record) + "\n")


def exact_match(model, tokenizer, pairs: list[tuple[str, str]]) -> float:
    """The share of answers that greedy decoding gets exactly right, ended at the end-of-turn token."""
    hits = 0
    for prompt, answer in pairs:
        ids, end = frame_chat(tokenizer, prompt)
        (new,) = generate(model.eval(), [ids], 12, eos_id=end, temperature=0.0)
        hits += end not in new and tokenizer.decode(new).strip() == answer and len(new) < 12
    return hits / len(pairs)


def _sets(*items: str) -> list[str]:
    return [a for s in items for a in ("--set", s)]


@pytest.mark.slow
def test_a_tiny_gpt_learns_to_reverse_words_from_chat_fine_tuning(english_file, tmp_path):
    pretrained = tmp_path / "pre"
    done = CliRunner().invoke(app, ["pretrain", "gpt-tiny", "--run-dir", str(pretrained),
                                    *_sets(f"data.train={english_file}", *TINY, *QUIET, "model.max_seq_len=64")])
    assert done.exit_code == 0, done.output
    trained = reverse_task(3000, seed=0)
    write_chats(tmp_path / "chat.jsonl", trained)
    run = tmp_path / "sft"
    done = CliRunner().invoke(app, ["pretrain", "sft-chat", "--run-dir", str(run), *_sets(
        f"train.init_from={pretrained}", f"data.train={tmp_path / 'chat.jsonl'}", "data.seq_len=64",
        "train.max_steps=400", "optim.lr=3e-3", "train.log_every=100", *QUIET)])
    assert done.exit_code == 0, done.output
    held_out = [p for p in reverse_task(400, seed=1) if p not in trained][:100]  # words it never saw
    model, _, tokenizer = load_with_tokenizer(resolve_checkpoint(run))
    after = exact_match(model, tokenizer, held_out)

    before_model, cfg, _ = load_with_tokenizer(resolve_checkpoint(pretrained))
    grown = build_model(dataclasses.replace(cfg, vocab_size=tokenizer.vocab_size))
    grown.load_state_dict(grow_vocab(before_model.state_dict(), tokenizer.vocab_size))
    before = exact_match(grown, tokenizer, held_out)
    assert after >= 0.9 and before <= 0.05, (before, after)
    torch.testing.assert_close(grown.lm_head.weight, grown.embed.tok.weight)
    prompt, answer = held_out[0] if after == 1.0 else next(
        (p, a) for p, a in held_out if exact_match(model, tokenizer, [(p, a)]) == 1.0)
    said = CliRunner().invoke(app, ["generate", str(run), "--chat", prompt, "--temperature", "0"])
    assert said.exit_code == 0 and said.stdout.strip() == answer, said.output
    assert "stopped: end of turn after" in said.stderr
