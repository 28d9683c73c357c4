"""Weighted mixtures of sources (issue 47): three measurements, each against a baseline from the same run.

1. shares: the realised share of each source's tokens in the packed rows (`MixedDataset.batch` input_ids)
   over 10M training tokens, against the weight asked, for weights 0.6/0.3/0.1 and 0.59/0.40/0.01 (goal:
   within 0.5 percentage points);
2. throughput: tokens/s of the rows of a three-source mixture against `ClmDataset.batch` over one source of
   the same total size, B=32 x T=256, one thread, interleaved; a timed call reads one window's worth of
   batches, so the building of each window counts (goal >= 0.95x);
3. memory: the peak of the memory a fresh process allocates (RssAnon) while it opens a 1 GB mixture (three
   sources of token shards) and reads three windows of batches, against the same for a 10 MB mixture (goal:
   within 10%); the shards' pages the process maps (page cache, which the kernel takes back under pressure, and
   which reading any memory-mapped corpus at random grows) are reported beside it.

The sources are token shards written here: what these numbers depend on is the documents' lengths, not their
words, so their lengths are drawn from log-normal distributions like a docstring corpus (median 60 tokens), a
source-code corpus (median 1,500, a long tail) and one book (a single document of every token), and each
source's ids come from its own range, so a row says where each token came from. `--quick`: 200K tokens,
1 MB against 10 MB, small windows.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from tfkit.tokenization.batches import ClmDataset
from tfkit.tokenization.mixture import Mixture, MixedDataset, SourceStream
from tfkit.tokenization.shards import TokenShards

from .common import Context, Goal, Row, median, paired_ratio, time_interleaved

SPAN = 20_000  # ids of source s: s * SPAN + (0 .. SPAN-1)
SHAPES = {"docs": (4.1, 0.9), "code": (7.3, 1.1), "book": None}  # log-normal (mu, sigma) of document lengths
SEQ, BATCH, SEED = 256, 32, 1337
SHARE_GOAL = Goal("within 0.5 points of the weight", 0.0, max_gap=0.5)


def write_source(folder: Path, index: int, kind: str, tokens: int, seed: int) -> Path:
    """A token-shards folder of `tokens` uint16 ids from source `index`'s range, documents as `kind` makes them."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    if SHAPES[kind] is None:
        starts = np.array([0, tokens], np.int64)
    else:
        mu, sigma = SHAPES[kind]
        lengths = np.maximum(1, rng.lognormal(mu, sigma, tokens // int(np.exp(mu)) * 2 + 16).astype(np.int64))
        starts = np.concatenate([[0], np.cumsum(lengths)])
        starts = np.append(starts[starts < tokens], tokens)
    with open(folder / "tokens.bin", "wb") as f:
        for lo in range(0, tokens, 1 << 24):  # 32 MB at a time: a 1 GB source never in memory
            n = min(1 << 24, tokens - lo)
            f.write((index * SPAN + rng.integers(0, SPAN, n)).astype(np.uint16).tobytes())
    starts.astype(np.int64).tofile(folder / "doc_starts.bin")
    (folder / "meta.json").write_text(json.dumps({"num_tokens": tokens, "num_documents": len(starts) - 1}))
    return folder


def open_source(folder: Path) -> TokenShards:
    meta = json.loads((folder / "meta.json").read_text())
    tokens = np.memmap(folder / "tokens.bin", np.uint16, mode="r", shape=(meta["num_tokens"],))
    return TokenShards(tokens, np.memmap(folder / "doc_starts.bin", np.int64, mode="r"), 3 * SPAN, None, {})


def mixed(folders: list[Path], shares: list[float], window: int | None = None) -> MixedDataset:
    streams = [SourceStream(f.name, open_source(f), share, True, SEED, i)
               for i, (f, share) in enumerate(zip(folders, shares))]
    return MixedDataset(Mixture(streams, window_tokens=window), lambda s: ClmDataset.from_shards(s, SEQ, SEED), SEED)


def share_rows(ctx: Context, work: Path) -> list[Row]:
    total = 200_000 if ctx.quick else 10_000_000
    sizes = (100_000, 300_000, 20_000) if ctx.quick else (1_000_000, 6_000_000, 300_000)
    folders = [write_source(work / kind, i, kind, n, i) for i, (kind, n) in enumerate(zip(SHAPES, sizes))]
    rows = []
    for shares in ((0.6, 0.3, 0.1), (0.59, 0.40, 0.01)):
        ctx.log(f"mixture: shares {shares} over {total:,} tokens")
        data = mixed(folders, list(shares), window=1 << 16 if ctx.quick else None)
        counts = np.zeros(3, np.int64)
        for i in range(total // (BATCH * SEQ)):
            counts += np.bincount(data.batch(i, BATCH)["input_ids"].numpy().ravel() // SPAN, minlength=3)
        realised = 100 * counts / counts.sum()
        for (kind, share), value in zip(zip(SHAPES, shares), realised):
            rows.append(Row("mixture", f"share of {kind} in the packed rows, weights {'/'.join(map(str, shares))}, "
                                       f"{counts.sum() / 1e6:.3g}M tokens", "%", float(value), 100 * share,
                            goal=SHARE_GOAL, note=f"{value - 100 * share:+.3f} points"))
            ctx.log(rows[-1].line())
    return rows


def throughput_row(ctx: Context, work: Path) -> Row:
    total = 2_000_000 if ctx.quick else 16_000_000
    window = 1 << 18 if ctx.quick else None
    shares = [0.6, 0.3, 0.1]
    folders = [write_source(work / f"t-{kind}", i, kind, int(total * s), 10 + i)
               for i, (kind, s) in enumerate(zip(SHAPES, shares))]
    one = ClmDataset.from_shards(open_source(write_source(work / "t-single", 0, "docs", total, 20)), SEQ, SEED)
    data = mixed(folders, shares, window)
    per_call = data.per_window // BATCH  # one window's batches: its building counts once per call
    steps = {"tfkit": iter(range(10**9)), "single": iter(range(10**9))}

    def read(dataset, name: str):
        def call() -> None:
            for _ in range(per_call):
                dataset.batch(next(steps[name]), BATCH)
        return call

    ctx.log(f"mixture: throughput, {per_call} batches a call")
    samples = time_interleaved({"tfkit": read(data, "tfkit"), "single": read(one, "single")}, ctx.device, warmup=1,
                               rounds=3 if ctx.quick else 7, calls=1, timer=ctx.timer)
    tokens = per_call * BATCH * SEQ
    row = Row("mixture", f"rows of 3 sources 0.6/0.3/0.1 vs one source of the same size ({total / 1e6:.3g}M tokens), "
                         f"B={BATCH} T={SEQ}, MixedDataset vs ClmDataset .batch", "tok/s",
              tokens / median(samples["tfkit"]), tokens / median(samples["single"]),
              goal=Goal(">= 0.95x one source", 0.95),
              paired=paired_ratio(samples["tfkit"], samples["single"]),
              note=f"window {data.mixture.window:,} tokens, built inside each timed call",
              extra={"samples_s": samples})
    ctx.log(row.line())
    return row


def _status(key: str) -> float:
    """A field of /proc/self/status in MB (Linux), 0 where there is none."""
    status = Path("/proc/self/status")
    lines = status.read_text().splitlines() if status.is_file() else []
    return next((int(line.split()[1]) / 1024 for line in lines if line.startswith(key + ":")), 0.0)


def peak_memory(folders: list[Path], batches: int, window: int | None) -> dict[str, float]:
    """In this process: open the mixture and read `batches` batches. {anon: the peak of the memory the
    process allocates (RssAnon, read after every batch: a window is built inside one), file: the shards' pages
    mapped at the end (page cache the kernel takes back under pressure), hwm: the peak resident set of both}."""
    data = mixed(folders, [0.6, 0.3, 0.1], window)
    anon = _status("RssAnon")
    for i in range(batches):
        data.batch(i, BATCH)
        anon = max(anon, _status("RssAnon"))
    return {"anon": anon, "file": _status("RssFile"), "hwm": _status("VmHWM")}


def memory_row(ctx: Context, work: Path) -> Row:
    small, large = (1e6, 10e6) if ctx.quick else (10e6, 1e9)
    window = 1 << 18 if ctx.quick else None
    peaks = {}
    for label, size in (("small", small), ("large", large)):
        tokens = int(size // 2)  # uint16 ids: 2 bytes a token
        ctx.log(f"mixture: memory, writing a {size / 1e6:.0f} MB mixture")
        folders = [write_source(work / f"m-{label}-{kind}", i, kind, int(tokens * s), 30 + i)
                   for i, (kind, s) in enumerate(zip(SHAPES, (0.6, 0.3, 0.1)))]
        windows = 3 * ((window or 1 << 22) // SEQ // BATCH)  # three windows' batches
        code = (f"import json, sys; from pathlib import Path; from benchmarks.mixture import peak_memory; "
                f"print(json.dumps(peak_memory([Path(p) for p in sys.argv[1:]], {windows}, {window})))")
        done = subprocess.run([sys.executable, "-c", code, *map(str, folders)], capture_output=True, text=True,
                              cwd=Path(__file__).resolve().parents[1], check=True)
        peaks[label] = json.loads(done.stdout.strip().splitlines()[-1])
        for folder in folders:  # the disk back before the next size
            for f in folder.iterdir():
                f.unlink()
    big, little = peaks["large"], peaks["small"]
    row = Row("mixture", f"peak memory reading 3 windows of a {large / 1e6:,.0f} MB mixture vs a {small / 1e6:,.0f} MB "
                         "one (a fresh process each)", "MB", big["anon"], little["anon"], higher_is_better=False,
              goal=Goal("within 10% of the small mixture's", 1 / 1.1),
              note=f"allocated (RssAnon); the shards' mapped page cache {big['file']:.0f} vs {little['file']:.0f} MB",
              extra=peaks)
    ctx.log(row.line())
    return row


def run(ctx: Context) -> list[Row]:
    with tempfile.TemporaryDirectory(prefix="tfkit-bench-mixture-") as tmp:
        work = Path(tmp)
        return [*share_rows(ctx, work), throughput_row(ctx, work), memory_row(ctx, work)]
