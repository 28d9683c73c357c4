"""JSON that is damaged, nested past the recursion limit, of the wrong structure, or naming files outside its
folder, in every file tfkit reads as JSON: checkpoint and HF config.json, tokenizer files, an HF sharded
index, JSON and JSONL corpora, a datasets folder's state.json and dataset_dict.json, metrics.jsonl on
resume. Each is one line naming the file (exit code 2), and nothing is written or changed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from fault_helpers import assert_one_line_error, changes, cli, snapshot

DEEP = "[" * 5000 + "]" * 5000  # past Python's recursion limit at any call depth
DEEP_OBJECT = '{"a": ' * 5000 + "1" + "}" * 5000
NESTED_150 = "[" * 150 + "]" * 150  # within the recursion limit, past what tfkit walks


def _write(text: str):
    return lambda path: path.write_text(text)


def _deep_value(key: str):
    """config.json whose model section's `key` holds a value nested 5,000 levels deep."""
    def edit(path):
        config = json.loads(path.read_text())
        config["model"][key] = "DEEP"
        path.write_text(json.dumps(config).replace('"DEEP"', DEEP))
    return edit


def _edit_json(**keys):
    def edit(path):
        path.write_text(json.dumps({**json.loads(path.read_text()), **keys}))
    return edit


# --- a checkpoint's files, read by eval -------------------------------------------------------------------

CHECKPOINT = {
    "config.json": {"deep-array": _write(DEEP), "deep-object": _write(DEEP_OBJECT), "nested-150": _write(NESTED_150),
                    "d_model-deep": _deep_value("d_model")},
    "tokenizer_config.json": {"deep-array": _write(DEEP), "a-list": _write("[1, 2]"), "a-string": _write('"bpe"'),
                              "specials-a-number": _edit_json(additional_special_tokens=5),
                              "specials-an-object": _edit_json(additional_special_tokens={"a": 1}),
                              "kind-a-list": _edit_json(tfkit_kind=["bpe"])},
    "tokenizer.json": {"deep-array": _write(DEEP), "a-list": _write("[1, 2]"), "null": _write("null")},
}
CHECKPOINT_CASES = [(file, name) for file, damages in CHECKPOINT.items() for name in damages]


@pytest.mark.parametrize(("file", "damage"), CHECKPOINT_CASES, ids=[f"checkpoint-{f}-{d}" for f, d in CHECKPOINT_CASES])
def test_damaged_json_in_a_checkpoint_is_one_line(file, damage, copy_run, tmp_path, monkeypatch):
    monkeypatch.setenv("TFKIT_CACHE", str(tmp_path / ".cache"))
    ckpt = copy_run() / "checkpoints" / "step-4"
    (tmp_path / "text.txt").write_text("Plain text for the evaluation. " * 200)
    CHECKPOINT[file][damage](ckpt / file)
    before = snapshot(tmp_path)
    assert_one_line_error(cli(["eval", ckpt, "--data", tmp_path / "text.txt"]), file)
    assert not changes(before, snapshot(tmp_path))


# --- a HuggingFace folder, read by import-hf ---------------------------------------------------------------

def _sharded(weight_map):
    """Replace model.safetensors by a sharded index whose weight_map is `weight_map` (a shard `shard.safetensors`
    holds the real weights, for the names that point to it)."""
    def edit(folder):
        (folder / "model.safetensors").rename(folder / "shard.safetensors")
        index = {"metadata": {}, "weight_map": weight_map(folder)}
        (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return edit


def _outside(folder):
    shutil.copy(folder / "model.safetensors", folder.parent / "x.safetensors")  # a real file, outside
    return folder.parent / "x.safetensors"


HF = {
    "config-deep": (lambda f: (f / "config.json").write_text(DEEP), "config.json"),
    "config-nested-150": (lambda f: (f / "config.json").write_text(NESTED_150), "config.json"),
    "index-deep": (lambda f: ((f / "model.safetensors").unlink(), (f / "model.safetensors.index.json").write_text(DEEP)),
                   "model.safetensors.index.json"),
    "index-map-a-list": (_sharded(lambda f: ["shard.safetensors"]), "weight_map"),
    "index-shard-a-number": (_sharded(lambda f: {"transformer.wte.weight": 5}), "model.safetensors.index.json"),
    "index-parent-path": (lambda f: (_outside(f), _sharded(lambda f: {"transformer.wte.weight": "../x.safetensors"})(f)),
                          "outside the folder"),
    "index-absolute-path": (lambda f: (_outside(f), _sharded(
        lambda g: {"transformer.wte.weight": str(g.parent / "x.safetensors")})(f)), "outside the folder"),
}


@pytest.fixture(scope="module")
def hf_export(tiny_run, tmp_path_factory):
    out = tmp_path_factory.mktemp("hf") / "hf"
    assert cli(["export-hf", tiny_run[1], "--out", out]).exit_code == 0
    return out


@pytest.mark.parametrize("damage", sorted(HF), ids=[f"hf-{d}" for d in sorted(HF)])
def test_damaged_or_escaping_json_in_an_hf_folder_is_one_line(damage, hf_export, tmp_path):
    folder = tmp_path / "dl" / "hf"
    shutil.copytree(hf_export, folder)
    edit, expected = HF[damage]
    edit(folder)
    before = snapshot(tmp_path)
    assert_one_line_error(cli(["import-hf", folder, "--out", tmp_path / "imported"]), expected)
    assert not changes(before, snapshot(tmp_path))


# --- corpora: JSON, JSONL and datasets folders, read by train-tokenizer ---------------------------------------

def _datasets(state=None, splits=None):
    """A datasets save_to_disk folder `ds` (or a DatasetDict with `splits`) whose state.json is `state`."""
    def make(root: Path) -> Path:
        folder = root / "ds"
        target = folder / "train" if splits is not None else folder
        target.mkdir(parents=True)
        (target / "dataset_info.json").write_text("{}")
        (target / "state.json").write_text(state if isinstance(state, str) else json.dumps(state))
        if splits is not None:
            (folder / "dataset_dict.json").write_text(json.dumps({"splits": splits}))
        return folder
    return make


def _file(name: str, text: str):
    def make(root: Path) -> Path:
        (root / name).write_text(text)
        return root / name
    return make


CORPUS = {
    "jsonl-deep-line": (_file("c.jsonl", '{"text": "fine"}\n' + DEEP + "\n"), "c.jsonl:2"),
    "jsonl-a-number-line": (_file("c.jsonl", '{"text": "fine"}\n5\n'), "c.jsonl:2"),
    "jsonl-null-line": (_file("c.jsonl", '{"text": "fine"}\nnull\n'), "c.jsonl:2"),
    "json-deep": (_file("c.json", "\n" + DEEP), "c.json"),
    "json-a-number": (_file("c.json", "5\n"), "c.json"),
    "json-null": (_file("c.json", "null\n"), "c.json"),
    "json-a-string": (_file("c.json", '\n"a whole corpus as one string"\n'), "c.json"),
    "json-text-a-list": (_file("c.json", '[{"text": ["a", "b"]}]'), "c.json"),
    "state-deep": (_datasets(DEEP), "state.json"),
    "state-a-list": (_datasets([1, 2]), "state.json"),
    "state-files-an-object": (_datasets({"_data_files": {"filename": "data.arrow"}}), "state.json"),
    "state-filename-a-number": (_datasets({"_data_files": [{"filename": 5}]}), "state.json"),
    "state-filename-parent": (_datasets({"_data_files": [{"filename": "../x.arrow"}]}), "outside the folder"),
    "state-filename-absolute": (_datasets({"_data_files": [{"filename": "/etc/passwd"}]}), "outside the folder"),
    "dict-splits-numbers": (_datasets({"_data_files": []}, splits=[1, 2]), "DatasetDict"),
    "dict-splits-deep": (_datasets({"_data_files": []}, splits=json.loads("[" * 90 + "]" * 90)), "DatasetDict"),
}


@pytest.mark.parametrize("damage", sorted(CORPUS), ids=[f"corpus-{d}" for d in sorted(CORPUS)])
def test_damaged_or_escaping_json_in_a_corpus_is_one_line(damage, tmp_path):
    make, expected = CORPUS[damage]
    corpus = make(tmp_path)
    (tmp_path / "x.arrow").write_text("not read")
    before = snapshot(tmp_path)
    assert_one_line_error(cli(["train-tokenizer", corpus, "--out", tmp_path / "tok", "--vocab-size", "300", "-q"]),
                          expected)
    assert not changes(before, snapshot(tmp_path))


# --- metrics.jsonl when a run resumes -----------------------------------------------------------------------

METRICS = {"deep-row": DEEP, "deep-object-row": DEEP_OBJECT, "nested-150-row": NESTED_150}


@pytest.mark.parametrize("damage", sorted(METRICS), ids=[f"resume-metrics-{d}" for d in sorted(METRICS)])
def test_a_deeply_nested_metrics_row_is_one_line_on_resume(damage, tiny_run, copy_run):
    recipe, _ = tiny_run
    run = copy_run()
    metrics = run / "metrics.jsonl"
    metrics.write_text(METRICS[damage] + "\n" + metrics.read_text())
    before = snapshot(run)
    assert_one_line_error(cli(["pretrain", recipe, "--run-dir", run, "--resume", "auto", "--set", "train.max_steps=6"]),
                          "metrics.jsonl")
    assert not changes(before, snapshot(run))
