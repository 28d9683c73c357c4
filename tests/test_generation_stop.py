"""`tfkit generate` says why it stopped, and --min-new-tokens keeps a model from ending a text at once."""

import torch
from typer.testing import CliRunner

from tfkit.checkpoints.weights import save_model
from tfkit.cli.main import app
from tfkit.models import ModelConfig, build_model
from tfkit.tokenization import TokenizerSpec, load_tokenizer, train_tokenizer


def eager_to_end(tmp_path):
    """A GPT whose every next token is the end of text: a zero final-norm scale makes all logits 0, and
    greedy decoding takes the first id among equals, which is byte-level BPE's <|endoftext|>."""
    train_tokenizer(TokenizerSpec(kind="bpe", vocab_size=300), ["To be, or not to be: that is the question."] * 50,
                    tmp_path / "tok", show_progress=False)
    tok = load_tokenizer(tmp_path / "tok")
    assert tok.eos_id == 0
    model = build_model(ModelConfig(arch="gpt", vocab_size=tok.vocab_size, d_model=16, n_layers=1, n_heads=2,
                                    max_seq_len=32))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.startswith("ln_f"):
                param.zero_()
    folder = tmp_path / "ckpt"
    save_model(model, folder)
    tok.save(folder)
    return folder


def test_an_empty_continuation_is_explained_on_stderr_and_min_new_tokens_continues(tmp_path):
    folder = eager_to_end(tmp_path)
    base = ["generate", str(folder), "-p", "To be", "--temperature", "0", "--device", "cpu"]
    ended = CliRunner().invoke(app, base)
    assert ended.exit_code == 0, ended.output
    assert ended.stdout == "\n"
    assert "stopped: end of text after 0 new tokens" in ended.stderr and "--min-new-tokens" in ended.stderr
    kept = CliRunner().invoke(app, [*base, "--min-new-tokens", "5", "-n", "5"])
    assert kept.exit_code == 0, kept.output
    assert "stopped: --max-new-tokens 5 reached" in kept.stderr  # (its tokens are <|pad|>: all logits tie)


def test_several_prompts_each_get_a_reason_and_bad_bounds_are_one_line(tmp_path):
    folder = eager_to_end(tmp_path)
    result = CliRunner().invoke(app, ["generate", str(folder), "-p", "To be", "-p", "that is", "--temperature", "0",
                                      "--min-new-tokens", "3", "-n", "40", "--device", "cpu"])
    assert result.exit_code == 0, result.output
    for number in (1, 2):
        assert f"prompt {number} stopped: end of text after 3 new tokens" in result.stderr
    bad = CliRunner().invoke(app, ["generate", str(folder), "-p", "To be", "--min-new-tokens", "9", "-n", "4"])
    assert bad.exit_code == 2 and "--min-new-tokens: got 9, expected 0 to --max-new-tokens (4)" in bad.stderr
