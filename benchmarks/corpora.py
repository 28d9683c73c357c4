"""Token preparation from every corpus format: `prepare_tokens` against a raw `encode_batch` of the same text.

A user's corpus arrives as Parquet shards, a `datasets` folder, compressed JSON lines or plain text; tfkit
streams each a record batch at a time, encodes with every core while the next batch is read, and writes
memory-mapped shards. The baseline is what that work cannot beat: one `encode_batch` per 4M characters
of the same documents, already in memory, on the same tokenizer and every core. The goal is that
preparing tokens from any format runs at >= 0.9x that rate.

The corpus is the built-in `stdlib:docs:train` documents, repeated in a seeded shuffled order until it
reaches `--corpus-mb` (default 50 MB; 1 MB with `--quick`): the same text on every machine, large enough
that the fixed costs of a cache folder do not count. Each format holds exactly these documents (one per
record; blank-line separated in the text files). Peak memory (resident set size of a fresh process that
does nothing but prepare the tokens) is in each row's note and JSON: it must stay bounded whatever the
corpus size (< 1 GB), because records are streamed and never held whole.
"""

from __future__ import annotations

import gzip
import json
import random
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from tfkit.tokenization.shards import prepare_tokens
from tfkit.tokenization.stdlib_corpus import stdlib_documents
from tfkit.tokenization.train import TokenizerSpec, load_tokenizer, train_tokenizer

from .common import Context, Goal, Row, median, paired_ratio, time_interleaved

GOAL = Goal(">= 0.9x raw encode_batch", 0.9)
RAW_BATCH_CHARS = 4_000_000  # characters per raw encode_batch call
VOCAB = 8192
# VmHWM, not getrusage's ru_maxrss: Linux keeps ru_maxrss across exec, so a child would report the peak of
# the benchmark process that forked it; VmHWM belongs to the child's own address space.
PEAK_RSS_SCRIPT = """
import re, sys
from pathlib import Path
from tfkit.tokenization.shards import prepare_tokens
from tfkit.tokenization.train import load_tokenizer
prepare_tokens(sys.argv[1], load_tokenizer(Path(sys.argv[2])), Path(sys.argv[3]), show_progress=False)
print(re.search(r"VmHWM:\\s+(\\d+) kB", open("/proc/self/status").read()).group(1))
"""


def corpus_documents(megabytes: float, seed: int = 0) -> list[str]:
    """The built-in documents, shuffled with `seed` and repeated (each pass reshuffled) to `megabytes`."""
    base = [d for d in stdlib_documents("stdlib:docs:train") if d.strip()]
    rng, out, size = random.Random(seed), [], 0
    while size < megabytes * 1e6:
        rng.shuffle(base)
        for doc in base:
            out.append(doc)
            size += len(doc.encode()) + 2
            if size >= megabytes * 1e6:
                break
    return out


def write_formats(docs: list[str], folder: Path, ctx: Context) -> dict[str, Path]:
    """The documents in every format tfkit reads; formats whose library is missing are skipped (noted)."""
    folder.mkdir(parents=True, exist_ok=True)
    text = "\n\n".join(docs).encode()
    jsonl = "".join(json.dumps({"text": d}) + "\n" for d in docs).encode()
    out = {"txt": folder / "docs.txt", "txt.gz": folder / "docs.txt.gz",
           "jsonl": folder / "docs.jsonl", "jsonl.gz": folder / "docs.jsonl.gz"}
    out["txt"].write_bytes(text)
    out["txt.gz"].write_bytes(gzip.compress(text, compresslevel=6))
    out["jsonl"].write_bytes(jsonl)
    out["jsonl.gz"].write_bytes(gzip.compress(jsonl, compresslevel=6))
    try:
        import zstandard
    except ImportError:
        ctx.skip("corpora: .zst formats need zstandard (pip install 'tfkit[data]')")
    else:
        out["txt.zst"], out["jsonl.zst"] = folder / "docs.txt.zst", folder / "docs.jsonl.zst"
        out["txt.zst"].write_bytes(zstandard.ZstdCompressor().compress(text))
        out["jsonl.zst"].write_bytes(zstandard.ZstdCompressor().compress(jsonl))
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        ctx.skip("corpora: Parquet and Arrow need pyarrow (pip install 'tfkit[data]')")
        return out
    table = pa.table({"text": pa.array(docs, pa.string())})
    out["parquet"] = folder / "docs.parquet"
    pq.write_table(table, out["parquet"], row_group_size=4096)
    dataset = folder / "dataset"  # as `datasets.Dataset.save_to_disk` leaves it: Arrow stream shards + state.json
    dataset.mkdir()
    names = [f"data-{i:05d}-of-00002.arrow" for i in range(2)]
    half = -(-len(docs) // 2)
    for i, name in enumerate(names):
        part = table.slice(i * half, half)
        with pa.OSFile(str(dataset / name), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
            for batch in part.to_batches(max_chunksize=1000):
                writer.write_batch(batch)
    (dataset / "state.json").write_text(json.dumps({"_data_files": [{"filename": n} for n in names],
                                                    "_split": "train"}))
    (dataset / "dataset_info.json").write_text(json.dumps({"features": {"text": {"dtype": "string",
                                                                                 "_type": "Value"}}}))
    out["datasets folder"] = dataset
    return out


def raw_encoder(docs: list[str], tokenizer_dir: Path) -> Callable[[], object]:
    """The baseline: the documents, already in memory, through `encode_batch` in RAW_BATCH_CHARS batches."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    batches, batch, size = [], [], 0
    for doc in docs:
        batch.append(doc)
        size += len(doc)
        if size >= RAW_BATCH_CHARS:
            batches.append(batch)
            batch, size = [], 0
    batches.append(batch)

    def raw() -> None:
        for part in batches:
            tokenizer.encode_batch(part, add_special_tokens=False)

    return raw


def peak_rss_mb(corpus: Path, tokenizer_dir: Path, cache: Path) -> float:
    """Peak resident memory of a fresh process that prepares the tokens of `corpus` and does nothing else."""
    done = subprocess.run([sys.executable, "-c", PEAK_RSS_SCRIPT, str(corpus), str(tokenizer_dir), str(cache)],
                          capture_output=True, text=True, check=True)
    return int(done.stdout.strip().splitlines()[-1]) / 1024  # kB -> MB


def run(ctx: Context) -> list[Row]:
    megabytes = 1.0 if ctx.quick else ctx.corpus_mb
    work = Path(tempfile.mkdtemp(prefix="tfkit-bench-corpora-"))
    try:
        ctx.log(f"corpora: writing {megabytes:g} MB of the built-in documents in every format")
        docs = corpus_documents(megabytes)
        formats = write_formats(docs, work / "corpora", ctx)
        tokenizer_dir = work / "tokenizer"
        train_tokenizer(TokenizerSpec(kind="bpe", vocab_size=1024 if ctx.quick else VOCAB),
                        docs[: max(1, len(docs) // max(1, int(megabytes)))], tokenizer_dir, show_progress=False)
        tokenizer = load_tokenizer(tokenizer_dir)
        raw = raw_encoder(docs, tokenizer_dir)
        mb = sum(len(d.encode()) for d in docs) / 1e6
        rounds = 1 if ctx.quick else 2
        calls = iter(range(1_000_000))
        rows = []
        for name, path in formats.items():
            ctx.log(f"corpora: {name}")

            def tfkit(path: Path = path) -> None:  # a fresh cache every call: never a cache hit
                prepare_tokens(str(path), tokenizer, work / f"cache-{next(calls)}", show_progress=False)

            samples = time_interleaved({"tfkit": tfkit, "raw": raw}, ctx.device, warmup=0, rounds=rounds, calls=1,
                                       timer=ctx.timer)
            peak = None if ctx.quick else peak_rss_mb(path, tokenizer_dir, work / f"cache-peak-{name}")
            note = f"{mb:.0f} MB" + (f", peak RSS {peak:.0f} MB" if peak is not None else "")
            rows.append(Row("corpora", f"prepare_tokens {name} vs raw encode_batch", "MB/s",
                            mb / median(samples["tfkit"]), mb / median(samples["raw"]), goal=GOAL, note=note,
                            paired=paired_ratio(samples["tfkit"], samples["raw"]),
                            extra={"samples_s": samples, "megabytes": mb, "peak_rss_mb": peak}))
            for cache in work.glob("cache-*"):
                shutil.rmtree(cache, ignore_errors=True)
        return rows
    finally:
        shutil.rmtree(work, ignore_errors=True)
