"""Checkpoint folders: save -> load gives identical logits, tied weights stay tied, run folders resolve to
their latest complete step, and anything missing or corrupt is a CheckpointError naming the file."""

import json
import os
import re
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import tfkit
from tfkit.checkpoints.folders import resolve_checkpoint
from tfkit.checkpoints.record import CheckpointRecord
from tfkit.checkpoints.weights import load_model, save_model
from tfkit.cli.main import app
from tfkit.errors import CheckpointError, ConfigError
from tfkit.models import build_model

from helpers import tiny_cfg


def logits(model, arch):
    torch.manual_seed(1)
    ids = torch.randint(0, 61, (2, 6))
    return model(ids, ids[:, :4]) if arch == "transformer" else model(ids)


@pytest.mark.parametrize("tie", [True, False])
@pytest.mark.parametrize("arch", ["gpt", "bert", "transformer"])
def test_round_trip_gives_identical_logits(tmp_path, arch, tie):
    model = build_model(tiny_cfg(arch, tie_embeddings=tie, positions="rope", n_kv_heads=2)).eval()
    save_model(model, tmp_path / "ckpt", step=7)
    loaded, cfg = load_model(tmp_path / "ckpt")
    assert cfg == model.config and not loaded.training
    torch.testing.assert_close(logits(loaded, arch), logits(model, arch), atol=0, rtol=0)
    assert loaded.num_params() == model.num_params()  # tied weights stay tied (counted once)


def test_tied_weights_are_the_same_tensor_after_load(tmp_path):
    save_model(build_model(tiny_cfg("gpt")), tmp_path)
    model, _ = load_model(tmp_path)
    assert model.lm_head.weight is model.embed.tok.weight
    save_model(build_model(tiny_cfg("transformer")), tmp_path / "t")
    model, _ = load_model(tmp_path / "t")
    assert model.lm_head.weight is model.src_embed.tok.weight is model.tgt_embed.tok.weight


@pytest.mark.parametrize("arch", ["gpt", "bert", "transformer"])
def test_loading_allocates_the_weights_once_with_no_random_init(tmp_path, arch, monkeypatch):
    """The model is built with its parameters on the meta device and the file's tensors become them: no
    initialiser ever writes real memory (a 7B checkpoint would otherwise spend 28 GB on random values)."""
    model = build_model(tiny_cfg(arch, positions="sinusoidal")).eval()
    save_model(model, tmp_path)
    written = []
    for name in ("normal_", "uniform_", "xavier_uniform_", "kaiming_uniform_", "trunc_normal_", "zeros_", "ones_"):
        def spy(tensor, *args, _original=getattr(torch.nn.init, name), _name=name, **kwargs):
            if tensor.device.type != "meta":
                written.append(_name)
            return _original(tensor, *args, **kwargs)
        monkeypatch.setattr(torch.nn.init, name, spy)
    loaded, _ = load_model(tmp_path)
    assert written == []
    assert all(t.device.type == "cpu" for t in [*loaded.parameters(), *loaded.buffers()])  # the sinusoid table too
    torch.testing.assert_close(logits(loaded, arch), logits(model, arch), atol=0, rtol=0)
    build_model(tiny_cfg(arch))
    assert written  # the spy sees an ordinary build's initialisers


def test_config_json_holds_version_model_and_the_facts_given(tmp_path):
    save_model(build_model(tiny_cfg("bert")), tmp_path, recipe="bert-tiny", step=3)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config == {"tfkit_version": tfkit.__version__, "model": tiny_cfg("bert").to_dict(), "step": 3,
                      "prior_steps": 0, "recipe": "bert-tiny"}
    record = CheckpointRecord.read(tmp_path)
    assert (record.model, record.recipe, record.step) == (tiny_cfg("bert"), "bert-tiny", 3)
    assert not list(tmp_path.glob(".*"))  # no temporary files left behind


def test_run_folder_resolves_to_latest_complete_step(tmp_path):
    model = build_model(tiny_cfg("gpt"))
    checkpoints = tmp_path / "checkpoints"
    for step in (5, 20):
        save_model(model, checkpoints / f"step-{step}")
    save_model(model, checkpoints / ".step-300")  # temp folder being written
    save_model(model, checkpoints / "step-400.tmp")
    (checkpoints / "step-100").mkdir()  # incomplete: weights not written yet
    (checkpoints / "step-100" / "config.json").write_text("{}")
    assert resolve_checkpoint(tmp_path) == checkpoints / "step-20"
    assert resolve_checkpoint(checkpoints) == checkpoints / "step-20"
    assert resolve_checkpoint(checkpoints / "step-5") == checkpoints / "step-5"
    assert load_model(tmp_path)[1] == model.config


def test_not_a_checkpoint_names_the_path(tmp_path):
    with pytest.raises(CheckpointError, match="no such"):
        resolve_checkpoint(tmp_path / "missing")
    with pytest.raises(CheckpointError, match="not a checkpoint folder"):
        resolve_checkpoint(tmp_path)
    (tmp_path / "checkpoints" / "step-1").mkdir(parents=True)
    with pytest.raises(CheckpointError, match=str(tmp_path)):
        load_model(tmp_path)


def test_missing_weights_file_is_named(tmp_path):
    save_model(build_model(tiny_cfg("gpt")), tmp_path)
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="model.safetensors is missing"):
        load_model(tmp_path)


def test_corrupt_weights_file_is_a_checkpoint_error(tmp_path):
    save_model(build_model(tiny_cfg("gpt")), tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"\x00\x01 definitely not safetensors")
    with pytest.raises(CheckpointError, match="model.safetensors"):
        load_model(tmp_path)


def test_truncated_weights_file_is_a_checkpoint_error(tmp_path):
    save_model(build_model(tiny_cfg("gpt")), tmp_path)
    data = (tmp_path / "model.safetensors").read_bytes()
    (tmp_path / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="model.safetensors"):
        load_model(tmp_path)


def test_weights_of_another_shape_are_a_checkpoint_error(tmp_path):
    save_model(build_model(tiny_cfg("gpt")), tmp_path)
    other = tmp_path / "other"
    save_model(build_model(tiny_cfg("gpt", n_kv_heads=1)), other)
    (other / "model.safetensors").replace(tmp_path / "model.safetensors")
    with pytest.raises(CheckpointError, match="model.safetensors"):
        load_model(tmp_path)


def test_corrupt_or_invalid_config_is_named(tmp_path):
    save_model(build_model(tiny_cfg("gpt")), tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="config.json"):
        load_model(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model": {"arch": "gpt", "n_layer": 2}}))
    with pytest.raises(ConfigError, match="model.n_layer: unknown key"):
        load_model(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"tfkit_version": "0.1.0"}))
    with pytest.raises(CheckpointError, match="'model' section"):
        CheckpointRecord.read(tmp_path)


def edit_model_config(folder: Path, **values) -> Path:
    """Overwrite keys of a saved checkpoint's model section, as a hand edit of config.json would."""
    config = json.loads((folder / "config.json").read_text())
    config["model"].update(values)
    (folder / "config.json").write_text(json.dumps(config))
    return folder / "config.json"


@pytest.mark.parametrize("values, message", [
    ({"n_layers": "2"}, "model.n_layers: got '2', expected an integer"),
    ({"n_layers": 2.5}, "model.n_layers: got 2.5, expected an integer"),
    ({"n_layers": 2.0}, "model.n_layers: got 2.0, expected an integer"),
    ({"n_layers": None}, "model.n_layers: got None, expected an integer"),
    ({"n_layers": [2]}, "model.n_layers: got [2], expected an integer"),
    ({"n_heads": True}, "model.n_heads: got True, expected an integer"),
    ({"n_kv_heads": "2"}, "model.n_kv_heads: got '2', expected an integer or null"),
    ({"bias": "yes"}, "model.bias: got 'yes', expected true/false"),
    ({"norm_eps": "1e-5"}, "model.norm_eps: got '1e-5', expected a number"),
    ({"norm_eps": -1e-5}, "model.norm_eps: got -1e-05, expected a positive finite number"),
    ({"rope_theta": 0}, "model.rope_theta: got 0.0, expected a positive finite number"),
    ({"arch": 3}, "model.arch: got 3, expected a string"),
    ({"bias": 1, "init_std": -1.0},
     "model.bias: got 1, expected true/false; model.init_std: got -1.0, expected a positive finite number"),
])
def test_a_wrong_type_or_value_in_config_json_is_a_config_error_naming_file_and_key(tmp_path, values, message):
    file = edit_model_config(save_model(build_model(tiny_cfg("gpt")), tmp_path / "ckpt"), **values)
    for load in (load_model, CheckpointRecord.read):
        with pytest.raises(ConfigError) as err:
            load(tmp_path / "ckpt")
        assert str(err.value) == f"{file}: {message}"


def test_an_integer_is_a_valid_float_in_config_json(tmp_path):
    edit_model_config(save_model(build_model(tiny_cfg("gpt")), tmp_path), norm_eps=1, dropout=0)
    _, cfg = load_model(tmp_path)
    assert (cfg.norm_eps, cfg.dropout) == (1.0, 0.0) and isinstance(cfg.norm_eps, float)


def test_a_wrong_type_in_config_json_is_one_line_and_exit_code_2(tmp_path):
    file = edit_model_config(save_model(build_model(tiny_cfg("gpt")), tmp_path / "ckpt"), n_layers="2")
    result = CliRunner().invoke(app, ["generate", str(tmp_path / "ckpt"), "-p", "hi"])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert result.stderr.strip().splitlines()[-1] == f"error: {file}: model.n_layers: got '2', expected an integer"


@pytest.fixture
def umask_022():
    previous = os.umask(0o022)
    yield
    os.umask(previous)


def test_published_models_are_readable_by_others_as_the_umask_allows(tmp_path, umask_022):
    """safetensors writes 0600 files and mkdtemp makes 0700 folders; what tfkit publishes gets 0644/0755."""
    import stat

    from tfkit.files import staged_folder

    model = build_model(tiny_cfg("gpt"))
    folder = save_model(model, tmp_path / "saved")
    assert stat.S_IMODE((folder / "model.safetensors").stat().st_mode) == 0o644
    with staged_folder(tmp_path / "published") as tmp:
        save_model(model, tmp / "inner")
    modes = {p.relative_to(tmp_path).as_posix(): stat.S_IMODE(p.stat().st_mode)
             for p in [tmp_path / "published", *(tmp_path / "published").rglob("*")]}
    assert modes == {"published": 0o755, "published/inner": 0o755, "published/inner/model.safetensors": 0o644,
                     "published/inner/config.json": 0o644}


def test_a_config_that_does_not_match_the_weights_is_one_line(tmp_path):
    folder = save_model(build_model(tiny_cfg("gpt")), tmp_path / "ckpt")
    config = json.loads((folder / "config.json").read_text())
    config["model"]["d_model"] *= 2
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"size mismatch for .*\(and \d+ more\)") as err:
        load_model(folder)
    assert "\n" not in str(err.value)


def test_out_checks_name_the_option_before_any_work(tmp_path):
    """A file in --out's path, an unwritable parent, and --force on something that is not an earlier output
    are refused up front, naming --out; nothing is deleted."""
    from tfkit.replacing import TFKIT_MODEL, check_new_folder

    (tmp_path / "afile").write_text("mine")
    with pytest.raises(CheckpointError, match=r"--out .*afile/sub: .*afile is a file, not a folder"):
        check_new_folder(tmp_path / "afile" / "sub", [], force=False, replaces=(TFKIT_MODEL,))
    with pytest.raises(CheckpointError, match="is not a model folder"):
        check_new_folder(tmp_path / "afile", [], force=True, replaces=(TFKIT_MODEL,))
    assert (tmp_path / "afile").read_text() == "mine"
    if os.geteuid() != 0:  # root writes anywhere
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o555)
        with pytest.raises(CheckpointError, match="no permission to write in"):
            check_new_folder(locked / "out", [], force=False, replaces=(TFKIT_MODEL,))
    save_model(build_model(tiny_cfg("gpt")), tmp_path / "earlier")
    check_new_folder(tmp_path / "earlier", [], force=True, replaces=(TFKIT_MODEL,))  # an earlier output


def test_force_replaces_only_what_the_command_itself_writes(tmp_path):
    """Each command's --force replaces its own earlier output: a tfkit model folder (convert, import-hf)
    or a tfkit export (export-hf); never a training checkpoint, a HuggingFace model transformers saved,
    nor the other command's output. What is refused is named and kept."""
    from tfkit.replacing import TFKIT_EXPORT, TFKIT_MODEL, check_new_folder

    save_model(build_model(tiny_cfg("gpt")), tmp_path / "model")
    save_model(build_model(tiny_cfg("gpt")), tmp_path / "trained")
    (tmp_path / "trained" / "trainer_state.pt").write_bytes(b"optimizer state")
    for name, config in (("export", {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}),
                         ("saved", {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
                                    "transformers_version": "5.23.0"})):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(config))
        (tmp_path / name / "model.safetensors").write_bytes(b"weights")
    check_new_folder(tmp_path / "model", [], force=True, replaces=(TFKIT_MODEL,))
    check_new_folder(tmp_path / "export", [], force=True, replaces=(TFKIT_EXPORT,))
    refused = [("trained", (TFKIT_MODEL,), "a training checkpoint (it has trainer_state.pt)"),
               ("trained", (TFKIT_EXPORT,), "a training checkpoint (it has trainer_state.pt)"),
               ("saved", (TFKIT_MODEL, TFKIT_EXPORT), "a HuggingFace model folder that tfkit export-hf did not write"),
               ("export", (TFKIT_MODEL,), TFKIT_EXPORT), ("model", (TFKIT_EXPORT,), TFKIT_MODEL)]
    for name, replaces, what in refused:
        with pytest.raises(CheckpointError) as err:
            check_new_folder(tmp_path / name, [], force=True, replaces=replaces)
        assert str(err.value) == (f"--out {tmp_path / name}: exists and is {what}; --force replaces only "
                                  f"{' or '.join(replaces)}, so it is kept: remove it yourself if it should go, "
                                  "or choose another folder")
    (tmp_path / "export" / "notes.txt").write_text("mine")  # an export holds the files export-hf writes only
    with pytest.raises(CheckpointError, match="HuggingFace model folder that tfkit export-hf did not write"):
        check_new_folder(tmp_path / "export", [], force=True, replaces=(TFKIT_EXPORT,))


def test_out_in_a_training_runs_checkpoints_folder_is_refused(tmp_path):
    """`eval RUN` takes the highest checkpoints/step-N for the run's latest: a model written there would be
    evaluated in its place. A run folder is recognised by a step-N checkpoint or by its recipe.yaml."""
    from tfkit.replacing import TFKIT_MODEL, check_new_folder

    save_model(build_model(tiny_cfg("gpt")), tmp_path / "run" / "checkpoints" / "step-5")
    (tmp_path / "fresh" / "checkpoints").mkdir(parents=True)
    (tmp_path / "fresh" / "recipe.yaml").write_text("# The resolved recipe of this run\n")
    for out in (tmp_path / "run" / "checkpoints" / "step-999", tmp_path / "fresh" / "checkpoints" / "gqa"):
        with pytest.raises(CheckpointError, match=re.escape(f"training run {out.parents[1]}, where")):
            check_new_folder(out, [], force=True, replaces=(TFKIT_MODEL,))
    (tmp_path / "mine" / "checkpoints").mkdir(parents=True)  # not a run: a folder that happens to be so named
    check_new_folder(tmp_path / "mine" / "checkpoints" / "gqa", [], force=False, replaces=(TFKIT_MODEL,))
