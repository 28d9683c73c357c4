"""`log.wandb: true` where W&B cannot start is one line, exit code 2, before any update: no WANDB_MODE and no API
key anywhere W&B looks (wandb.init would raise its UsageError, or wait at a login prompt), a WANDB_MODE that
is not one of W&B's, and what only wandb.init finds out (a key the server refuses, no network). The
environment is monkeypatched and wandb.init replaced: nothing here reaches the network."""

from __future__ import annotations

import pytest
from fault_helpers import assert_one_line_error, cli

wandb = pytest.importorskip("wandb")  # the trackers extra; the test extra installs it


@pytest.fixture
def no_account(tmp_path, monkeypatch):
    """A user with no W&B login: no key in the environment, an empty home (no .netrc, no settings)."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    for name in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE", "NETRC", "WANDB_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(home / ".config" / "wandb"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TFKIT_CACHE", str(tmp_path / ".cache"))


def _init_fails(error):
    def init(*args, **kwargs):
        raise error
    return init


def _no_init(*args, **kwargs):
    raise AssertionError("wandb.init was called: it would ask for a login or reach the network")


CASES = {  # name: (environment, what wandb.init does, what the line names)
    "no-mode-no-key": ({}, _no_init, ("WANDB_MODE=offline", "no W&B API key")),
    "mode-online-no-key": ({"WANDB_MODE": "online"}, _no_init, ("WANDB_MODE online", "no W&B API key")),
    "mode-bogus": ({"WANDB_MODE": "bogus"}, _no_init, ("WANDB_MODE is 'bogus'", "offline")),
    "mode-bogus-with-a-key": ({"WANDB_MODE": "bogus", "WANDB_API_KEY": "x" * 40}, _no_init, ("'bogus'",)),
    "key-the-server-refuses": ({"WANDB_API_KEY": "x" * 40},
                               _init_fails(wandb.errors.AuthenticationError("API key not valid")),
                               ("W&B could not start", "API key not valid", "WANDB_MODE=offline")),
    "no-network": ({"WANDB_API_KEY": "x" * 40}, _init_fails(wandb.errors.CommError("Network error: unreachable")),
                   ("W&B could not start", "unreachable")),
    "login-prompt-refused": ({"WANDB_API_KEY": "x" * 40},
                             _init_fails(wandb.errors.UsageError("api_key not configured (no-tty)")),
                             ("W&B could not start", "UsageError")),
}


@pytest.mark.parametrize("case", list(CASES))
def test_wandb_that_cannot_start_is_one_line_before_training(case, tiny_run, no_account, tmp_path, monkeypatch):
    environment, init, named = CASES[case]
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(wandb, "init", init)
    recipe, _ = tiny_run
    run = tmp_path / "run"
    assert_one_line_error(cli(["pretrain", recipe, "--run-dir", run, "--set", "log.wandb=true"]), "log.wandb", *named)
    assert not (run / "checkpoints").exists() and not (run / "metrics.jsonl").exists(), "it trained"


def test_a_netrc_entry_for_the_host_is_a_key(no_account, tmp_path, monkeypatch):
    """`wandb login` writes the key to ~/.netrc: with it, the recipe loads (and wandb.init is what runs)."""
    from tfkit.trainer.trackers import wandb_problem

    assert "no W&B API key" in wandb_problem()
    (tmp_path / "home" / ".netrc").write_text("machine api.wandb.ai\n  login user\n  password " + "x" * 40 + "\n")
    (tmp_path / "home" / ".netrc").chmod(0o600)
    assert wandb_problem() is None
    monkeypatch.setenv("WANDB_BASE_URL", "https://wandb.example.com")  # a key for another host is none
    assert "no W&B API key" in wandb_problem()
    (tmp_path / "home" / ".config" / "wandb").mkdir(parents=True)
    (tmp_path / "home" / ".config" / "wandb" / "settings").write_text("[default]\nmode = offline\n")
    assert wandb_problem() is None  # `wandb offline` wrote its mode to the settings file
