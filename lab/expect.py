"""The expectations of a lab spec: the orderings, equalities, probe bounds and training outcomes the
literature predicts, each parsed and checked against the lab's run names before any compute is spent.
Also the two small checks every part of a spec shares (`mapping`, `suggest`)."""

from __future__ import annotations

import difflib
import hashlib
import json
from dataclasses import dataclass
from typing import Any

# what `expect: probe:` may name -> the `probes:` key that measures it; a per-layer probe is judged on its
# mean over layers
PROBE_SOURCE = {"attention_reliance": "attention_reliance", "flash_max_diff": "flash_equality",
                "mask_leak": "mask_leak", "memory_ratio": "memory", "attention_logits": "attention_logits",
                "attention_entropy": "attention", "attention_max_prob": "attention", "attention_spread": "attention",
                "residual_update": "residual_update", "flash_speedup": "train_speed"}
PROBE_NAMES = tuple(PROBE_SOURCE)
PER_LAYER_PROBES = ("attention_entropy", "attention_max_prob", "attention_spread", "residual_update")
DEFAULT_MARGIN = 0.01  # nats (or bits per byte): differences smaller than this are noise at these sizes


@dataclass
class Expectation:
    """One ordering the literature predicts. Exactly one form is set:
    better/than (A's metric lower than B's by more than `margin`), not_worse/than (A's metric at most
    `margin` above B's), same (A and B within `tol`), probe (a probe value of `run` below or above a
    threshold), trains/fails (run A trains where run B does not: B's failure, which the gates would
    otherwise turn into "not tested", is the predicted outcome), untested/why (a claim of the source this lab
    cannot test, e.g. one measured at a scale a CPU cannot reach: the report says so instead of a verdict). A probe's `below` / `above` may name
    another run instead of a number: A's probe value is then compared with B's seed by seed, as losses
    are (e.g. the unscaled model's attention entropy below the scaled one's). verdict.py says how each is
    decided."""
    source: str
    better: str | None = None
    not_worse: str | None = None
    than: str | None = None
    same: tuple[str, str] | None = None
    tol: float = DEFAULT_MARGIN
    probe: str | None = None
    run: str | None = None
    below: float | str | None = None  # a threshold, or the run whose value A's must lie below
    above: float | str | None = None
    on: str | None = None  # eval label; None = the first eval set
    margin: float = DEFAULT_MARGIN
    trains: str | None = None
    fails: str | None = None
    faster: str | None = None  # faster/than: A reaches B's final validation loss in fewer steps (curve_verdicts.py)
    untested: str | None = None  # the claim, in words
    why: str = ""  # why this lab cannot test it
    margin_reason: str = ""  # why the margin / tol is what it is (the noise floor it was measured against)
    reported: str = ""  # the paper's own number for this claim, in words (paper.py prints it beside ours)
    paper: dict | None = None  # the source's regime when it is not the spec's `paper:` (paper.py)
    layer: int | None = None  # a per-layer probe read at this layer (negative: from the last) instead of its mean
    than_layer: int | None = None  # the layer of the run `below` / `above` names (default: `layer`)
    hash: str = ""  # of the expectation as written (registration.py: fixed before the data or not)
    minus: tuple[str, str] | None = None  # a difference of differences: (A - B) - (C - D), seed by seed

    @property
    def pair(self) -> tuple[str, str]:
        """(A, B) of a comparison: its verdict is read from the differences A - B."""
        if self.trains:
            return self.trains, self.fails
        return self.same or (self.better or self.not_worse or self.faster, self.than)

    def describe(self) -> str:
        if self.untested:
            return self.untested
        if self.trains:
            return f"{self.trains} trains where {self.fails} does not"
        if self.faster:
            return f"{self.faster} reaches {self.than}'s final validation loss in fewer steps"
        a, b = self.pair if not self.probe else (None, None)
        if self.minus:  # the change from B to A against the change from D to C
            a, b = f"{a} - {b}", f"{self.minus[0]} - {self.minus[1]}"
        if self.better:
            return f"{a} < {b}"
        if self.not_worse:
            return f"{a} not worse than {b} (by more than {self.margin:g})"
        if self.same:
            return f"{a} = {b} (|Δ| <= {self.tol:g})"
        sign, bound = ("<", self.below) if self.below is not None else (">", self.above)
        at = "" if self.layer is None else f" at layer {self.layer}"
        if isinstance(bound, str):
            other = self.layer if self.than_layer is None else self.than_layer
            return f"{self.probe} of {self.run}{at} {sign} {bound}'s" + ("" if other is None else f" at layer {other}")
        return f"{self.probe} of {self.run}{at} {sign} {bound:g}"

    @property
    def versus(self) -> str | None:
        """The run a probe value is compared with (`below` / `above` naming a run), or None."""
        bound = self.below if self.below is not None else self.above
        return bound if isinstance(bound, str) else None


def suggest(word: str, choices) -> str:
    close = difflib.get_close_matches(str(word), list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def mapping(value: Any, key: str, allowed: tuple[str, ...], problems: list[str]) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        problems.append(f"{key}: expected a mapping, got {type(value).__name__}")
        return {}
    for name in value:
        if name not in allowed:
            problems.append(f"{key}.{name}: unknown key{suggest(name, allowed)} (expected {', '.join(allowed)})")
    return value


EXPECT_KEYS = ("better", "not_worse", "than", "same", "tol", "probe", "run", "below", "above", "eval", "margin",
               "trains", "fails", "untested", "why", "source", "margin_reason", "reported", "paper", "layer",
               "than_layer", "minus", "faster")


def item_hash(item: Any) -> str:
    """sha256 (16 hex digits) of an expectation as written, keys sorted: any edit makes another hash."""
    return hashlib.sha256(json.dumps(item, sort_keys=True, default=str).encode()).hexdigest()[:16]
FORMS = ("better", "not_worse", "same", "probe", "trains", "untested", "faster")


def parse_expectation(item: Any, key: str, names: set[str], problems: list[str]) -> list[Expectation]:
    item = mapping(item, key, EXPECT_KEYS, problems)
    if not item:
        problems.append(f"{key}: expected a mapping with better/than, not_worse/than, same, probe or trains/fails, "
                        "and source")
        return []
    exp = Expectation(source=str(item.get("source") or ""), on=item.get("eval"), hash=item_hash(item))  # `on`: YAML
    # 1.1 for true, so the key is `eval`
    for name in ("margin_reason", "reported"):
        if name in item and not (isinstance(item[name], str) and item[name].strip()):
            problems.append(f"{key}.{name}: got {item[name]!r}, expected text")
        setattr(exp, name, str(item.get(name) or ""))
    forms = [f for f in FORMS if f in item]
    if len(forms) != 1:
        problems.append(f"{key}: expected exactly one of better, not_worse or faster (with than), same, probe, trains "
                        f"(with fails) or untested (with why), got {forms or 'none'}")
        return []
    if "why" in item and forms[0] != "untested":
        problems.append(f"{key}.why: belongs to untested, not to {forms[0]}")
        return []
    partner = {"better": "than", "not_worse": "than", "trains": "fails", "faster": "than"}
    for name in ("layer", "than_layer"):
        if name in item and forms[0] != "probe":
            problems.append(f"{key}.{name}: belongs to probe, not to {forms[0]}")
            return []
    for name in ("than", "fails"):
        if name in item and partner.get(forms[0]) != name:
            problems.append(f"{key}.{name}: belongs to " + ("better, not_worse or faster" if name == "than" else "trains")
                            + f", not to {forms[0]}")
            return []
    if not exp.source:
        problems.append(f"{key}.source: every expectation names its source (paper, section)")
    for name in ("tol", "margin", "below", "above"):
        bound = name in ("below", "above")
        if bound and isinstance(item.get(name), str):  # another run's value: checked with the run names below
            continue
        if name in item and (isinstance(item[name], bool) or not isinstance(item[name], (int, float))):
            also = " or a run name" if bound else ""
            problems.append(f"{key}.{name}: got {item[name]!r}, expected a number{also}")
            return []
    exp.tol, exp.margin = float(item.get("tol", exp.tol)), float(item.get("margin", exp.margin))
    referenced = []
    if forms[0] in ("better", "not_worse", "faster"):
        setattr(exp, forms[0], item.get(forms[0]))
        exp.than = item.get("than")
        referenced = [(forms[0], item.get(forms[0])), ("than", exp.than)]
    elif forms == ["trains"]:
        exp.trains, exp.fails = item.get("trains"), item.get("fails")
        referenced = [("trains", exp.trains), ("fails", exp.fails)]
        if exp.trains == exp.fails:
            problems.append(f"{key}: trains and fails name the same run {exp.trains!r}")
    elif forms == ["untested"]:
        exp.untested, exp.why = item.get("untested"), item.get("why")
        for name, text in (("untested", exp.untested), ("why", exp.why)):
            if not isinstance(text, str) or not text.strip():
                problems.append(f"{key}.{name}: expected the {'claim' if name == 'untested' else 'reason'} in words, "
                                f"got {text!r}")
    elif forms == ["same"]:
        pair = item["same"]
        if not (isinstance(pair, list) and len(pair) == 2):
            problems.append(f"{key}.same: expected a list of two variant names, got {pair!r}")
            return []
        exp.same = (pair[0], pair[1])
        referenced = [("same", pair[0]), ("same", pair[1])]
    else:
        exp.probe, exp.run = item.get("probe"), item.get("run")
        exp.below, exp.above = item.get("below"), item.get("above")
        if exp.probe not in PROBE_NAMES:
            problems.append(f"{key}.probe: got {exp.probe!r}, expected one of {', '.join(PROBE_NAMES)}")
        for name in ("layer", "than_layer"):
            value = item.get(name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                problems.append(f"{key}.{name}: got {value!r}, expected a layer index (0 first, -1 last)")
            setattr(exp, name, value if isinstance(value, int) and not isinstance(value, bool) else None)
        if (exp.layer is not None or exp.than_layer is not None) and exp.probe not in PER_LAYER_PROBES:
            problems.append(f"{key}.layer: {exp.probe} has no layers (expected one of {', '.join(PER_LAYER_PROBES)})")
        if exp.than_layer is not None and exp.versus is None:
            problems.append(f"{key}.than_layer: needs below or above naming a run")
        if (exp.below is None) == (exp.above is None):
            problems.append(f"{key}: a probe expectation needs exactly one of below or above")
        referenced = [("run", exp.run)] + ([("below" if exp.below is not None else "above", exp.versus)]
                                           if exp.versus else [])
    if "minus" in item:
        pair = item["minus"]
        if forms[0] not in ("better", "not_worse", "same"):
            problems.append(f"{key}.minus: belongs to better, not_worse or same, not to {forms[0]}")
        elif not (isinstance(pair, list) and len(pair) == 2):
            problems.append(f"{key}.minus: expected a list of two variant names (C, D: the claim reads (A - B) - (C - D)), "
                            f"got {pair!r}")
        else:
            exp.minus = (pair[0], pair[1])
            referenced += [("minus", pair[0]), ("minus", pair[1])]
    for field_name, name in referenced:
        if name not in names:
            problems.append(f"{key}.{field_name}: got {name!r}, expected one of {', '.join(sorted(names))}")
    return [exp]
