"""MLM batch preparation: a whole masked batch from the token stream, against HuggingFace's masking.

tfkit: `MlmDataset.batch(i, B)`: rows cut from the packed token stream, special tokens found, BERT masking
(exact 15% per row, 80/10/10) drawn from counter-based randomness for the whole batch at once.
Baseline: the same rows and special-token mask through `DataCollatorForLanguageModeling.torch_mask_tokens`
(vectorised Bernoulli masking with torch's generator), the masking step every HuggingFace MLM script
runs. At V = 30,522 (BERT's vocabulary), shapes 256 x 128 and 64 x 512.
"""

from __future__ import annotations

import types

import numpy as np

from tfkit.tokenization.batches import MlmDataset

from .common import Context, Row, median, paired_ratio, time_interleaved

VOCAB = 30_522
SHAPES = ((256, 128), (64, 512))
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def hf_collator():
    """A DataCollatorForLanguageModeling over a BERT-sized vocabulary, or None without transformers."""
    try:
        from tokenizers import Tokenizer, models
        from transformers import DataCollatorForLanguageModeling, PreTrainedTokenizerFast
    except ImportError:
        return None
    vocab = {**{t: i for i, t in enumerate(SPECIALS)}, **{f"w{i}": i for i in range(len(SPECIALS), VOCAB)}}
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="[UNK]")),
                                  pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]",
                                  mask_token="[MASK]")
    return DataCollatorForLanguageModeling(tok, mlm_probability=0.15)


def run(ctx: Context) -> list[Row]:
    collator = hf_collator()
    if collator is None:
        ctx.skip("batches: HuggingFace baseline needs transformers")
        return []
    tok = types.SimpleNamespace(cls_id=2, sep_id=3, mask_id=4, bos_id=None, eos_id=None, vocab_size=VOCAB,
                                special_ids=list(range(len(SPECIALS))), kind="wordpiece", path="benchmark")
    tokens = np.random.default_rng(0).integers(len(SPECIALS), VOCAB, 2_000_000).astype(np.uint16)
    rows = []
    for batch_size, length in SHAPES[:1] if ctx.quick else SHAPES:
        ctx.log(f"batches: MLM {batch_size} x {length}")
        dataset = MlmDataset(tokens, length, 0, tok)
        step = iter(range(10**9))
        originals = dataset.originals(np.arange(batch_size))  # (B, L): the same rows for the baseline

        def tfkit() -> None:
            dataset.batch(next(step), batch_size)

        def hf() -> None:
            special = dataset.is_special[originals]  # (B, L)
            collator.torch_mask_tokens(originals.clone(), special_tokens_mask=special)

        samples = time_interleaved({"tfkit": tfkit, "hf": hf}, ctx.device, warmup=1, rounds=3 if ctx.quick else 7,
                                   calls=3 if ctx.quick else 10, timer=ctx.timer)
        rows.append(Row("batches", f"MLM batch {batch_size}x{length}, V={VOCAB:,}: MlmDataset.batch vs HF "
                                   "DataCollatorForLanguageModeling.torch_mask_tokens", "ms",
                        1000 * median(samples["tfkit"]), 1000 * median(samples["hf"]), higher_is_better=False,
                        paired=paired_ratio(samples["tfkit"], samples["hf"]),
                        note="tfkit: rows cut from the stream too; exact 15% per row",
                        extra={"samples_s": samples}))
    return rows
