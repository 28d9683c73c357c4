"""Lab specs and lab folders that are wrong or damaged: a probe setting of the wrong type or name, a spec
nested thousands of levels deep or an alias bomb, is refused before the first training step; continuing a
lab whose lab.json or a scores file is damaged (garbage, a list, nested too deep, the wrong structure) is
one line naming the file, and the folder is left as it was."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from fault_helpers import assert_one_line_error, changes, cli, snapshot

SPEC = """\
# a tiny conversion lab for the fault cases
base: gpt-tiny
reference: mha
variants: {mha: []}
convert: {from: mha, kv_heads: [2], methods: [mean]}
probes: {attention_reliance: {run: mha}}
expect:
  - {better: mha, than: kv2-mean, source: test}
"""
DEEP = "[" * 5000 + "]" * 5000


def _alias_bomb() -> str:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 8)]
    return SPEC + "\n".join(lines) + "\n"


SPECS = {
    "threshold-text": (SPEC.replace("{run: mha}", "{run: mha, threshold: abc}"), "probes.attention_reliance.threshold"),
    "threshold-a-list": (SPEC.replace("{run: mha}", "{run: mha, threshold: [1]}"), "probes.attention_reliance.threshold"),
    "context-text": (SPEC.replace("probes: {", "probes: {decode_speed: {runs: [mha], context: abc}, "),
                     "probes.decode_speed.context"),
    "batch-sizes-text": (SPEC.replace("probes: {", "probes: {decode_speed: {batch_sizes: [a, b]}, "),
                         "probes.decode_speed.batch_sizes"),
    "new-tokens-negative": (SPEC.replace("probes: {", "probes: {decode_speed: {new_tokens: -3}, "),
                            "probes.decode_speed.new_tokens"),
    "seq-lens-a-number": (SPEC.replace("probes: {", "probes: {memory: {run: mha, seq_lens: 5}, "), "probes.memory.seq_lens"),
    "runs-a-string": (SPEC.replace("probes: {", "probes: {flash_equality: {runs: mha}, "), "probes.flash_equality.runs"),
    "unknown-setting": (SPEC.replace("{run: mha}", "{run: mha, treshold: 0.2}"), "did you mean 'threshold'"),
    "nested-5000": (SPEC + "cost: " + DEEP + "\n", "nest more than"),
    "alias-bomb": (_alias_bomb(), "aliases expand"),
}


@pytest.mark.parametrize("case", sorted(SPECS), ids=[f"spec-{c}" for c in sorted(SPECS)])
def test_a_wrong_spec_is_refused_before_any_training(case, in_tmp, monkeypatch):
    from tfkit.lab import engine

    text, expected = SPECS[case]
    (in_tmp / "claim.yaml").write_text(text)
    monkeypatch.setattr(engine, "train_job", lambda *a, **k: pytest.fail("a run was trained"))
    before = snapshot(in_tmp)
    line = assert_one_line_error(cli(["lab", "run", in_tmp / "claim.yaml", "--quick", "--out", in_tmp / "out"]),
                                 expected)
    assert "claim.yaml" in line, line
    assert not changes(before, snapshot(in_tmp))


# --- continuing a damaged lab folder -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_lab(english_text, tmp_path_factory):
    folder = tmp_path_factory.mktemp("lab")
    (folder / "train.txt").write_text(english_text[:60_000])
    (folder / "valid.txt").write_text(english_text[60_000:70_000])
    (folder / "tiny.yaml").write_text(SPEC)
    args = ["lab", "run", folder / "tiny.yaml", "--quick", "--seeds", "1", "--data", folder / "train.txt",
            "--eval", folder / "valid.txt", "--set", f"data.valid={folder / 'valid.txt'}"]
    result = cli([*args, "--out", folder / "out"])
    assert result.exit_code == 0, result.output
    return folder / "out", args


def _json(value):
    return lambda path: path.write_text(json.dumps(value))


DAMAGE = {
    "garbage": lambda path: path.write_bytes(os.urandom(200)),
    "a-list": _json([1, 2]),
    "nested-5000": lambda path: path.write_text(DEEP),
    "empty": lambda path: path.write_bytes(b""),
}
FILES = {"lab.json": {**DAMAGE, "no-options": _json({"claim": "tiny"}), "options-a-list": _json({"claim": "tiny",
                                                                                                  "options": [1]})},
         "scores": {**DAMAGE, "a-score-a-number": _json({"valid": 5})}}
CASES = [(file, damage) for file, damages in FILES.items() for damage in damages]


@pytest.mark.parametrize(("file", "damage"), CASES, ids=[f"continue-{f}-{d}" for f, d in CASES])
def test_continuing_a_damaged_lab_is_one_line_and_changes_nothing(file, damage, tiny_lab, tmp_path, monkeypatch):
    monkeypatch.setenv("TFKIT_CACHE", str(tmp_path / ".cache"))
    out, args = tiny_lab
    lab = tmp_path / "out"
    shutil.copytree(out, lab)
    target = lab / "lab.json" if file == "lab.json" else sorted((lab / "scores").glob("*.json"))[0]
    FILES[file][damage](target)
    before = snapshot(lab)
    assert_one_line_error(cli([*args, "--out", lab]), target.name)
    assert not changes(before, snapshot(lab)), changes(before, snapshot(lab))
