"""The paper beside the verdict: a spec's `paper:` block (the source's regime: model size, tokens, data) and each
expectation's `reported:` effect, printed next to our verdict with whether the two agree in direction and how
far apart the two regimes are.

A verdict at 1M parameters and 0.6 tokens per parameter is not the paper's finding at 65M parameters and 2.5B
tokens, and a reader should not have to work that out: `agreement` says "agrees in direction" only where our
interval lies wholly on the side of 0 the paper's effect does, "disagrees" where it lies wholly on the other,
and "not comparable" where it holds 0 or there is no verdict to compare (not tested, invalid, no verdict); the
scale ratio puts the paper's parameters and tokens over ours."""

from __future__ import annotations

from typing import Any

from .expect import mapping

PAPER_KEYS = ("cite", "params", "tokens", "data", "note")
AGREES, DISAGREES, NOT_COMPARABLE = "agrees in direction", "disagrees", "not comparable"


def parse_paper(value: Any, key: str, problems: list[str]) -> dict | None:
    """{cite, params, tokens, data, note}: the source's regime; params and tokens are numbers or null (not
    stated by the paper), cite is required."""
    if value is None:
        return None
    raw = mapping(value, key, PAPER_KEYS, problems)
    if not isinstance(raw.get("cite"), str) or not raw["cite"].strip():
        problems.append(f"{key}.cite: expected the paper (authors, year, where in it), got {raw.get('cite')!r}")
    for name in ("params", "tokens"):
        v = raw.get(name)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0):
            problems.append(f"{key}.{name}: got {v!r}, expected a positive number or null (not stated)")
    for name in ("data", "note"):
        if raw.get(name) is not None and not isinstance(raw[name], str):
            problems.append(f"{key}.{name}: got {raw[name]!r}, expected text")
    return {k: raw.get(k) for k in PAPER_KEYS}


def agreement(status: str, lo: float | None, hi: float | None, predicted: int | None) -> str:
    """Our verdict against the paper's effect (module doc). `predicted`: the side of 0 the paper's effect lies
    on for a line read from an interval of differences (-1 below, +1 above), None for the other forms."""
    if predicted is not None and lo is not None and status not in ("not tested", "invalid", "no verdict"):
        side = -1 if hi < 0 else 1 if lo > 0 else 0
        return AGREES if side == predicted else DISAGREES if side == -predicted else \
            f"{NOT_COMPARABLE} (our interval holds 0)"
    if status == "holds":
        return AGREES
    if status in ("reversed", "differs", "does not hold"):
        return DISAGREES
    return f"{NOT_COMPARABLE} ({status})"


def ratio(theirs: float | None, ours: float | None) -> str:
    if not theirs or not ours:
        return "not stated"
    r = theirs / ours
    return f"{r:,.0f}x" if r >= 10 else f"{r:.2g}x"


def short_count(n: float) -> str:
    for size, unit in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= size:
            return f"{n / size:.3g}{unit}"
    return f"{n:g}"


def regime(paper: dict) -> str:
    """"65M parameters, 2.5B tokens, WMT 2014 en-de": what the paper measured at."""
    parts = [f"{short_count(paper['params'])} parameters" if paper.get("params") else "parameters not stated",
             f"{short_count(paper['tokens'])} tokens" if paper.get("tokens") else "tokens not stated"]
    return ", ".join(parts + ([paper["data"]] if paper.get("data") else []))


def comparison(paper: dict, reported: str, status: str, lo: float | None, hi: float | None,
               predicted: int | None, ours: dict | None) -> dict:
    """What results.md prints beside a verdict: the paper, its regime and reported effect, the agreement word
    and the scale ratio of the paper's regime to ours (`ours`: {params, tokens} of our run)."""
    ours = ours or {}
    return {"cite": paper["cite"], "regime": regime(paper), "reported": reported or "",
            "agreement": agreement(status, lo, hi, predicted),
            "params_ratio": ratio(paper.get("params"), ours.get("params")),
            "tokens_ratio": ratio(paper.get("tokens"), ours.get("tokens"))}
