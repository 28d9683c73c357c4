"""Settings and data shared by every test. Tests read nothing outside the repository."""

import os
from pathlib import Path

import pytest
import torch
import typer.testing

from tfkit.tokenization import TokenizerSpec, train_tokenizer
from tfkit.tokenization.stdlib_corpus import iter_stdlib_documents
from tfkit.trainer import optim
from worker_end import pytest_sessionfinish  # noqa: F401  (a hook: how an xdist worker ends, quietly)

ENGLISH_CHARS = 400_000


@pytest.fixture(autouse=True, scope="session")
def one_thread():
    """Tests use tiny tensors: one intra-op thread is faster for them, and on a busy 2-core machine several
    times steadier (threads that wait for each other at every op get descheduled). OMP_NUM_THREADS=1 too:
    `train.threads: auto` keeps a user's OMP setting, so in-process runs compute with one thread exactly as
    the subprocesses of the resume tests do. Restored at the end."""
    threads, omp = torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS")
    torch.set_num_threads(1)
    os.environ["OMP_NUM_THREADS"] = "1"
    yield
    torch.set_num_threads(threads)
    if omp is None:
        os.environ.pop("OMP_NUM_THREADS", None)
    else:
        os.environ["OMP_NUM_THREADS"] = omp


@pytest.fixture(autouse=True, scope="session")
def cli_built_once():
    """typer's CliRunner turns the app into a click command anew at every invoke, reading every command's
    signature (about 20 ms, 14 s over the suite); the tests build it once. What a command does is still
    looked up when it runs, so a test that patches a library function sees its patch."""
    built: dict[int, object] = {}
    original = typer.testing._get_command

    def get_command(app):
        if id(app) not in built:
            built[id(app)] = original(app)
        return built[id(app)]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(typer.testing, "_get_command", get_command)
        yield


NATIVE_BF16 = optim.native_bf16  # the hardware probe, taken before `fp32_by_default` replaces it


@pytest.fixture
def native_bf16_probe():
    """The real hardware probe, for the tests of the probe itself."""
    return NATIVE_BF16


@pytest.fixture(autouse=True, scope="session")
def fp32_by_default():
    """`train.precision: auto` is bf16 on hardware with native bf16 and fp32 elsewhere, so the same test
    would check different arithmetic on different machines. In-process tests see no native bf16 (auto =
    fp32, what every expected value here assumes); tests of bf16 ask for it, and tests of `auto` patch
    `native_bf16` themselves."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(optim, "native_bf16", lambda device: False)
        yield


@pytest.fixture(scope="session")
def english_text() -> str:
    """About 400 kB of real English prose, blank-line separated: the docstrings of the running Python's
    standard library (tfkit's built-in `stdlib:docs` corpus), so it is present wherever tfkit runs. Read
    lazily: only the files these 400 kB come from are parsed."""
    text, size = [], 0
    for doc in iter_stdlib_documents("stdlib:docs:train"):
        text.append(doc)
        size += len(doc) + 2
        if size >= ENGLISH_CHARS:
            break
    return "\n\n".join(text)


@pytest.fixture(scope="session")
def english_file(english_text, tmp_path_factory):
    """`english_text` as a UTF-8 file, for tests that pass a corpus path."""
    path = tmp_path_factory.mktemp("english") / "english.txt"
    path.write_text(english_text, encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def eval_tokenizers(english_text: str, tmp_path_factory) -> dict[str, Path]:
    """{"bpe": folder, "wordpiece": folder}: tokenizers of 300 tokens trained on the first 60 kB of
    `english_text`, for the evaluation tests (read-only)."""
    out = {}
    for kind in ("bpe", "wordpiece"):
        folder = tmp_path_factory.mktemp(kind)
        train_tokenizer(TokenizerSpec(kind=kind, vocab_size=300), [english_text[:60_000]], folder, show_progress=False)
        out[kind] = folder
    return out


@pytest.fixture(scope="session")
def valid_file(english_text: str, tmp_path_factory) -> Path:
    """6 kB of English the evaluation tests' tokenizers never saw, as a held-out text file."""
    path = tmp_path_factory.mktemp("data") / "valid.txt"
    path.write_text(english_text[-6_000:], encoding="utf-8")
    return path
