"""Damaged checkpoints, run folders, HF folders and token caches: truncated files, random bytes, wrong
shapes, wrong structures and hostile pickles. Every command that reads one says which file in one line
(exit code 2) and changes nothing; a hostile pickle is never executed; a damaged cache is rebuilt."""

from __future__ import annotations

import json
import os
import pickle
import shutil

import pytest
import torch
from fault_helpers import assert_one_line_error, changes, cli, snapshot
from safetensors.torch import save_file

MARKER = "/tmp/tfkit-fault-pwned"  # what a hostile pickle would create if it were ever executed


class Hostile:
    def __reduce__(self):
        return (os.system, (f"touch {MARKER}",))


def _truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _random(path):
    path.write_bytes(os.urandom(max(64, min(path.stat().st_size if path.exists() else 64, 4096))))


def _empty(path):
    path.write_bytes(b"")


def _remove(path):
    path.unlink()


def _json(value):
    return lambda path: path.write_text(json.dumps(value))


def _edit_config(**model):
    def edit(path):
        config = json.loads(path.read_text())
        config["model"].update(model)
        path.write_text(json.dumps(config))
    return edit


def _edit_top(**top):
    def edit(path):
        config = json.loads(path.read_text())
        config.update(top)
        path.write_text(json.dumps(config))
    return edit


def _wrong_shapes(path):
    save_file({"embed.tok.weight": torch.zeros(7, 3)}, str(path))


def _pickle(value):
    return lambda path: torch.save(value, path)


def _hostile(path):
    with path.open("wb") as f:
        pickle.dump({"state": Hostile()}, f)


WEIGHT_DAMAGE = {"truncated": _truncate, "random": _random, "empty": _empty, "wrong-shapes": _wrong_shapes}
CONFIG_DAMAGE = {"garbage": _random, "empty": _empty, "a-list": _json([1, 2]), "no-model": _json({"step": 4}),
                 "d_model-text": _edit_config(d_model="big"), "n_heads-zero": _edit_config(n_heads=0),
                 "arch-unknown": _edit_config(arch="rnn"), "vocab-negative": _edit_config(vocab_size=-5)}
READERS = {
    "eval": lambda ckpt, t: ["eval", ckpt, "--data", t / "text.txt"],
    "generate": lambda ckpt, t: ["generate", ckpt, "--prompt", "hi", "-n", "2"],
    "export-hf": lambda ckpt, t: ["export-hf", ckpt, "--out", t / "out"],
    "convert": lambda ckpt, t: ["convert-mqa-to-gqa", ckpt, "--kv-heads", "2", "--out", t / "out"],
}

CHECKPOINT_CASES = (
    [(reader, "model.safetensors", name) for reader in READERS for name in WEIGHT_DAMAGE]
    + [(reader, "config.json", name) for reader in READERS for name in CONFIG_DAMAGE]
    + [(reader, "tokenizer.json", name) for reader in ("eval", "generate") for name in ("garbage", "missing")]
    + [("export-hf", "tokenizer.json", "garbage")]  # a missing one is a warning: the export has none either
)
DAMAGE = {"model.safetensors": WEIGHT_DAMAGE, "config.json": CONFIG_DAMAGE,
          "tokenizer.json": {"garbage": _random, "missing": _remove}}


def _prepare(copy_run, tmp_path):
    run = copy_run()
    (tmp_path / "text.txt").write_text("Plain text for the evaluation. " * 400)
    return run, run / "checkpoints" / "step-4"


@pytest.mark.parametrize(("reader", "file", "damage"), CHECKPOINT_CASES,
                         ids=[f"checkpoint-{r}-{f}-{d}" for r, f, d in CHECKPOINT_CASES])
def test_a_damaged_checkpoint_is_one_line_naming_the_file(reader, file, damage, copy_run, tmp_path, monkeypatch):
    monkeypatch.setenv("TFKIT_CACHE", str(tmp_path / ".cache"))
    run, ckpt = _prepare(copy_run, tmp_path)
    DAMAGE[file][damage](ckpt / file)
    before = snapshot(tmp_path)
    line = assert_one_line_error(cli(READERS[reader](ckpt, tmp_path)))
    assert file in line or str(ckpt) in line, line
    assert not changes(before, snapshot(tmp_path)), changes(before, snapshot(tmp_path))


def _bigger_tokenizer(ckpt, tmp_path):
    from tfkit.tokenization.train import TokenizerSpec, train_tokenizer

    text = (tmp_path / "text.txt").read_text() + " ".join(f"word{i}" for i in range(3000))
    train_tokenizer(TokenizerSpec(kind="bpe", vocab_size=600, min_frequency=1), [text], tmp_path / "big",
                    show_progress=False)
    shutil.copy(tmp_path / "big" / "tokenizer.json", ckpt / "tokenizer.json")


VOCAB_READERS = {"eval": READERS["eval"], "export-hf": READERS["export-hf"], "generate": READERS["generate"],
                 "convert": READERS["convert"], "import-hf": lambda hf, t: ["import-hf", hf, "--out", t / "out"]}


@pytest.mark.parametrize("reader", sorted(VOCAB_READERS), ids=[f"vocab-{r}" for r in sorted(VOCAB_READERS)])
def test_a_tokenizer_larger_than_the_models_vocabulary_is_refused(reader, copy_run, tmp_path, monkeypatch):
    """Every reader refuses it, import-hf included: an import that took it (exit 0) made a model that every
    later command refused."""
    monkeypatch.setenv("TFKIT_CACHE", str(tmp_path / ".cache"))
    run, ckpt = _prepare(copy_run, tmp_path)
    if reader == "import-hf":
        assert cli(["export-hf", ckpt, "--out", tmp_path / "hf"]).exit_code == 0
        ckpt = tmp_path / "hf"
    _bigger_tokenizer(ckpt, tmp_path)
    before = snapshot(tmp_path)
    assert_one_line_error(cli(VOCAB_READERS[reader](ckpt, tmp_path)), "600")
    assert not changes(before, snapshot(tmp_path))


# --- resuming a damaged run folder -----------------------------------------------------------------------

STATE_DAMAGE = {
    "truncated": _truncate, "random": _random, "empty": _empty, "hostile-pickle": _hostile,
    "hostile-torch-save": _pickle({"state": Hostile()}), "a-list": _pickle([1, 2, 3]),
    "missing-keys": _pickle({"state": {"step": 4}}), "rng-wrong": None, "optimizer-wrong": None,
    "step-text": None,
}


def _state_edit(name):
    def edit(path):
        state = torch.load(path, weights_only=True)
        if name == "rng-wrong":
            state["rng"] = {"python": 1, "torch": "seed"}
        elif name == "optimizer-wrong":
            state["optimizer"] = {"state": {}, "param_groups": [{"params": [7]}]}
        else:
            state["state"]["step"] = "four"
        torch.save(state, path)
    return edit


RUN_DAMAGE = {
    "checkpoints/step-4/trainer_state.pt": {k: v or _state_edit(k) for k, v in STATE_DAMAGE.items()},
    "checkpoints/step-4/config.json": {"step-text": _edit_top(step="four"), "step-negative": _edit_top(step=-4),
                                       "garbage": _random},
    "checkpoints/step-4/model.safetensors": {"truncated": _truncate, "wrong-shapes": _wrong_shapes},
    "recipe.yaml": {"garbage": lambda p: p.write_bytes(b"# The resolved recipe of this run, written by tfkit "
                                                       b"pretrain (rewritten when the run resumes).\n\xff\x00: ["),
                    "not-a-mapping": lambda p: p.write_text(p.read_text().splitlines()[0] + "\n- a\n- b\n"),
                    "alias-bomb": lambda p: p.write_text(p.read_text().splitlines()[0] + "\n" + "\n".join(
                        ["a0: &a0 [x, x, x, x, x, x, x, x, x]"] + [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9)
                                                                  + "]" for i in range(1, 7)]) + "\n")},
    "metrics.jsonl": {"non-object-row": lambda p: p.write_text("[1, 2]\n" + p.read_text()),
                      "text-step": lambda p: p.write_text('{"step": "two", "loss": 1.0}\n' + p.read_text()),
                      "garbage-middle": lambda p: p.write_text(p.read_text() + "}{not json\n" + '{"step": 4}\n')},
}
RUN_CASES = [(file, name) for file, damages in RUN_DAMAGE.items() for name in damages]


@pytest.mark.parametrize(("file", "damage"), RUN_CASES, ids=[f"resume-{f.split('/')[-1]}-{d}" for f, d in RUN_CASES])
def test_resuming_a_damaged_run_folder_is_one_line_and_changes_nothing(file, damage, tiny_run, copy_run, tmp_path):
    recipe, _ = tiny_run
    run = copy_run()
    RUN_DAMAGE[file][damage](run / file)
    before = snapshot(run)
    line = assert_one_line_error(cli(["pretrain", recipe, "--run-dir", run, "--resume", "auto",
                                      "--set", "train.max_steps=6"]))
    assert file.split("/")[-1] in line, line
    assert not os.path.exists(MARKER), "a hostile pickle was executed"
    assert not changes(before, snapshot(run)), changes(before, snapshot(run))


# --- HF folders ----------------------------------------------------------------------------------------

def _hf_bin(value):
    def edit(folder):
        (folder / "model.safetensors").unlink()
        torch.save(value, folder / "pytorch_model.bin")
    return edit


def _hf_hostile(folder):
    (folder / "model.safetensors").unlink()
    with (folder / "pytorch_model.bin").open("wb") as f:
        pickle.dump({"wte": Hostile()}, f)


HF_DAMAGE = {
    "bin-hostile-pickle": (_hf_hostile, "pytorch_model.bin"),
    "bin-hostile-torch-save": (_hf_bin({"wte": Hostile()}), "pytorch_model.bin"),
    "bin-a-list": (_hf_bin([1, 2]), "pytorch_model.bin"),
    "bin-truncated": (lambda f: (_hf_bin({"a": torch.zeros(100)})(f), _truncate(f / "pytorch_model.bin")),
                      "pytorch_model.bin"),
    "safetensors-truncated": (lambda f: _truncate(f / "model.safetensors"), "model.safetensors"),
    "safetensors-random": (lambda f: _random(f / "model.safetensors"), "model.safetensors"),
    "safetensors-wrong-shapes": (lambda f: _wrong_shapes(f / "model.safetensors"), "weights"),
    "config-garbage": (lambda f: _random(f / "config.json"), "config.json"),
    "config-no-model-type": (lambda f: _json({"n_embd": 32})(f / "config.json"), "config.json"),
    "config-wrong-type": (lambda f: f.joinpath("config.json").write_text(
        json.dumps({**json.loads(f.joinpath("config.json").read_text()), "n_layer": "two"})), "n_layer"),
}


@pytest.fixture(scope="module")
def hf_export(tiny_run, tmp_path_factory):
    out = tmp_path_factory.mktemp("hf") / "hf"
    assert cli(["export-hf", tiny_run[1], "--out", out]).exit_code == 0
    return out


@pytest.mark.parametrize("damage", sorted(HF_DAMAGE), ids=[f"hf-{d}" for d in sorted(HF_DAMAGE)])
def test_a_damaged_or_hostile_hf_folder_is_refused_in_one_line(damage, hf_export, tmp_path):
    folder = tmp_path / "hf"
    shutil.copytree(hf_export, folder)
    edit, expected = HF_DAMAGE[damage]
    edit(folder)
    before = snapshot(tmp_path)
    assert_one_line_error(cli(["import-hf", folder, "--out", tmp_path / "imported"]), expected)
    assert not os.path.exists(MARKER), "a hostile pickle was executed"
    assert not changes(before, snapshot(tmp_path))


# --- token caches: derived data, rebuilt when damaged -----------------------------------------------------

CACHE_DAMAGE = {
    "meta-garbage": lambda f: _random(f / "meta.json"),
    "meta-wrong-types": lambda f: _json({"dtype": 5, "num_tokens": "many"})(f / "meta.json"),
    "tokens-truncated": lambda f: _truncate(f / "tokens.bin"),
    "doc-starts-missing": lambda f: (f / "doc_starts.bin").unlink(),
}


@pytest.mark.parametrize("damage", sorted(CACHE_DAMAGE), ids=[f"cache-{d}" for d in sorted(CACHE_DAMAGE)])
def test_a_damaged_token_cache_is_rebuilt(damage, copy_run, tmp_path, monkeypatch):
    monkeypatch.setenv("TFKIT_CACHE", str(tmp_path / ".cache"))
    run, ckpt = _prepare(copy_run, tmp_path)
    args = ["eval", ckpt, "--data", tmp_path / "text.txt", "--json", tmp_path / "first.json", "--max-batches", "2"]
    assert cli(args).exit_code == 0
    (folder,) = (tmp_path / ".cache" / "eval-tokens").glob("tokens-*")
    CACHE_DAMAGE[damage](folder)
    result = cli(args[:-4] + ["--json", tmp_path / "second.json", "--max-batches", "2"])
    assert result.exit_code == 0, result.output
    first, second = (json.loads((tmp_path / n).read_text())[0] for n in ("first.json", "second.json"))
    assert first["loss"] == second["loss"] and first["data_fingerprint"] == second["data_fingerprint"]
