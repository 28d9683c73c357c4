"""`tfkit generate CKPT --prompt ...`: continue text with a GPT or encoder-decoder, fill masks with BERT.

stdout carries only the generated text, so the command pipes (`tfkit generate run/ -p "To be" | wc -w`);
everything else (what was loaded, which device) goes to stderr. With one prompt the text is streamed as
tokens arrive. With several they are decoded as one batch and printed in order, each preceded by a
header line `==> prompt N: 'PROMPT' <==` and separated by a blank line, as `head a b` separates files:
a continuation can itself hold newlines and blank lines, so only the headers split stdout reliably.
"""

from __future__ import annotations

import time
from typing import Annotated, Optional

import typer
from rich.console import Console

from ..errors import ConfigError
from ..runtime import check_precision, pick_device, torch_dtype
from ..threads import set_threads
from .options import Device, Dtype

err = Console(stderr=True, highlight=False, soft_wrap=True)


class TextStream:
    """Prints the text of a growing token list as it grows.

    Tokens are not characters: a byte-level BPE token can hold half of a UTF-8 character, and WordPiece
    or Metaspace decoding of a token depends on its neighbours. So the whole list is decoded each time
    (after its prompt, see `models.framing.continuation`) and only the new suffix is printed, held back
    while it ends in an incomplete character.
    """

    def __init__(self, tokenizer, prompt: list[int]) -> None:
        self.tokenizer, self.prompt, self.head = tokenizer, prompt, tokenizer.decode(prompt)
        self.ids: list[int] = []
        self.printed = ""

    def text(self) -> str:
        """The continuation so far (imported here: the module must not import torch for --help)."""
        from ..models.framing import continuation

        return continuation(self.tokenizer, self.prompt, self.ids, self.head)

    def __call__(self, row: int, token: int) -> None:
        self.ids.append(token)
        text = self.text()
        if text.endswith("\ufffd") or not text.startswith(self.printed):
            return
        typer.echo(text[len(self.printed):], nl=False)
        self.printed = text

    def finish(self) -> None:
        text = self.text()
        typer.echo(text[len(self.printed):] if text.startswith(self.printed) else "\n" + text)


class Pace:
    """The time each new token arrived (wrapping the streaming callback, if any), for the `speed:` line:
    the whole generation's time, and the steady per-token time after the first WARM tokens, which carry
    the prefill and, with --compile, the compilation and CUDA-graph capture."""

    WARM = 4

    def __init__(self, inner=None) -> None:
        self.inner, self.start, self.times = inner, time.perf_counter(), []

    def __call__(self, row: int, token: int) -> None:
        self.times.append(time.perf_counter())
        if self.inner is not None:
            self.inner(row, token)

    def line(self, rows: int) -> str:
        """`speed: N tokens in S s, M ms per token after the first 4` (one prompt), or tokens per second
        over the batch (several: rows finish at different steps)."""
        n = len(self.times)
        if n == 0:
            return "speed: no new token"
        total = self.times[-1] - self.start
        text = f"speed: {n} token{'s' * (n != 1)} in {total:.2f} s"
        if rows > 1:
            return f"{text} ({n / max(total, 1e-9):,.0f} tokens/s over {rows} prompts)"
        if n > self.WARM:
            steady = (self.times[-1] - self.times[self.WARM - 1]) / (n - self.WARM)
            text += f", {1e3 * steady:.2f} ms per token after the first {self.WARM}"
        return text


def prompt_header(number: int, prompt: str) -> str:
    """The stdout line before continuation `number` (from 1) when there are several prompts (module doc):
    one line whatever the prompt holds (repr escapes newlines), long prompts cut to 60 characters."""
    return f"==> prompt {number}: {prompt[:60]!r} <=="


def stop_reason(prompt_len: int, new: int, max_new_tokens: int, max_seq_len: int) -> str:
    """Why a row ended, for stderr: a model that ends documents early otherwise prints only a blank line."""
    if new >= max_new_tokens:
        return f"--max-new-tokens {max_new_tokens} reached"
    if prompt_len + new >= max_seq_len:
        return f"the model's max_seq_len ({max_seq_len} tokens, prompt included) reached after {new} new tokens"
    return (f"end of text after {new} new token{'s' * (new != 1)} (--min-new-tokens N keeps it from ending "
            "before N tokens)")


def generate(
    checkpoint: Annotated[str, typer.Argument(help="Checkpoint folder, or a run folder (its latest checkpoint).")],
    prompt: Annotated[
        Optional[list[str]],
        typer.Option("--prompt", "-p", help="Text to continue (GPT) or translate (encoder-decoder); repeat for a batch."),
    ] = None,
    chat: Annotated[
        Optional[str], typer.Option("--chat", help="A chat fine-tuned GPT (data.format: chat): the user's message, "
                                                   "framed by its chat template; the answer ends at the end of the turn."),
    ] = None,
    system: Annotated[Optional[str], typer.Option("--system", help="With --chat: a system message before it.")] = None,
    fill_mask_text: Annotated[
        Optional[str], typer.Option("--fill-mask", help="BERT checkpoints: text with [MASK] to fill, e.g. \"The [MASK] sat.\""),
    ] = None,
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", "-n", help="New tokens per prompt at most.")] = 100,
    min_new_tokens: Annotated[
        int, typer.Option("--min-new-tokens", help="New tokens per prompt before the end-of-text token may end it.")
    ] = 0,
    temperature: Annotated[float, typer.Option("--temperature", "-t", help="Sampling temperature; 0 = greedy.")] = 0.8,
    top_k: Annotated[Optional[int], typer.Option("--top-k", help="Sample among the k most likely tokens (fill-mask: fillers shown).")] = None,
    top_p: Annotated[Optional[float], typer.Option("--top-p", help="Sample among the smallest set of tokens reaching probability p.")] = None,
    seed: Annotated[Optional[int], typer.Option("--seed", help="Random seed: the same seed gives the same text.")] = None,
    device: Device = "auto",
    dtype: Dtype = "fp32",
    compile_step: Annotated[
        bool, typer.Option("--compile", help="Compile the decode step with torch.compile (CUDA graphs on CUDA; on a "
                                             "CPU about 2x at batch 1); pays off for long outputs, falls back "
                                             "with a warning.")
    ] = False,
) -> None:
    """Generate text from a checkpoint: continue prompts (GPT), decode from a source (encoder-decoder),
    or fill [MASK] tokens (BERT, --fill-mask: one `mask<TAB>prob<TAB>token` line per guess).

    Only the generated text goes to stdout, streamed token by token for a single prompt, so the output
    can be piped; information goes to stderr. Several prompts: each continuation follows a line
    `==> prompt N: 'PROMPT' <==`, with a blank line between them. Stops at the end-of-text token (not
    before --min-new-tokens), after --max-new-tokens, or at the model's max_seq_len; stderr says which.
    """
    from ..checkpoints.folders import chosen_note, read_checkpoint
    from ..checkpoints.weights import check_finite, load_with_tokenizer

    if sum(x is not None and x != [] for x in (prompt, fill_mask_text, chat)) > 1:
        raise ConfigError("--prompt, --chat and --fill-mask cannot be combined: continue text, answer a chat "
                          "message or fill masks (BERT)")
    if fill_mask_text is None and not prompt and chat is None:
        raise ConfigError("--prompt is required (or --chat for a chat model, --fill-mask for a BERT checkpoint)")
    if system is not None and chat is None:
        raise ConfigError("--system: a system message for --chat, which is missing")
    torch_device, precision = pick_device(device), check_precision(dtype)
    set_threads()  # the cores the machine's load leaves free
    folder, (model, cfg, tokenizer) = read_checkpoint(
        checkpoint, lambda f: load_with_tokenizer(f, device=torch_device), best=True)
    if note := chosen_note(checkpoint, folder):
        err.print(note)
    check_finite(model, folder)
    model = model.to(dtype=torch_dtype(precision))
    err.print(f"loaded {folder} ({cfg.arch}, {model.num_params():,} params) on {torch_device}")
    sampling = dict(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, min_new_tokens=min_new_tokens,
                    compile=compile_step)
    if fill_mask_text is not None:
        print_fill_mask(model, tokenizer, fill_mask_text, 5 if top_k is None else top_k)
    elif chat is not None:
        print_answer(model, tokenizer, chat, system, max_new_tokens, sampling)
    else:
        print_continuations(model, tokenizer, prompt, max_new_tokens, sampling)


# the library's names for what the user gave as --prompt and --fill-mask, for its errors to name the flags
generate.library_params = {"prompt_ids": "prompt", "source_ids": "prompt", "text": "prompt",
                           "text_with_mask": "fill_mask_text", "fill_mask": "fill_mask_text"}


def print_fill_mask(model, tokenizer, text: str, top_k: int) -> None:
    """One `mask<TAB>prob<TAB>token` line per guess, under a header printed once the guesses exist (a GPT
    checkpoint or a text without a mask is one error line, not a header and then an error)."""
    from ..models.generation import fill_mask

    guesses = fill_mask(model, tokenizer, text, top_k)
    typer.echo("mask\tprob\ttoken", err=True)  # tabs kept (rich would expand them), as on the rows
    for i, row in enumerate(guesses, start=1):
        for token, prob in row:
            typer.echo(f"{i}\t{prob:.4f}\t{token}")


def print_answer(model, tokenizer, message: str, system: str | None, max_new_tokens: int, sampling: dict) -> None:
    """A chat model's answer to one message, streamed, ending at the end-of-turn token."""
    from ..models.framing import frame_chat
    from ..models.generation import generate as generate_ids

    if model.config.arch != "gpt":
        raise ConfigError(f"--chat: a {model.config.arch} checkpoint; chat answers come from a GPT fine-tuned "
                          "with data.format: chat")
    prompt, end = frame_chat(tokenizer, message, system)
    stream = TextStream(tokenizer, prompt)
    pace = Pace(stream)
    (answer,) = generate_ids(model, [prompt], max_new_tokens, eos_id=end, on_token=pace, **sampling)
    stream.finish()
    reason = stop_reason(len(prompt), len(answer), max_new_tokens, model.config.max_seq_len)
    err.print(f"stopped: {reason.replace('end of text', 'end of turn', 1)}")
    err.print(pace.line(1))


def print_continuations(model, tokenizer, texts: list[str], max_new_tokens: int, sampling: dict) -> None:
    """Continue each prompt text: one prompt streamed as its tokens arrive, several printed in order under
    their headers (module doc); why each stopped goes to stderr."""
    from ..models.framing import continuation, frame_prompt
    from ..models.generation import generate as generate_ids

    cfg = model.config
    framed = [frame_prompt(tokenizer, text, cfg.arch) for text in texts]
    prompts = [p for p, _ in framed]
    sources = [s for _, s in framed] if cfg.arch == "transformer" else None
    eos = tokenizer.eos_id if tokenizer.eos_id is not None else tokenizer.sep_id
    stream = TextStream(tokenizer, prompts[0]) if len(prompts) == 1 else None
    pace = Pace(stream)
    outputs = generate_ids(model, prompts, max_new_tokens, eos_id=eos, on_token=pace, source_ids=sources,
                           pad_id=tokenizer.pad_id or 0, **sampling)
    reasons = [stop_reason(len(p), len(ids), max_new_tokens, cfg.max_seq_len) for p, ids in zip(prompts, outputs)]
    if stream is not None:
        stream.finish()
        err.print(f"stopped: {reasons[0]}")
        err.print(pace.line(1))
        return
    for number, (text, ids, prompt_ids) in enumerate(zip(texts, outputs, prompts), start=1):
        typer.echo(("\n" if number > 1 else "") + prompt_header(number, text))
        typer.echo(continuation(tokenizer, prompt_ids, ids))
    for number, reason in enumerate(reasons, start=1):
        err.print(f"prompt {number} stopped: {reason}")
    err.print(pace.line(len(prompts)))
