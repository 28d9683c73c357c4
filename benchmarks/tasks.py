"""Multiple-choice scoring: `tfkit eval --task`'s scorer against lm-evaluation-harness's HF backend.

Both score the same items with the same weights: tfkit's `ContinuationScorer` on a checkpoint, lm-eval's
`HFLM.loglikelihood` on that checkpoint's `export-hf` folder, at the same batch size, each timed from
the items' text to the log-likelihoods (tokenization included, model loading not). tfkit runs each
context once for its choices (evaluation/loglikelihood.py); lm-eval runs context + choice per choice.
Two shapes: HellaSwag's (a long context, four endings of a sentence or so) and ARC's (a short question,
four answers of a few words). The rows also say whether the two accuracies are identical, the first
thing the numbers must be. The model is random: equal numbers, not good ones.
"""

from __future__ import annotations

import random
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from tfkit.checkpoints.weights import save_model
from tfkit.models import ModelConfig, build_model
from tfkit.tokenization import TokenizerSpec, load_tokenizer, train_tokenizer
from tfkit.tokenization.stdlib_corpus import stdlib_documents

from .common import Context, Goal, Row, median, paired_ratio, time_interleaved

if TYPE_CHECKING:  # imported where used: `benchmarks.run` starts without the evaluation package
    from tfkit.evaluation.loglikelihood import ContinuationScorer

GOAL = Goal(">= 2x lm-eval HF", 2.0)
SHAPES = {"HellaSwag-shaped": (60, 18), "ARC-shaped": (20, 4)}  # words of context, words per choice
CHOICES = 4


def make_items(words: list[str], context_words: int, choice_words: int, n: int, seed: int) -> list[tuple]:
    """(context, choices, gold) cut from running text: the gold choice is the context's own continuation."""
    rng = random.Random(seed)
    items = []
    for _ in range(n):
        starts = [rng.randrange(len(words) - context_words - choice_words) for _ in range(CHOICES)]
        context = " ".join(words[starts[0]:starts[0] + context_words])
        choices = [" ".join(words[s + context_words:s + context_words + choice_words]) for s in starts]
        gold = rng.randrange(CHOICES)
        choices[0], choices[gold] = choices[gold], choices[0]
        items.append((context, choices, gold))
    return items


def build_checkpoint(work: Path, text: str, quick: bool) -> Path:
    """A random GPT the size of the train section's CPU case, with a BPE tokenizer trained on `text`."""
    train_tokenizer(TokenizerSpec(kind="bpe", vocab_size=1024 if quick else 8192), [text], work / "tok",
                    show_progress=False)
    tok = load_tokenizer(work / "tok")
    torch.manual_seed(0)
    size = dict(d_model=64, n_layers=2, n_heads=4) if quick else dict(d_model=256, n_layers=4, n_heads=4)
    net = build_model(ModelConfig(arch="gpt", vocab_size=tok.vocab_size, max_seq_len=512, **size))
    save_model(net, work / "ckpt", step=0)
    tok.save(work / "ckpt")
    return work / "ckpt"


def accuracy(items: list[tuple], logprobs: list[float]) -> float:
    right = 0
    for k, (_, choices, gold) in enumerate(items):
        scores = logprobs[k * len(choices):(k + 1) * len(choices)]
        right += max(range(len(scores)), key=lambda i: (scores[i], -i)) == gold
    return right / len(items)


def run(ctx: Context) -> list[Row]:
    try:
        from lm_eval.api.instance import Instance
        from lm_eval.models.huggingface import HFLM
    except ImportError:
        ctx.skip("tasks: the lm-eval baseline needs `pip install 'lm-eval[hf]'`")
        return []
    from tfkit.checkpoints.hf_export import export_hf
    from tfkit.checkpoints.weights import load_model
    from tfkit.evaluation.loglikelihood import ContinuationScorer

    text = "\n\n".join(doc for _, doc in zip(range(300 if ctx.quick else 2000), stdlib_documents("stdlib:docs:train")))
    words = text.split()
    work = Path(tempfile.mkdtemp(prefix="tfkit-bench-tasks-"))
    try:
        ctx.log("tasks: tokenizer, random GPT, export-hf")
        ckpt = build_checkpoint(work, text, ctx.quick)
        model, _ = load_model(ckpt, device=ctx.device)
        batch_size = 8
        scorer = ContinuationScorer(model.eval(), load_tokenizer(ckpt), batch_size)
        hf = HFLM(pretrained=str(export_hf(ckpt, work / "hf")), batch_size=batch_size, device=str(ctx.device),
                  dtype="float32")
        rows = []
        for name, (context_words, choice_words) in SHAPES.items():
            items = make_items(words, context_words, choice_words, 8 if ctx.quick else 64, seed=0)
            ctx.log(f"tasks: {name}, {len(items)} items")
            rows.append(compare(ctx, name, items, scorer, hf, Instance, batch_size))
        return rows
    finally:
        shutil.rmtree(work, ignore_errors=True)


def compare(ctx: Context, name: str, items: list[tuple], scorer: ContinuationScorer, hf, Instance,
            batch_size: int) -> Row:
    """Items per second of both scorers on `items`, interleaved, and whether their accuracies agree."""
    from tfkit.evaluation.loglikelihood import Group

    requests = [Instance("loglikelihood", {}, (context, " " + choice), k)
                for k, (context, choices, _) in enumerate(items) for choice in choices]

    def tfkit() -> list[float]:
        groups = []
        for context, choices, _ in items:
            pairs = [scorer.encode_pair(context, " " + c) for c in choices]
            groups.append(Group(pairs[0][0], [ids for _, ids in pairs]))
        return [lp for scores in scorer.score(groups) for lp, _ in scores]

    def lm_eval() -> list[float]:
        return [lp for lp, _ in hf.loglikelihood(requests, disable_tqdm=True)]

    ours, theirs = tfkit(), lm_eval()
    same = accuracy(items, ours) == accuracy(items, theirs)
    gap = max(abs(a - b) for a, b in zip(ours, theirs))
    samples = time_interleaved({"tfkit": tfkit, "lm-eval": lm_eval}, ctx.device, warmup=1,
                               rounds=2 if ctx.quick else 5, calls=1, timer=ctx.timer)
    n = len(items)
    return Row("tasks", f"{name} multiple choice, {n} items x {CHOICES}, batch {batch_size}: tfkit --task scorer "
                        "vs lm-eval HFLM on the export-hf folder", "items/s",
               n / median(samples["tfkit"]), n / median(samples["lm-eval"]), goal=GOAL,
               paired=paired_ratio(samples["tfkit"], samples["lm-eval"]),
               note=f"acc {accuracy(items, ours):.3f} vs {accuracy(items, theirs):.3f}"
                    f" ({'identical' if same else 'DIFFERENT'}), max |dlogp| {gap:.1e}",
               extra={"samples_s": samples, "acc_identical": same, "max_abs_logprob_diff": gap})
