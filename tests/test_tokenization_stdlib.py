"""The built-in stdlib corpus: present, deterministic, and split disjointly by file."""

from tfkit.tokenization.corpus import corpus_fingerprint, iter_pieces
from tfkit.tokenization.stdlib_corpus import is_valid_file, source_files, stdlib_documents


def test_docs_and_code_are_non_empty_prose_and_source():
    docs, code = stdlib_documents("stdlib:docs"), stdlib_documents("stdlib:code")
    assert len(docs) > 1000 and sum(map(len, docs)) > 1_000_000
    assert len(code) > 100 and any("def " in c for c in code)
    assert all(len(d) >= 40 and d == d.strip() for d in docs)
    assert any(d.startswith("Return") for d in docs)  # docstrings, cleaned with inspect.cleandoc
    assert not any("/test/" in "/" + rel or rel.startswith(("idlelib/", "test/")) for rel, _ in source_files())


def test_split_is_deterministic_and_disjoint():
    train, valid = stdlib_documents("stdlib:code:train"), stdlib_documents("stdlib:code:valid")
    everything = stdlib_documents("stdlib:code")
    assert valid and len(train) + len(valid) == len(everything)
    assert not set(train) & set(valid)
    assert 0.01 < len(valid) / len(everything) < 0.15
    assert stdlib_documents("stdlib:code:valid") == valid  # same order every call
    assert is_valid_file("json/decoder.py") == is_valid_file("json/decoder.py")


def test_stdlib_spec_streams_documents():
    pieces = list(iter_pieces("stdlib:docs:valid"))
    assert pieces and all(new for _, new in pieces)
    assert corpus_fingerprint("stdlib:docs:valid") != corpus_fingerprint("stdlib:docs:train")
