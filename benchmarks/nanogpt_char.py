"""nanoGPT's README CPU run, reproduced with the reference GPT: the time-to-quality tfkit is compared with.

    python -m benchmarks.nanogpt_char --data ../shared/data/tinyshakespeare.txt [--max-iters 50 ...]

nanoGPT's README trains a character-level Shakespeare model on a CPU with

    python train.py config/train_shakespeare_char.py --device=cpu --compile=False --eval_iters=20
      --log_interval=1 --block_size=64 --batch_size=12 --n_layer=4 --n_head=4 --n_embd=128
      --max_iters=2000 --lr_decay_iters=2000 --dropout=0.0

This module runs that recipe with `reference_gpt.ReferenceGPT` and nanoGPT's loop:
- data as `data/shakespeare_char/prepare.py` makes it: the vocabulary is every distinct character of the
  whole file, sorted; the first 90% of the characters train, the last 10% validate;
- batches as `get_batch`: `batch_size` windows of `block_size` at uniformly random offsets of the split,
  targets shifted by one, drawn from torch's global generator seeded with 1337;
- the loop as `train.py`: iterations 0..max_iters inclusive (so max_iters + 1 updates); at every
  multiple of eval_interval (0 included) the mean loss of eval_iters batches of each split; then the
  LR of `get_lr`, forward, backward, clip to grad_clip, AdamW step; one thread, no torch.compile, fp32
  (nanoGPT's CPU path has no autocast). train_shakespeare_char.py's settings are the defaults below;
  `bias` is train.py's default, False.
Checkpoints are not written (nanoGPT writes one when the validation loss improves; that is disk time,
not training). The reported time covers the whole loop, periodic evaluations included, as nanoGPT's
run would spend it; data preparation and the final scoring are outside it.

The quality number is bits per byte of the final model on the WHOLE validation tenth, defined as
`tfkit eval` defines it (evaluation/evaluate.py): total NLL in nats over the scored text / ln 2 / the UTF-8
bytes of the scored text. Every validation character is scored exactly once, in non-overlapping windows
of block_size; the first one is predicted from the last training character, the only context there is
for it. nanoGPT's own "val loss" is a mean over 20 random batches, too noisy to compare runs by.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from .reference_gpt import ReferenceGPT, configure_optimizers, get_lr


@dataclass(frozen=True)
class CharData:
    """The file as nanoGPT's prepare.py splits it: ids of every character and where validation starts."""

    ids: Tensor  # (N,) int64: every character of the file as its index in `chars`
    chars: str  # the vocabulary: the file's distinct characters, sorted
    n_train: int  # ids[:n_train] train, ids[n_train:] validate (int(0.9 * N), as prepare.py)

    @property
    def train(self) -> Tensor:
        return self.ids[:self.n_train]  # (N_train,)

    @property
    def val(self) -> Tensor:
        return self.ids[self.n_train:]  # (N_val,)


def load_chars(text: str) -> CharData:
    chars = "".join(sorted(set(text)))
    stoi = {c: i for i, c in enumerate(chars)}
    ids = torch.tensor([stoi[c] for c in text], dtype=torch.long)  # (N,)
    return CharData(ids, chars, int(len(text) * 0.9))


def get_batch(data: Tensor, block_size: int, batch_size: int) -> tuple[Tensor, Tensor]:
    """nanoGPT's sampler: random windows of the split, inputs and next-character targets."""
    ix = torch.randint(len(data) - block_size, (batch_size,))  # (B,) window starts
    x = torch.stack([data[i:i + block_size] for i in ix.tolist()])  # (B, T)
    y = torch.stack([data[i + 1:i + 1 + block_size] for i in ix.tolist()])  # (B, T)
    return x, y


@torch.no_grad()
def estimate_loss(model: ReferenceGPT, data: CharData, block_size: int, batch_size: int,
                  eval_iters: int) -> dict[str, float]:
    """nanoGPT's periodic estimate: mean loss over `eval_iters` random batches of each split."""
    model.eval()
    out = {}
    for split, ids in (("train", data.train), ("val", data.val)):
        losses = [model(*get_batch(ids, block_size, batch_size))[1].item() for _ in range(eval_iters)]
        out[split] = sum(losses) / len(losses)
    model.train()
    return out


@torch.no_grad()
def score_bits_per_byte(model: ReferenceGPT, stream: Tensor, scored_bytes: int, block_size: int,
                        batch_size: int = 64) -> dict[str, float]:
    """Bits per byte of the targets of `stream[1:]`, each predicted once in non-overlapping windows.

    `stream` is the scored text with one character of context before it; window k feeds
    stream[kT : kT+T] and scores stream[kT+1 : kT+T+1] (T = block_size), the last window shorter.
    Returns the total NLL (nats), the characters scored, nats per character and bits per byte."""
    model.eval()
    n = len(stream) - 1  # characters to score
    starts = list(range(0, n, block_size))
    full = [s for s in starts if s + block_size <= n]  # windows of exactly T inputs, batched
    nll = 0.0
    for i in range(0, len(full), batch_size):
        idx = torch.tensor(full[i:i + batch_size]).unsqueeze(1) + torch.arange(block_size + 1)  # (B, T+1)
        window = stream[idx]  # (B, T+1)
        logits, _ = model(window[:, :-1])  # (B, T, V)
        nll += F.cross_entropy(logits.flatten(0, 1), window[:, 1:].flatten(), reduction="sum").item()
    if n % block_size:  # the tail: fewer than T characters left
        window = stream[starts[-1]:].unsqueeze(0)  # (1, t+1)
        logits, _ = model(window[:, :-1])  # (1, t, V)
        nll += F.cross_entropy(logits.flatten(0, 1), window[:, 1:].flatten(), reduction="sum").item()
    model.train()
    return {"nll_nats": nll, "chars": n, "bytes": scored_bytes, "nats_per_char": nll / n,
            "bits_per_byte": nll / math.log(2) / scored_bytes}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.nanogpt_char", description=__doc__.split("\n")[0])
    p.add_argument("--data", type=Path, required=True, help="the text file (tinyshakespeare's input.txt)")
    p.add_argument("--max-iters", type=int, default=2000)
    p.add_argument("--lr-decay-iters", type=int, default=None, help="default: --max-iters (the README sets both)")
    p.add_argument("--eval-interval", type=int, default=250)
    p.add_argument("--eval-iters", type=int, default=20)
    p.add_argument("--log-interval", type=int, default=1)
    p.add_argument("--block-size", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=12)
    p.add_argument("--n-layer", type=int, default=4)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--n-embd", type=int, default=128)
    p.add_argument("--dropout", type=float, default=0.0)
    p.add_argument("--bias", action=argparse.BooleanOptionalAction, default=False)
    p.add_argument("--learning-rate", type=float, default=1e-3)
    p.add_argument("--min-lr", type=float, default=1e-4)
    p.add_argument("--warmup-iters", type=int, default=100)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--beta1", type=float, default=0.9)
    p.add_argument("--beta2", type=float, default=0.99)
    p.add_argument("--grad-clip", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (the comparison uses 1)")
    args = p.parse_args(argv)
    if args.lr_decay_iters is None:
        args.lr_decay_iters = args.max_iters
    if not args.data.is_file():
        p.error(f"--data: {args.data} is not a file")
    return args


def train(args: argparse.Namespace, data: CharData) -> tuple[ReferenceGPT, float]:
    """nanoGPT's train.py loop (module doc); returns the final model and the loop's wall seconds."""
    torch.manual_seed(args.seed)
    model = ReferenceGPT(len(data.chars), args.n_embd, args.n_layer, args.n_head, args.block_size,
                         dropout=args.dropout, bias=args.bias)
    optimizer = configure_optimizers(model, args.weight_decay, args.learning_rate, (args.beta1, args.beta2), "cpu")
    print(f"{model.num_params() / 1e6:.2f}M parameters, vocabulary {len(data.chars)}, "
          f"{len(data.train):,} train / {len(data.val):,} val characters", flush=True)
    schedule = dict(learning_rate=args.learning_rate, min_lr=args.min_lr, warmup_iters=args.warmup_iters,
                    lr_decay_iters=args.lr_decay_iters)
    x, y = get_batch(data.train, args.block_size, args.batch_size)  # (B, T) each: the first batch, before the clock
    start = time.perf_counter()
    for it in range(args.max_iters + 1):
        lr = get_lr(it, **schedule)
        for group in optimizer.param_groups:
            group["lr"] = lr
        if it % args.eval_interval == 0:
            losses = estimate_loss(model, data, args.block_size, args.batch_size, args.eval_iters)
            print(f"step {it}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}", flush=True)
        _, loss = model(x, y)
        x, y = get_batch(data.train, args.block_size, args.batch_size)  # the next batch, as nanoGPT prefetches
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if it % args.log_interval == 0:
            print(f"iter {it}: loss {loss.item():.4f}, lr {lr:.2e}, {time.perf_counter() - start:.1f} s", flush=True)
    return model, time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    text = args.data.read_text(encoding="utf-8")
    data = load_chars(text)
    need = args.block_size + 1
    if len(data.train) <= need or len(data.val) <= need:
        print(f"nanogpt_char: {args.data} is too short: each split needs more than {need} characters at "
              f"--block-size {args.block_size}", file=sys.stderr)
        return 2
    model, seconds = train(args, data)
    stream = data.ids[data.n_train - 1:]  # (N_val + 1,): the validation tenth after its one character of context
    val_bytes = len(text[data.n_train:].encode("utf-8"))
    score = score_bits_per_byte(model, stream, val_bytes, args.block_size)
    print(f"training: {seconds:.1f} s wall for {args.max_iters + 1} iterations "
          f"({args.max_iters // args.eval_interval + 1} evaluations of {args.eval_iters} batches), "
          f"{torch.get_num_threads()} thread(s)")
    print(f"validation: {score['chars']:,} characters, {score['bytes']:,} bytes, "
          f"{score['nats_per_char']:.4f} nats/char, bits_per_byte {score['bits_per_byte']:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
