"""What a lab leaves behind: results.json, results.md (table, verdicts, warnings, probes) and plots.

`write_report` is pure rendering over the results dict, so `tfkit lab report DIR` rebuilds the same files
from results.json and the spec copied into the lab folder, e.g. after editing an expectation."""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import ConfigError
from ..files import write_atomic
from ..jsonfile import read_json
from .annotate import annotate
from .documents import document_lines
from .downstream import MIN_MATTHEWS
from .family import apply_holm, family_lines
from .mechanism_lines import lengths_lines, mechanism_lines, own_masking_lines
from .scoring import is_degradation, sweep_warnings
from .provenance import provenance_line
from .registration import read_registration
from .scale import scale_lines
from .spec import LabSpec, load_spec
from .verdict import MIN_SEEDS, coverage_warning, judge, reliance_warning, summary

RESULTS, MARKDOWN = "results.json", "results.md"
UNITS = {"loss": "nats per token", "bits_per_byte": "bits per byte",
         "masked_loss": "nats per [MASK]ed token, every chosen position replaced by [MASK]"}


RULE = ("Each verdict line gives the mean paired difference Δ = A - B over seeds (lower is better) and its "
        "95% paired t interval, mean ± t(0.975, n-1) · sd / √n; the verdict is read from that interval. `A < "
        "B` holds when the whole interval lies below -margin and is reversed when it lies above +margin; `A "
        "not worse than B` holds when it lies below +margin; `A = B` (TOST equivalence, two one-sided tests "
        "at 2.5%) holds when it lies inside ±tol and differs when it lies wholly outside; anything else is "
        f"inconclusive. Below {MIN_SEEDS} seeds, and in a quick lab, a line gives the numbers and no "
        "verdict; a comparison involving a run that did not train (see 'Did every run train?') is not tested."
        " Each comparison is judged on its eval text and also gives Δ on the lab's other eval texts; a line is "
        "flagged 'texts disagree' where two texts' intervals lie wholly on opposite sides of 0. A probe bound "
        "that names another run is judged like a loss, on the paired interval of the probe's per-seed differences."
        " A comparison involving a run whose outputs change with tokens its mask hides while it trains (the "
        "mask_leak probe, train mode) is invalid for a causal model. A probe claim holds when its value is "
        "within the bound in every seed. `A trains where B does not` is read from the gates seed by seed: it "
        "holds when A trained and B did not in every seed, does not hold when B trained in every seed, and is "
        "mixed otherwise; where A did not train it is not tested (reversed when A failed and B trained in every "
        "seed). A claim the spec marks untested (one this lab cannot test, e.g. at this scale) says why instead.")


NOTES = ("After the word, a line says what a reader needs before quoting it: an inconclusive line the seeds that "
         "would decide it at the spread it measured (or that none would at its mean) and the smallest effect its "
         "seeds detect; the reason for its margin; whether Holm's rule keeps its word once the lab's other tests "
         "are counted; whether its expectation was fixed before the data (hashed into registration.json before "
         "the first training) or written after; what earlier looks at fewer seeds read; and whether it agrees in "
         "direction with the paper it quotes.")


def registration_line(registration: dict | None) -> str:
    if not registration:
        return "No registration: this lab ran before expectations were registered, so no verdict says whether its " \
               "expectation was fixed before the data."
    when = "before its first training" if registration.get("before_data") else "after some of its trainings had run"
    looks = "; ".join(f"an earlier look at {look['seeds']} seeds ({look['at']})" for look in registration["looks"])
    return (f"Expectations registered {registration['registered_at']}, {when} (expect block sha256 "
            f"{registration['expect_sha256']}, seeds {', '.join(map(str, registration['seeds']))})"
            + (f"; {looks}" if looks else "") + ".")


def paper_lines(results: dict) -> list[str]:
    """Each verdict beside the paper it quotes: the paper's regime and reported effect, the agreement word, and
    how many times our parameters and tokens the paper's regime is."""
    rows = [v for v in results["verdicts"] if v.get("paper")]
    if not rows:
        return []
    out = ["| claim | ours | paper | its regime | it reported | agreement | paper / ours: parameters, tokens |",
           "| --- | --- | --- | --- | --- | --- | --- |"]
    for v in rows:
        p = v["paper"]
        out.append(f"| {v['claim']} | {v['status']} | {p['cite']} | {p['regime']} | {p['reported'] or '-'} | "
                   f"{p['agreement']} | {p['params_ratio']}, {p['tokens_ratio']} |")
    return out


def _cell(stats: dict | None) -> str:
    if stats is None:
        return "-"
    spread = f" ± {stats['sd']:.3f}" if stats["n"] > 1 else ""
    return f"{stats['mean']:.3f}{spread}"


def _delta(stats: dict | None) -> str:
    return "-" if stats is None or stats["delta"] is None else f"{stats['delta']:+.3f}"


def table(results: dict, stats: dict) -> list[str]:
    """Markdown rows: variant x eval label, mean ± sd over seeds and the paired delta to the reference."""
    labels = list(dict.fromkeys(label for row in stats.values() for label in row))
    names = [f"{label} (past - within)" if is_degradation(label) else label for label in labels]
    head = ["variant", "kind"] + [x for name in names for x in (name, f"Δ {name}")]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(" --- " for _ in head) + "|"]
    for name, row in results["rows"].items():
        cells = [name + (" (ref)" if name == results["reference"] else ""), row["kind"]]
        for label in labels:
            cells += [_cell(stats.get(name, {}).get(label)), _delta(stats.get(name, {}).get(label))]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def gate_lines(results: dict) -> list[str]:
    """The gates (gates.py) as a table: every trained run's loss, unigram and step-0 figures, seed means."""
    g, tuned = results.get("gates"), bool(results.get("downstream"))
    if not g:
        return []
    what = {"masked_loss": "Loss on the [MASK]ed positions only (every chosen position replaced by [MASK]: nothing to "
                           "copy from the input)"}.get(g.get("metric", "loss"), "Loss")
    out = [f"{what} on {g['label']} of every training against the unigram model of its training text and the "
           f"weights it started from (step 0), means over seeds. A run learned when its loss is at least "
           f"{g['min_gain']:g} nats below the unigram figure; it diverged when its loss is not finite or, trained "
           f"from scratch, more than {g['min_gain']:g} above step 0. A comparison involving a run that did not "
           "train is not tested." + (f" A downstream fine-tuning (kind finetune) learned when its Matthews correlation "
                                     f"on the held-out labels reaches {MIN_MATTHEWS:g} (0 is chance)."
                                     if tuned else ""), "",
           f"| run | kind | loss | unigram | step 0 |{' Matthews |' if tuned else ''} trained |",
           "|" + " --- |" * (7 if tuned else 6)]
    stopped = []
    for name, run in g["runs"].items():
        seeds = run["seeds"]
        if not seeds:
            continue
        known = {k: [v[k] for v in seeds.values() if v.get(k) is not None]
                 for k in ("loss", "unigram", "step0", "matthews")}
        mean = {k: f"{sum(v) / len(v):.3f}" if v else "-" for k, v in known.items()}  # a divergence has no figures
        stopped += [f"- {name}, seed {seed}: {v['why']}" for seed, v in seeds.items() if v.get("why")]
        failed = {}
        for seed, v in seeds.items():
            if v["status"] != "trained":
                failed.setdefault(v["status"], []).append(seed)
        problems = "; ".join(f"{status}: seed {', '.join(which)}" for status, which in failed.items())
        trained = f"{len(seeds) - sum(map(len, failed.values()))}/{len(seeds)}" + (f" ({problems})" if problems else "")
        out.append(f"| {name} | {run['kind']} | {mean['loss']} | {mean['unigram']} | {mean['step0']} |"
                   f"{' ' + mean['matthews'] + ' |' if tuned else ''} {trained} |")
    if stopped:
        out += ["", "Trainings the trainer stopped on non-finite updates (no final checkpoint; their loss is nan):",
                ""] + stopped
    return out


def probe_lines(results: dict) -> list[str]:
    probes, out = results.get("probes", {}), []
    if "attention_reliance" in probes:
        p = probes["attention_reliance"]
        for label, seeds in p["values"].items():
            values = ", ".join(f"{v:.3f}" for v in seeds.values())
            out.append(f"- attention reliance of {p['run']} on {label}: removing attention costs {values} nats "
                       f"(seeds {', '.join(seeds)}; threshold {p['threshold']:g})")
    for key, what in (("flash_max_diff", "flash vs naive attention: max |logit difference|"),
                      ("mask_leak", "mask leak (train mode): max |output change| at positions the mask hides "
                                    "changes from"),
                      ("attention_logits", "largest |attention logit| (q·k scaled, before the softmax) on the first "
                                           "eval batch")):
        for run, seeds in probes.get(key, {}).get("values", {}).items():
            out.append(f"- {what}, {run}: " + ", ".join(f"{v:.3g}" if key == "attention_logits" else f"{v:.2e}"
                                                         for v in seeds.values())
                       + f" (seeds {', '.join(seeds)})")
    if "memory" in probes:
        m = probes["memory"]
        out.append(f"- activation memory of one training step (batch 1), {m['run']}: naive / flash = "
                   f"{m['ratio']:.1f}x at T={m['seq_lens'][-1]}")
        out += ["", "| T | flash MiB | naive MiB |", "| --- | --- | --- |"]
        out += [f"| {t} | {f:.1f} | {n:.1f} |" for t, f, n in zip(m["seq_lens"], m["flash"], m["naive"])]
    if "train_speed" in probes:
        t = probes["train_speed"]
        if t.get("why"):
            out.append(f"- training speed, flash against naive: not measured ({t['why']})")
        else:
            out.append(f"- training speed of one step (fresh weights, bf16) on {t['device']}, {t['run']}: flash / naive = "
                       f"{t['speedup']:.2f}x at T={t['seq_lens'][-1]}")
            out += ["", "| T | flash tokens/s | naive tokens/s |", "| --- | --- | --- |"]
            out += [f"| {n} | {f:,.0f} | {v:,.0f} |" for n, f, v in zip(t["seq_lens"], t["flash"], t["naive"])]
    if "decode_speed" in probes:
        values = probes["decode_speed"]["values"]
        sizes = list(dict.fromkeys(b for v in values.values() for b in v["tokens_per_sec"]))
        first = next(iter(values.values()))
        out += ["", f"Decoding (greedy, {first['new_tokens']} new tokens after {first['context']}, prefill included, "
                "first seed's weights):", "",
                "| run | KV cache B/token (bf16) | " + " | ".join(f"tok/s at batch {b}" for b in sizes) + " |",
                "|" + "|".join(" --- " for _ in range(len(sizes) + 2)) + "|"]
        out += [f"| {run} | {v['kv_bytes_per_token']:,} | "
                + " | ".join(f"{v['tokens_per_sec'].get(b, 0):,.0f}" for b in sizes) + " |" for run, v in values.items()]
    return out


def render(results: dict) -> str:
    r = results
    seeds = ", ".join(map(str, r["seeds"]))
    lines = [f"# tfkit lab: {r['claim']}", ""]
    if r.get("title"):
        lines += [r["title"] + (f" ({r['source']})" if r.get("source") else ""), ""]
    lines += [f"{r['metric']} ({UNITS[r['metric']]}, lower is better) on "
              + ", ".join(f"{k} = `{v}`" for k, v in r["evals"].items())
              + f"; {len(r['seeds'])} paired seed(s) ({seeds}); mean ± sd over seeds; Δ = paired difference "
              f"to the reference {r['reference']}.", ""]
    if r.get("downstream"):
        d = r["downstream"]
        lines += ["Rows VARIANT+HEAD (kind finetune) are each variant's final checkpoint fine-tuned on a labelled "
                  f"task: {d['metric']} (1 - accuracy, lower is better) on {d['label']} = `{d['data']}`, its held-out "
                  "examples, at the fine-tuning's last step.", ""]
    if r.get("sweep"):
        sw = r["sweep"]
        lines += [f"Sweep: {sw['key']} in {{{', '.join(map(str, sw['values']))}}}; each variant's row (kind best) is "
                  f"its run with the lowest mean {r['metric']} on {sw.get('on') or next(iter(r['evals']))} (the "
                  "selection text), and verdicts compare those: "
                  + ", ".join(f"{v} = {run}" for v, run in sw["best"].items()) + ".", ""]
    scale = scale_lines(r)
    if scale:
        lines += ["What the results rest on (the first seed's runs; an uptraining's tokens are its own, seen after "
                  "those of the run it continues):", ""] + scale + [""]
    lines += [RULE + " " + NOTES, ""]
    about = " ".join(x for x in (provenance_line(r.get("provenance")), registration_line(r.get("registration"))) if x)
    lines += ([about, ""] if about else []) + table(r, r["summary"])
    lines += ["", "## Verdicts", ""]
    lines += [f"- {v['line']}" for v in r["verdicts"]] or ["- (the spec states no expectation)"]
    for title, section in (("Family-wise view (Holm)", family_lines(r)), ("Against the papers", paper_lines(r))):
        if section:
            lines += ["", f"## {title}", ""] + section
    if r["warnings"]:
        lines += ["", "## Warnings", ""] + [f"- {w}" for w in r["warnings"]]
    for title, section in (("Documents in packed rows", document_lines(r)), ("Did every run train?", gate_lines(r)),
                           ("Past the training length", lengths_lines(r)),
                           ("Each model on its own masking", own_masking_lines(r))):
        if section:  # a section only where the lab measured it
            lines += ["", f"## {title}", ""] + section
    probes = "\n".join(probe_lines(r) + mechanism_lines(r)).strip("\n").split("\n")
    if probes != [""]:
        lines += ["", "## Probes", ""] + probes
    if r.get("timing_s"):
        total = sum(r["timing_s"].values())
        lines += ["", f"Training wall time: {total / 60:.1f} min over the {len(r['timing_s'])} run(s) this `lab run` trained."]
    return "\n".join(lines) + "\n"


def complete(results: dict, spec: LabSpec) -> dict:
    """results + summary, verdicts and warnings computed from the spec's expectations."""
    results = dict(results)
    results["summary"] = summary(results)
    verdicts = [annotate(judge(exp, results), exp, results, spec.paper) for exp in spec.expect]
    results["family"] = apply_holm(verdicts)
    results["verdicts"] = [v.to_dict() for v in verdicts]
    warnings = [reliance_warning(results, label) for label in results["evals"]]
    warnings += [coverage_warning(results, label) for label in results["evals"]] + sweep_warnings(results)
    results["warnings"] = [w for w in warnings if w]
    return results


def write_report(folder: Path, results: dict, spec: LabSpec) -> dict:
    """results.json and results.md (atomically) and the plots when matplotlib is installed. The registration of
    the folder's expectations (registration.py) is read again each time: a later look adds to it."""
    results = complete({**results, "registration": read_registration(folder)}, spec)
    write_atomic(folder / RESULTS, json.dumps(results, indent=2) + "\n")
    write_atomic(folder / MARKDOWN, render(results))
    from .plots import write_plots

    results["plots"] = write_plots(folder, results)
    return results


def report_folder(folder: Path) -> dict:
    """Rebuild a lab folder's report from its results.json and spec copy (`tfkit lab report DIR`)."""
    path, spec_copy = folder / RESULTS, folder / "spec.yaml"
    if not path.is_file() or not spec_copy.is_file():
        raise ConfigError(f"{folder}: not a finished lab folder (expected {RESULTS} and spec.yaml); "
                          "run `tfkit lab run CLAIM --out DIR` first")
    results = read_json(path, ConfigError)
    return write_report(folder, results, load_spec(str(spec_copy)))
