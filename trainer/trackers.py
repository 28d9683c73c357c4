"""Experiment trackers beside metrics.jsonl: Weights & Biases (`log.wandb: true`).

metrics.jsonl stays the record of truth; a tracker receives the same rows as `MetricsWriter.log` writes
(every training and validation row, as written), the resolved recipe as its config, and at the end the
run's final validation as a table and as the run's summary. wandb is the optional `trackers` extra,
imported only when a recipe turns it on; `WANDB_MODE=offline` works with no account and writes the run
under `<run>/wandb/`. A resumed run continues the W&B run of its run folder (W&B's `latest-run` there
names it).

W&B that cannot start is one line, exit code 2, before anything runs (`wandb_problem`, when the recipe
loads): the package missing, a WANDB_MODE that is not one of W&B's modes, or the online mode with no API
key anywhere W&B looks (WANDB_API_KEY, WANDB_IDENTITY_TOKEN_FILE, the .netrc entry of its host, its
settings files). Read from the environment and files only: nothing is imported or asked of the network.
What only `wandb.init` finds out (a key the server refuses, no network) is the same one line, before the
first update (`open_tracker`).
"""

from __future__ import annotations

import configparser
import importlib.util
import netrc
import os
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from ..errors import ConfigError

EXTRA = 'pip install "tfkit[trackers]"'
FOLDER = "wandb"  # in a run folder: what wandb writes (its `dir` is the run folder)
DEFAULT_PROJECT = "tfkit"
MODES = ("online", "offline", "shared", "disabled", "dryrun", "run")  # wandb.Settings.mode's values
NO_ACCOUNT = ("offline", "dryrun", "disabled")  # the modes that log without an account (or not at all)
OFFLINE = "set WANDB_MODE=offline to log under the run folder without an account, or WANDB_MODE=disabled"


def wandb_problem() -> str | None:
    """Why `log.wandb: true` cannot work here, checked when the recipe loads: the package is missing, its
    mode is not one of W&B's, or it would log online with no API key (wandb.init would stop the run with
    a UsageError, or wait at a login prompt)."""
    if importlib.util.find_spec("wandb") is None:
        return f"log.wandb: true needs the wandb package, which is not installed: {EXTRA}"
    settings = _settings()
    mode = os.environ.get("WANDB_MODE") or settings.get("mode") or "online"
    if mode not in MODES:
        where = "WANDB_MODE" if os.environ.get("WANDB_MODE") else "mode (W&B's settings file)"
        return f"log.wandb: true, but {where} is {mode!r}, not one of W&B's modes ({', '.join(MODES)})"
    if mode not in NO_ACCOUNT and not _has_credentials(settings):
        return (f"log.wandb: true logs online (WANDB_MODE {mode}) and no W&B API key is set (WANDB_API_KEY, "
                f"`wandb login`); {OFFLINE}")
    return None


def _settings() -> dict[str, str]:
    """W&B's settings files as it reads them, the global one (WANDB_CONFIG_DIR, else ~/.config/wandb) then
    the working folder's wandb/settings (`wandb offline` writes `mode` there): their `[default]` keys."""
    config_dir = Path(os.environ.get("WANDB_CONFIG_DIR") or Path.home() / ".config" / "wandb")
    found: dict[str, str] = {}
    for path in (config_dir / "settings", Path(FOLDER) / "settings"):
        parser = configparser.ConfigParser()
        try:
            parser.read(path, encoding="utf-8")
        except (configparser.Error, OSError, UnicodeDecodeError):
            continue
        if parser.has_section("default"):
            found.update(parser["default"])
    return found


def _has_credentials(settings: dict[str, str]) -> bool:
    """Whether W&B has a key for its host: the environment, or its .netrc entry (NETRC, else ~/.netrc). A
    .netrc that cannot be read counts as one (W&B may read what this cannot): only a sure absence refuses."""
    if os.environ.get("WANDB_API_KEY") or os.environ.get("WANDB_IDENTITY_TOKEN_FILE") or settings.get("api_key"):
        return True
    host = urlparse(os.environ.get("WANDB_BASE_URL") or settings.get("base_url") or "https://api.wandb.ai").hostname
    path = Path(os.environ.get("NETRC") or Path.home() / ".netrc").expanduser()
    if not path.exists():
        return False
    try:
        return netrc.netrc(str(path)).authenticators(host or "") is not None
    except (netrc.NetrcParseError, OSError, UnicodeDecodeError):
        return True


class WandbTracker:
    """One W&B run per run folder: rows as `run.log`, the recipe as config, the final validation at close."""

    def __init__(self, run_dir: Path, project: str | None, config: dict[str, Any], resumed: bool) -> None:
        import wandb

        previous = _previous_run_id(run_dir) if resumed else None
        self._wandb = wandb
        try:
            self._run = wandb.init(project=project or DEFAULT_PROJECT, name=run_dir.name, dir=str(run_dir),
                                   config=config, id=previous, resume="allow" if previous else None,
                                   settings=wandb.Settings(console="off"))
        except Exception as exc:  # noqa: BLE001 - wandb's UsageError, AuthenticationError, CommError, pydantic's
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ConfigError(f"log.wandb: W&B could not start ({type(exc).__name__}: {reason}); {OFFLINE}") from None
        self._run.define_metric("*", step_metric="step")  # charts against tfkit's step, not W&B's own counter
        self._last_validation: dict[str, Any] | None = None

    def log(self, row: dict[str, Any]) -> None:
        """A metrics.jsonl row as written (a skipped update's null loss is left out: W&B plots numbers)."""
        self._run.log({k: v for k, v in row.items() if v is not None})
        if "val_loss" in row:
            self._last_validation = row

    def close(self) -> None:
        """The final validation as a table and the run's summary, then the run's end."""
        final = self._last_validation
        if final is not None:
            table = self._wandb.Table(columns=["metric", "value"], data=[[k, v] for k, v in final.items()])
            self._run.log({"final_eval": table})
            self._run.summary.update({f"final/{k}": v for k, v in final.items()})
        self._run.finish()


def _previous_run_id(run_dir: Path) -> str | None:
    """The id of the W&B run this run folder logged to: the suffix of the folder `wandb/latest-run` points
    to (`offline-run-<date>_<time>-<id>` or `run-<date>_<time>-<id>`)."""
    latest = run_dir / FOLDER / "latest-run"
    if not latest.exists():
        return None
    return latest.resolve().name.rsplit("-", 1)[-1]


def open_tracker(recipe, run_dir: Path, resumed: bool) -> WandbTracker | None:
    """The tracker a recipe asks for (`log.wandb`), else None."""
    if not recipe.log.wandb:
        return None
    return WandbTracker(run_dir, recipe.log.wandb_project, recipe.to_dict(), resumed)
