"""Pre-registration: a lab's expectations are hashed into its folder before its first training, so every verdict
can say whether the expectation it reads was fixed before the data or written after it; and a second look at
more seeds is recorded, with what the first look read.

An expectation edited after its runs were seen (to fix a test that could not work, or to fit the data) is a
different test from the one registered: its hash is not in the registration, and its verdict says "written
after the data" until the spec is run again on fresh seeds (`--set train.seed=N` moves every seed), in a new
folder whose registration holds it. A lab continued with more seeds (`--seeds 5` on a 3-seed folder) is the same
registration looked at twice: the looks are kept, and each verdict names what the earlier look read, since a
claim rerun until it holds is not the claim that held on the first look."""

from __future__ import annotations

import json
import time
from pathlib import Path

from ..errors import ConfigError
from ..files import write_atomic
from ..jsonfile import read_json
from .provenance import provenance
from .spec import LabSpec

REGISTRATION = "registration.json"
FIXED, AFTER = "fixed before the data", "written after the data"


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def has_data(folder: Path) -> bool:
    """Whether any training of the lab has started (a run folder exists): its data may have been seen."""
    runs = folder / "runs"
    return runs.is_dir() and any(runs.iterdir())


def register(folder: Path, spec: LabSpec, seeds: list[int]) -> dict:
    """Write the registration of `spec`'s expectations unless the folder has one; returns the registration.
    Called before the first training: a folder that already holds runs (a lab from before registrations) is
    registered as such (`before_data` false), never as fixed before its data."""
    path = folder / REGISTRATION
    if path.is_file():
        return read_registration(folder)
    record = {"registered_at": now(), "before_data": not has_data(folder), "spec": str(spec.path),
              "expect_sha256": spec.expect_hash, "seeds": seeds,
              "expectations": [{"hash": e.hash, "claim": e.describe()} for e in spec.expect],
              "provenance": provenance(), "looks": []}
    write_atomic(path, json.dumps(record, indent=2) + "\n")
    return record


def read_registration(folder: Path) -> dict | None:
    path = folder / REGISTRATION
    if not path.is_file():
        return None
    found = read_json(path, ConfigError, expect=dict)
    if not isinstance(found.get("expectations"), list):
        raise ConfigError(f"{path}: damaged, expected the registered expectations (an expectations list)")
    return found


def add_look(folder: Path, seeds: int) -> None:
    """Record that the lab's results at `seeds` seeds were there to be seen before it was continued with more:
    the verdicts of results.json as they read then."""
    registration = read_registration(folder)
    if registration is None:
        return
    results = folder / "results.json"
    verdicts = []
    if results.is_file():
        verdicts = [{"claim": v.get("claim"), "on": v.get("on"), "status": v.get("status")}
                    for v in read_json(results, ConfigError, expect=dict).get("verdicts", [])]
    registration["looks"].append({"seeds": seeds, "at": now(), "verdicts": verdicts})
    write_atomic(folder / REGISTRATION, json.dumps(registration, indent=2) + "\n")


def fixed(registration: dict | None, exp_hash: str) -> str:
    """FIXED when the expectation was registered before the lab's data, AFTER otherwise; "" without a
    registration (a lab from before them)."""
    if not registration:
        return ""
    hashes = {e.get("hash") for e in registration["expectations"]}
    return FIXED if registration.get("before_data") and exp_hash in hashes else AFTER


def earlier_looks(registration: dict | None, claim: str, on: str) -> list[str]:
    """"inconclusive at 3 seeds" for each earlier look at this claim (on this text)."""
    out = []
    for look in (registration or {}).get("looks", []):
        for v in look["verdicts"]:
            if v["claim"] == claim and (v.get("on") or "") == (on or ""):
                out.append(f"{v['status']} at {look['seeds']} seeds")
    return out
