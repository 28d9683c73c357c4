"""`tfkit generate` end to end on tiny random checkpoints with a tokenizer trained in the test."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from tfkit.checkpoints.weights import save_model
from tfkit.cli.main import app
from tfkit.errors import ConfigError, TfkitError
from tfkit.models import ModelConfig, build_model
from tfkit.models.framing import continuation
from tfkit.models.generation import fill_mask
from tfkit.models.generation import generate as generate_ids
from tfkit.tokenization import TokenizerSpec, load_tokenizer, train_tokenizer


@pytest.fixture(scope="module")
def corpus(english_text: str) -> list[str]:
    """100 kB of English the tokenizers are trained on (a list: WordPiece training reads its texts twice)."""
    return [english_text[:100_000]]


def invoke(args: list[str]):
    return CliRunner().invoke(app, ["generate", *args])


def assert_user_error(result, option: str) -> None:
    """Exit 2 with one line naming the option (real app), or the TfkitError itself (bare app)."""
    if isinstance(result.exception, TfkitError):
        assert option in str(result.exception)
    else:
        assert result.exit_code == 2, result.output
        assert option in result.stderr and result.stdout == ""


def checkpoint(tmp: Path, kind: str, corpus: list[str], **model) -> Path:
    tok_dir = tmp / f"tok-{kind}"
    train_tokenizer(TokenizerSpec(kind=kind, vocab_size=300), corpus, tok_dir, show_progress=False)
    tok = load_tokenizer(tok_dir)
    torch.manual_seed(0)
    cfg = dict(vocab_size=tok.vocab_size, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=64,
               init_std=0.2)
    folder = tmp / f"run-{kind}-{model.get('arch', 'gpt')}" / "checkpoints" / "step-7"
    save_model(build_model(ModelConfig(**{**cfg, **model})), folder)
    tok.save(folder)
    return folder


@pytest.fixture(scope="module")
def gpt_ckpt(corpus: list[str], tmp_path_factory) -> Path:
    return checkpoint(tmp_path_factory.mktemp("gpt"), "bpe", corpus, arch="gpt", positions="rope")


@pytest.fixture(scope="module")
def bert_ckpt(corpus: list[str], tmp_path_factory) -> Path:
    return checkpoint(tmp_path_factory.mktemp("bert"), "wordpiece", corpus, arch="bert")


def expected_text(folder: Path, prompt: str, n: int) -> str:
    from tfkit.checkpoints.weights import load_model

    model, _ = load_model(folder)
    tok = load_tokenizer(folder)
    ids = generate_ids(model, [[tok.eos_id, *tok.encode(prompt)]], n, temperature=0, eos_id=tok.eos_id)[0]
    return tok.decode(ids)


def test_stdout_is_exactly_the_greedy_continuation_from_a_run_folder(gpt_ckpt: Path) -> None:
    run_folder = gpt_ckpt.parents[1]
    result = invoke([str(run_folder), "--prompt", "First Citizen:", "-n", "12", "--temperature", "0"])
    assert result.exit_code == 0, result.output
    assert result.stdout == expected_text(gpt_ckpt, "First Citizen:", 12) + "\n"
    assert "loaded" in result.stderr and "loaded" not in result.stdout


def test_stderr_says_how_fast_the_tokens_came(gpt_ckpt: Path) -> None:
    """One prompt: the whole time and the steady time per token after the first 4 (prefill, compilation);
    several: tokens per second over the batch. Never on stdout, which carries only the text."""
    one = invoke([str(gpt_ckpt), "-p", "To be", "-n", "10", "--min-new-tokens", "10", "-t", "0"])
    assert one.exit_code == 0, one.output
    assert re.search(r"^speed: 10 tokens in [\d.]+ s, [\d.]+ ms per token after the first 4$", one.stderr, re.M)
    several = invoke([str(gpt_ckpt), "-p", "To be", "-p", "All:", "-n", "3", "--min-new-tokens", "3", "-t", "0"])
    assert re.search(r"^speed: 6 tokens in [\d.]+ s \([\d,]+ tokens/s over 2 prompts\)$", several.stderr, re.M)
    assert "speed" not in one.stdout + several.stdout


def test_several_prompts_are_split_by_header_lines_and_seed_repeats(gpt_ckpt: Path) -> None:
    args = [str(gpt_ckpt), "-p", "To be", "-p", "All:", "-n", "6", "--seed", "3", "--top-k", "20", "--top-p", "0.9"]
    first, again = invoke(args), invoke(args)
    assert first.exit_code == 0, first.output
    assert first.stdout == again.stdout
    assert first.stdout.startswith("==> prompt 1: 'To be' <==\n") and "\n\n==> prompt 2: 'All:' <==\n" in first.stdout


def test_several_prompts_stdout_splits_into_exactly_the_continuations(gpt_ckpt: Path) -> None:
    """Continuations may hold newlines and blank lines: the header lines alone must delimit them."""
    from tfkit.checkpoints.weights import load_model

    prompts = ["First Citizen:\n\n", "All:", "Speak, speak."]
    model, _ = load_model(gpt_ckpt)
    tok = load_tokenizer(gpt_ckpt)
    batch = [[tok.eos_id, *tok.encode(p)] for p in prompts]
    expected = [tok.decode(ids) for ids in generate_ids(model, batch, 20, temperature=0, eos_id=tok.eos_id,
                                                        pad_id=tok.pad_id or 0)]
    result = invoke([str(gpt_ckpt), *[a for p in prompts for a in ("-p", p)], "-n", "20", "--temperature", "0"])
    assert result.exit_code == 0, result.output
    blocks = re.split(r"(?:^|\n\n)==> prompt \d+: .* <==\n", result.stdout)
    assert blocks[0] == "" and [b.removesuffix("\n") for b in blocks[1:]] == expected
    assert "==> prompt 1: 'First Citizen:\\n\\n' <==" in result.stdout  # one line, whatever the prompt holds
    assert "==>" not in result.stderr


def test_bad_input_names_the_option(gpt_ckpt: Path, bert_ckpt: Path) -> None:
    assert_user_error(invoke([str(gpt_ckpt)]), "--prompt")
    assert_user_error(invoke([str(gpt_ckpt), "--fill-mask", "The [MASK] sat."]), "--fill-mask")
    assert_user_error(invoke([str(gpt_ckpt), "-p", "speak " * 80]), "--prompt")
    assert_user_error(invoke([str(gpt_ckpt), "-p", "hi", "--temperature", "-1"]), "--temperature")
    assert_user_error(invoke([str(gpt_ckpt), "-p", "hi", "--device", "tpu"]), "--device")
    assert_user_error(invoke([str(bert_ckpt), "-p", "hi"]), "--fill-mask")
    assert_user_error(invoke([str(bert_ckpt), "--fill-mask", "no mask here"]), "--fill-mask")
    assert_user_error(invoke([str(bert_ckpt), "--fill-mask", "The [MASK] sat.", "--top-k", "0"]), "--top-k must be >= 1")


@pytest.mark.parametrize("text", ["The [MASK] sat.", "no mask here"], ids=["gpt", "bert-no-mask"])
def test_fill_mask_checks_before_it_prints_its_header(text: str, gpt_ckpt: Path, bert_ckpt: Path) -> None:
    result = invoke([str(gpt_ckpt if "MASK" in text else bert_ckpt), "--fill-mask", text])
    assert result.exit_code == 2 and "--fill-mask" in result.stderr
    assert ["mask", "prob", "token"] not in [line.split() for line in result.stderr.splitlines()]
    assert result.stdout == ""


def test_fill_mask_lists_top_k_fillers_per_mask(bert_ckpt: Path) -> None:
    from tfkit.checkpoints.weights import load_model

    model, _ = load_model(bert_ckpt)
    tok = load_tokenizer(bert_ckpt)
    guesses = fill_mask(model, tok, "The [MASK] sat on the [MASK].", top_k=4)
    assert len(guesses) == 2 and all(len(g) == 4 for g in guesses)
    for g in guesses:
        probs = [p for _, p in g]
        assert probs == sorted(probs, reverse=True) and 0 < sum(probs) <= 1 + 1e-6
    result = invoke([str(bert_ckpt), "--fill-mask", "The [MASK] sat on the [MASK].", "--top-k", "4"])
    assert result.exit_code == 0, result.output
    rows = [line.split("\t") for line in result.stdout.splitlines()]
    assert [r[0] for r in rows] == ["1"] * 4 + ["2"] * 4
    assert [r[2] for r in rows[:4]] == [t for t, _ in guesses[0]]
    assert [r[2] for r in rows[4:]] == [t for t, _ in guesses[1]]
    assert float(rows[0][1]) == pytest.approx(guesses[0][0][1], abs=1e-4)


def test_encoder_decoder_checkpoint_generates(corpus: list[str], tmp_path: Path) -> None:
    folder = checkpoint(tmp_path, "bpe", corpus, arch="transformer")
    result = invoke([str(folder), "-p", "Hear me speak.", "-n", "5", "--temperature", "0"])
    assert result.exit_code == 0, result.output
    assert result.stdout.endswith("\n")


def test_fill_mask_rejects_gpt_models(gpt_ckpt: Path) -> None:
    from tfkit.checkpoints.weights import load_model

    model, _ = load_model(gpt_ckpt)
    with pytest.raises(ConfigError, match="^text_with_mask needs a BERT"):
        fill_mask(model, load_tokenizer(gpt_ckpt), "The [MASK] sat.", top_k=3)


def test_stream_prints_text_as_it_grows_and_never_half_a_character(gpt_ckpt: Path, capsys) -> None:
    from tfkit.cli.generate import TextStream

    tok = load_tokenizer(gpt_ckpt)
    text = "Speak ünïcödé 😀 now"
    ids = tok.encode(text)
    stream, pieces = TextStream(tok, []), []
    for t in ids:
        stream(0, t)
        pieces.append(capsys.readouterr().out)
    stream.finish()
    assert "".join(pieces) + capsys.readouterr().out == text + "\n"
    assert not any("\ufffd" in p for p in pieces)
    assert sum(1 for p in pieces if p) > 3  # printed along the way, not all at the end


@pytest.mark.parametrize("kind", ["wordpiece", "unigram"])
def test_a_continuation_keeps_the_space_after_its_prompt(corpus: list[str], tmp_path: Path, kind: str) -> None:
    """WordPiece and Metaspace decoders drop the space before a text's first word; a continuation is not
    a text of its own ("ROMEO: I" + "in" must read " in")."""
    train_tokenizer(TokenizerSpec(kind=kind, vocab_size=300), corpus, tmp_path / kind, show_progress=False)
    tok = load_tokenizer(tmp_path / kind)
    prompt, new = tok.encode("ROMEO: I"), tok.encode("in the house")
    assert tok.decode(new) == "in the house"  # what printing the new tokens alone gave
    assert continuation(tok, prompt, new) == " in the house"


@pytest.mark.slow  # a subprocess decoding 8,000 prompts: about 6 s
def test_a_reader_that_stops_early_is_not_an_error(gpt_ckpt: Path) -> None:
    """`tfkit generate ... | head -1`: the closed pipe ends the command quietly with 141 (128 + SIGPIPE),
    as `yes | head` does, not with an error line or a traceback."""
    import subprocess
    import sys

    # The output must overflow the pipe (64 KiB on Linux) plus Python's stdout buffer, or the command can
    # write it all and exit 0 before the reader closes: 8,000 headers alone are over 160 KB.
    prompts = [arg for _ in range(8000) for arg in ("-p", "x")]
    cmd = [sys.executable, "-m", "tfkit", "generate", str(gpt_ckpt), *prompts, "--max-new-tokens", "1", "--seed", "0"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout.readline().startswith(b"==> prompt 1:")
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141
    assert "error" not in err and "Traceback" not in err, err


def test_compile_flag_compiles_the_decode_step_and_prints_the_same_text(gpt_ckpt: Path, monkeypatch) -> None:
    """The plumbing only (inductor itself is tests/test_decode_static.py's slow test): --compile hands the
    decode step to torch.compile, default mode on the CPU, and the text is the eager one."""
    modes = []

    def recording_compile(fn, mode=None, **kwargs):
        modes.append(mode)
        return fn

    args = [str(gpt_ckpt), "--prompt", "First Citizen:", "-n", "8", "--temperature", "0", "--device", "cpu"]
    eager = invoke(args)
    monkeypatch.setattr(torch, "compile", recording_compile)
    compiled = invoke([*args, "--compile"])
    assert compiled.exit_code == 0, compiled.output
    assert compiled.stdout == eager.stdout and modes == [None]
