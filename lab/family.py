"""The family-wise view: Holm's step-down rule over every comparison a lab (or a whole record of labs) read from a
t interval, beside the per-line words.

Each line's word is a test at the 5% level on its own; a lab of 10 comparisons with no real effect anywhere gives
at least one word 40% of the time. Holm's rule (stats.holm) keeps a word only where the line's p-value, ranked
among the family's, stays below 0.05 / (tests left): the chance that any kept word in the family is wrong is
then at most 5%, whatever the dependence between the tests. The family is every line that is a test of its
claim: the comparisons and the probe comparisons between runs, inconclusive ones included (they were tested
too), not the lines without a test (not tested, invalid, too few seeds) nor the threshold and trains/fails
forms, which are counts, not intervals. A record's family pools the labs: `tfkit lab family DIR...`."""

from __future__ import annotations

from pathlib import Path

from ..errors import ConfigError
from ..jsonfile import read_json
from .stats import holm
from .verdict_line import DECIDED, FAMILY_LEVEL, Verdict


def apply_holm(verdicts: list[Verdict]) -> dict:
    """Set each tested verdict's Holm-adjusted p over `verdicts`; returns {m, level, words, kept}."""
    tested = [v for v in verdicts if v.p is not None]
    for v, adjusted in zip(tested, holm([v.p for v in tested])):
        v.holm = adjusted
    words = [v for v in tested if v.status in DECIDED]
    return {"m": len(tested), "level": FAMILY_LEVEL, "words": len(words),
            "kept": sum(v.holm < FAMILY_LEVEL for v in words)}


def family_lines(results: dict) -> list[str]:
    """results.md's family-wise section: one row per tested line, its p and Holm's adjusted p."""
    f, verdicts = results.get("family") or {}, results.get("verdicts", [])
    if not f or not f.get("m"):
        return []
    out = [f"{f['m']} line(s) of this lab are tests of their claims (read from a t interval). Holm's rule at a "
           f"family-wise {f['level']:g} keeps {f['kept']} of their {f['words']} verdict word(s) (holds, reversed, "
           "differs); a word it does not keep held on its own line but not once the lab's other tests are counted.",
           "", "| claim | word | p | Holm p | kept |", "| --- | --- | --- | --- | --- |"]
    for v in verdicts:
        if v.get("p") is None:
            continue
        where = f" on {v['on']}" if v.get("on") else ""
        kept = ("yes" if v["holm"] < f["level"] else "no") if v["status"] in DECIDED else "-"
        out.append(f"| {v['claim']}{where} | {v['status']} | {v['p']:.2g} | {v['holm']:.2g} | {kept} |")
    return out


def lab_results(folder: Path) -> list[tuple[str, dict]]:
    """(name, results) of a lab folder, or of every rung of a ladder folder (name: lab/rung)."""
    path = folder / "results.json"
    if not path.is_file():
        raise ConfigError(f"{folder}: not a finished lab folder (no results.json)")
    results = read_json(path, ConfigError, expect=dict)
    if "rungs" not in results:
        return [(results.get("claim") or folder.name, results)]
    return [(f"{results.get('claim')}/{name}", rung) for name, rung in results["rungs"].items()]


def record_family(folders: list[Path]) -> dict:
    """Holm over every tested line of every lab given: {m, kept, words, rows: [{lab, claim, on, status, p,
    holm_lab, holm}]}."""
    rows = []
    for folder in folders:
        for name, results in lab_results(Path(folder)):
            rows += [{"lab": name, "claim": v["claim"], "on": v.get("on") or "", "status": v["status"], "p": v["p"],
                      "holm_lab": v.get("holm")} for v in results.get("verdicts", []) if v.get("p") is not None]
    for row, adjusted in zip(rows, holm([r["p"] for r in rows])):
        row["holm"] = adjusted
    words = [r for r in rows if r["status"] in DECIDED]
    return {"m": len(rows), "level": FAMILY_LEVEL, "words": len(words),
            "kept": sum(r["holm"] < FAMILY_LEVEL for r in words), "rows": rows}


def render_record_family(family: dict) -> str:
    """The record's family-wise table (markdown)."""
    lines = [f"# Family-wise view of {family['m']} tested line(s)", "",
             f"Holm's rule at a family-wise {family['level']:g} over every lab given keeps {family['kept']} of "
             f"{family['words']} verdict word(s).", "",
             "| lab | claim | word | p | Holm p (lab) | Holm p (record) | kept |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in family["rows"]:
        where = f" on {r['on']}" if r["on"] else ""
        kept = ("yes" if r["holm"] < family["level"] else "no") if r["status"] in DECIDED else "-"
        lab_p = "-" if r["holm_lab"] is None else f"{r['holm_lab']:.2g}"
        lines.append(f"| {r['lab']} | {r['claim']}{where} | {r['status']} | {r['p']:.2g} | {lab_p} | "
                     f"{r['holm']:.2g} | {kept} |")
    return "\n".join(lines) + "\n"
