"""Parquet, Arrow (`datasets` folders), .gz and .zst corpora: the same documents, tokenizer and token shards
as the same text given plainly, a model trained from Parquet, and one-line errors for damaged files.

Every fixture is written here with pyarrow, gzip and zstandard (the `data` extra, part of the `test` extra);
the `datasets` folder is written as `datasets.Dataset.save_to_disk` writes one, without that package."""

import gzip
import json
import subprocess
import sys

import numpy as np
import pytest
from typer.testing import CliRunner

from tfkit.checkpoints.run_record import read_metrics
from tfkit.cli.main import app
from tfkit.errors import DataError
from tfkit.tokenization.corpus import check_text_field, corpus_size, iter_documents, iter_pieces, text_size
from tfkit.tokenization.readers import ReadStats
from tfkit.tokenization.shards import prepare_tokens
from tfkit.tokenization.train import TokenizerSpec, load_tokenizer, train_tokenizer

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
zstandard = pytest.importorskip("zstandard")

runner = CliRunner()
SCHEMA = pa.schema([("id", pa.int64()), ("text", pa.string())])


def _batch(docs: list[str], start: int):
    return pa.record_batch([pa.array(range(start, start + len(docs)), pa.int64()), pa.array(docs)], schema=SCHEMA)


def write_parquet(path, docs: list[str], row_group_size: int = 60) -> None:
    pq.write_table(pa.Table.from_batches([_batch(docs, 0)]), path, row_group_size=row_group_size)


def write_dataset(folder, docs: list[str], shards: int = 2, rows_per_batch: int = 50) -> None:
    """A folder as `Dataset.save_to_disk` leaves it: Arrow IPC *stream* shards, state.json, dataset_info.json."""
    folder.mkdir()
    names = [f"data-{i:05d}-of-{shards:05d}.arrow" for i in range(shards)]
    per = -(-len(docs) // shards)
    for i, name in enumerate(names):
        part = docs[i * per:(i + 1) * per]
        with pa.OSFile(str(folder / name), "wb") as sink, pa.ipc.new_stream(sink, SCHEMA) as writer:
            for j in range(0, len(part), rows_per_batch):
                writer.write_batch(_batch(part[j:j + rows_per_batch], i * per + j))
    (folder / "state.json").write_text(json.dumps({
        "_data_files": [{"filename": n} for n in names], "_fingerprint": "0123456789abcdef",
        "_format_columns": None, "_format_kwargs": {}, "_format_type": None, "_output_all_columns": False,
        "_split": "train"}, indent=2))
    (folder / "dataset_info.json").write_text(json.dumps({
        "citation": "", "description": "", "homepage": "", "license": "",
        "features": {"id": {"dtype": "int64", "_type": "Value"}, "text": {"dtype": "string", "_type": "Value"}}},
        indent=2))


@pytest.fixture(scope="module")
def docs(english_text) -> list[str]:
    """About 150 kB of English paragraphs, one document each."""
    return [d for d in english_text[:150_000].split("\n\n") if d.strip()]


@pytest.fixture(scope="module")
def corpora(docs, tmp_path_factory):
    """Every format, from the same documents, and the plain files they must read as."""
    root = tmp_path_factory.mktemp("formats")
    jsonl = "".join(json.dumps({"text": d}) + "\n" for d in docs).encode()
    text = "\n\n".join(docs).encode()
    (root / "docs.jsonl").write_bytes(jsonl)
    (root / "docs.txt").write_bytes(text)
    (root / "docs.jsonl.gz").write_bytes(gzip.compress(jsonl))
    (root / "docs.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(jsonl))
    (root / "docs.txt.gz").write_bytes(gzip.compress(text[:1000]) + gzip.compress(text[1000:]))  # two members
    with open(root / "docs.txt.zst", "wb") as f, zstandard.ZstdCompressor().stream_writer(f) as w:
        w.write(text)  # streamed: no content size in the frame header
    write_parquet(root / "docs.parquet", docs)
    (root / "shards").mkdir()
    half = len(docs) // 2
    write_parquet(root / "shards" / "part-0.parquet", docs[:half])
    write_parquet(root / "shards" / "part-1.parquet", docs[half:])
    write_dataset(root / "dataset", docs)
    with pa.OSFile(str(root / "file-format.arrow"), "wb") as sink, pa.ipc.new_file(sink, SCHEMA) as writer:
        writer.write_batch(_batch(docs, 0))
    return root


CASES = {  # spec -> the plain file holding the same documents
    "docs.jsonl.gz": "docs.jsonl", "docs.jsonl.zst": "docs.jsonl", "docs.txt.gz": "docs.txt",
    "docs.txt.zst": "docs.txt", "docs.parquet": "docs.jsonl", "shards": "docs.jsonl", "dataset": "docs.jsonl",
    "file-format.arrow": "docs.jsonl",
}


@pytest.mark.parametrize("spec", sorted(CASES))
def test_each_format_reads_the_documents_of_its_plain_twin(spec, corpora):
    stats = ReadStats()
    assert list(iter_pieces(str(corpora / spec), stats=stats)) == list(iter_pieces(str(corpora / CASES[spec])))
    assert stats.file_bytes == corpus_size(str(corpora / spec))  # the progress bar ends at its total


@pytest.mark.parametrize("spec", sorted(CASES))
def test_the_decoded_text_size_estimate_is_near_the_text_read(spec, corpora):
    """Tokenizer training counts characters against text_size: the compressed size would end its bar at
    3-4x 100%."""
    chars = sum(len(t) for t in iter_documents(str(corpora / spec)))
    assert 0.8 * chars <= text_size(str(corpora / spec)) <= 1.5 * chars
    assert corpus_size(str(corpora / spec)) < 0.6 * chars or not spec.endswith((".gz", ".zst"))


@pytest.mark.parametrize("spec", sorted(CASES))
def test_a_tokenizer_trained_from_each_format_is_byte_identical(spec, corpora, tmp_path):
    outs = []
    for name in (spec, CASES[spec]):
        outs.append(tmp_path / name.replace(".", "-"))
        result = runner.invoke(app, ["train-tokenizer", str(corpora / name), "--out", str(outs[-1]),
                                     "--vocab-size", "500", "-q"])
        assert result.exit_code == 0, result.output
    assert (outs[0] / "tokenizer.json").read_bytes() == (outs[1] / "tokenizer.json").read_bytes()


@pytest.fixture(scope="module")
def bpe(docs, tmp_path_factory):
    folder = tmp_path_factory.mktemp("bpe")
    train_tokenizer(TokenizerSpec(kind="bpe", vocab_size=500), docs, folder, show_progress=False)
    return load_tokenizer(folder)


@pytest.mark.parametrize("spec", sorted(CASES))
def test_token_shards_from_each_format_equal_the_plain_ones(spec, corpora, bpe, tmp_path):
    got = prepare_tokens(str(corpora / spec), bpe, tmp_path, show_progress=False)
    want = prepare_tokens(str(corpora / CASES[spec]), bpe, tmp_path, show_progress=False)
    np.testing.assert_array_equal(got.tokens, want.tokens)
    np.testing.assert_array_equal(got.doc_starts, want.doc_starts)


def test_a_datasets_folder_is_its_arrow_shards_and_a_dataset_dict_asks_for_a_split(corpora, tmp_path):
    assert "state.json" not in "".join(iter_documents(str(corpora / "dataset")))  # its JSON is not text
    root = tmp_path / "wiki"
    root.mkdir()
    write_dataset(root / "train", ["a train document"], shards=1)
    write_dataset(root / "test", ["a test document"], shards=1)
    (root / "dataset_dict.json").write_text(json.dumps({"splits": ["train", "test"]}))
    assert list(iter_documents(str(root / "train"))) == ["a train document"]
    with pytest.raises(DataError, match=r"DatasetDict with splits train, test; name one split's folder"):
        list(iter_documents(str(root)))


def test_text_field_picks_a_parquet_column_and_a_compressed_jsonl_key(tmp_path):
    pq.write_table(pa.table({"body": ["from parquet"], "text": ["not this"]}), tmp_path / "a.parquet")
    (tmp_path / "b.jsonl.gz").write_bytes(gzip.compress(b'{"body": "from jsonl"}\n'))
    for name, want in (("a.parquet", "from parquet"), ("b.jsonl.gz", "from jsonl")):
        check_text_field(str(tmp_path / name), "body")  # accepted: these files have fields
        assert list(iter_documents(str(tmp_path / name), text_field="body")) == [want]


def test_a_tiny_gpt_trains_from_a_folder_of_parquet_shards_and_evaluates_on_zstd(corpora, tmp_path):
    sets = [f"data.train={corpora / 'shards'}", "data.valid=null", "train.max_steps=3", "train.batch_size=2",
            "data.seq_len=32", "train.log_every=1", "train.eval_every=1000", "train.save_every=1000",
            "eval.batches=1", "eval.sample_tokens=4", "tokenizer.vocab_size=400", "log.progress=false",
            "log.plot=false", "log.tensorboard=false", "train.device=cpu"]
    result = runner.invoke(app, ["pretrain", "gpt-tiny", "--run-dir", str(tmp_path / "run")]
                           + [a for s in sets for a in ("--set", s)])
    assert result.exit_code == 0, result.output
    losses = [r["loss"] for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if "loss" in r]
    assert len(losses) == 3 and all(np.isfinite(losses))
    result = runner.invoke(app, ["eval", str(tmp_path / "run"), "--data", str(corpora / "docs.jsonl.zst"),
                                 "--max-batches", "1", "--json", str(tmp_path / "eval.json")])
    assert result.exit_code == 0, result.output
    assert np.isfinite(json.loads((tmp_path / "eval.json").read_text())[0]["loss"])


def _damaged_parquet(t):
    write_parquet(t / "bad.parquet", [f"document {i} " * 20 for i in range(300)], row_group_size=100)
    column = pq.ParquetFile(t / "bad.parquet").metadata.row_group(1).column(1)  # (id, text): the text
    offset = column.dictionary_page_offset or column.data_page_offset
    data = bytearray((t / "bad.parquet").read_bytes())
    data[offset:offset + 8] = b"\xff" * 8  # its first page header
    (t / "bad.parquet").write_bytes(bytes(data))
    return t / "bad.parquet"


def _write(path, data: bytes):
    path.write_bytes(data)
    return path


def _truncated_arrow(t):
    write_dataset(t / "ds", [f"document {i} " * 20 for i in range(300)], shards=1)
    shard = t / "ds" / "data-00000-of-00001.arrow"
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size * 2 // 3])
    return t / "ds"


JSONL = b"".join(b'{"text": "line %d"}\n' % i for i in range(2000))
BAD_INPUT = {
    "parquet without the column": (
        lambda t: (pq.write_table(pa.table({"id": [1], "body": ["x"]}), t / "p.parquet"), t / "p.parquet")[1],
        "p.parquet: no column 'text' (columns: id, body); name the one holding the text with --text-field"),
    "damaged parquet row group": (_damaged_parquet, "bad.parquet: row group 1: damaged Parquet data"),
    "not a parquet file": (lambda t: _write(t / "x.parquet", b"PAR1 and then nothing"),
                           "x.parquet: not a readable Parquet file"),
    "truncated arrow shard": (_truncated_arrow, "data-00000-of-00001.arrow: record batch 4: damaged Arrow data"),
    "truncated gzip": (lambda t: _write(t / "c.jsonl.gz", gzip.compress(JSONL)[:-600]),
                       "c.jsonl.gz: the gzip stream ends before its end marker"),
    "not gzip": (lambda t: _write(t / "c.txt.gz", b"plain text, misnamed"), "c.txt.gz: damaged gzip data"),
    "truncated zstd": (lambda t: _write(t / "c.jsonl.zst", zstandard.ZstdCompressor().compress(JSONL)[:-50]),
                       "c.jsonl.zst: the zstd stream ends before its end marker"),
    "invalid json in jsonl.gz": (lambda t: _write(t / "c.jsonl.gz", gzip.compress(b'{"text": "a"}\n\n{"text": b}\n')),
                                 "c.jsonl.gz:3: invalid JSON"),
    "compressed what": (lambda t: _write(t / "corpus.gz", gzip.compress(b"text")),
                        "corpus.gz: name a compressed corpus for what it holds"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUT))
def test_bad_input_is_one_line_naming_the_file_and_exit_2(case, tmp_path):
    make, expected = BAD_INPUT[case]
    corpus = make(tmp_path)
    result = runner.invoke(app, ["train-tokenizer", str(corpus), "--out", str(tmp_path / "tok"), "-q"])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], result.stderr
    assert not (tmp_path / "tok").exists()  # nothing half-written


@pytest.mark.parametrize("module, name, what", [("pyarrow", "p.parquet", "reading Parquet"),
                                                ("pyarrow", "dataset", "reading Arrow"),
                                                ("zstandard", "c.txt.zst", "reading zstd")])
def test_a_missing_library_names_the_extra(module, name, what, corpora, tmp_path, monkeypatch):
    (tmp_path / "p.parquet").write_bytes((corpora / "docs.parquet").read_bytes())
    (tmp_path / "c.txt.zst").write_bytes((corpora / "docs.txt.zst").read_bytes())
    write_dataset(tmp_path / "dataset", ["text"], shards=1)
    for loaded in [m for m in sys.modules if m == module or m.startswith(module + ".")]:
        monkeypatch.setitem(sys.modules, loaded, None)  # `import pyarrow` now raises ImportError
    result = runner.invoke(app, ["train-tokenizer", str(tmp_path / name), "--out", str(tmp_path / "tok"), "-q"])
    assert result.exit_code == 2
    assert f'{what} needs {module}: pip install "tfkit[data]"' in result.stderr.strip().splitlines()[-1]


def test_a_corpus_damaged_midway_leaves_no_token_cache(bpe, tmp_path, monkeypatch):
    """The error comes from the read-ahead thread after batches were written: it is raised, nothing kept."""
    import tfkit.tokenization.shards as shards_module

    monkeypatch.setattr(shards_module, "BATCH_CHARS", 2000)
    (tmp_path / "c.jsonl.gz").write_bytes(gzip.compress(JSONL)[:-600])
    with pytest.raises(DataError, match="ends before its end marker"):
        prepare_tokens(str(tmp_path / "c.jsonl.gz"), bpe, tmp_path / "cache", show_progress=False)
    assert list((tmp_path / "cache").iterdir()) == []


def test_the_data_libraries_are_imported_only_to_read_their_files():
    code = ("import sys, tfkit.tokenization.corpus, tfkit.tokenization.shards; "
            "print(sorted(m for m in ('pyarrow', 'zstandard') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_seq2seq_pairs_read_from_every_record_format(tmp_path):
    from tfkit.tokenization.pairs import is_pair_data, read_pairs

    pairs = [(f"source {i}", f"target {i}") for i in range(300)]
    records = "".join(json.dumps({"src": s, "tgt": t}) + "\n" for s, t in pairs).encode()
    (tmp_path / "p.jsonl.gz").write_bytes(gzip.compress(records))
    (tmp_path / "p.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(records))
    table = pa.table({"src": [s for s, _ in pairs], "tgt": [t for _, t in pairs]})
    pq.write_table(table, tmp_path / "p.parquet", row_group_size=100)
    with pa.OSFile(str(tmp_path / "p.arrow"), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=64)
    for name in ("p.jsonl.gz", "p.jsonl.zst", "p.parquet", "p.arrow"):
        spec = str(tmp_path / name)
        assert is_pair_data(spec, "src") and not is_pair_data(spec, "text")
        assert read_pairs(spec, "src", "tgt") == pairs
    pq.write_table(pa.table({"src": ["a", None], "tgt": ["b", "c"]}), tmp_path / "null.parquet")
    with pytest.raises(DataError, match=r"null.parquet: row 1: 'src' is null, expected a string"):
        read_pairs(str(tmp_path / "null.parquet"), "src", "tgt")
