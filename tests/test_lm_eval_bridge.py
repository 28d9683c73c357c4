"""The lm-evaluation-harness bridge, offline: a task defined from a local JSONL file scores the same under
lm-eval with the tfkit model, under lm-eval's own HF backend on the `export-hf` folder of the same
checkpoint, and under `tfkit eval --task` (lm-eval is the oracle of task scores, STYLE.md 17)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

lm_eval = pytest.importorskip("lm_eval")
pytest.importorskip("transformers")

from tfkit.checkpoints.hf_export import export_hf
from tfkit.checkpoints.weights import save_model
from tfkit.evaluation.lm_eval_bridge import TfkitLM  # noqa: E402
from tfkit.evaluation.task_file import read_task  # noqa: E402
from tfkit.evaluation.task_scores import score_task  # noqa: E402
from tfkit.models import ModelConfig, build_model
from tfkit.tokenization import TokenizerSpec, load_tokenizer, train_tokenizer  # noqa: E402

CHOICE_YAML = """task: {name}
dataset_path: json
dataset_kwargs:
  data_files: {{test: {data}}}
  cache_dir: {cache}
test_split: test
output_type: multiple_choice
doc_to_text: context
doc_to_choice: choices
doc_to_target: gold
metric_list:
  - metric: acc
  - metric: acc_norm
"""
CLOZE_YAML = """task: {name}
dataset_path: json
dataset_kwargs:
  data_files: {{test: {data}}}
  cache_dir: {cache}
test_split: test
output_type: loglikelihood
doc_to_text: "{{{{text.split(' ')[:-1]|join(' ')}}}}"
doc_to_target: "{{{{' '+text.split(' ')[-1]}}}}"
target_delimiter: ""
metric_list:
  - metric: perplexity
  - metric: acc
"""


@pytest.fixture(scope="module")
def offline(tmp_path_factory):
    """No download, and the datasets cache in a temporary folder."""
    with pytest.MonkeyPatch.context() as patch:
        for name in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
            patch.setenv(name, "1")
        patch.setenv("HF_HOME", str(tmp_path_factory.mktemp("hf-home")))
        yield


@pytest.fixture(scope="module")
def checkpoint(english_text: str, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("bridge")
    train_tokenizer(TokenizerSpec(kind="bpe", vocab_size=300), [english_text[:60_000]], root / "tok",
                    show_progress=False)
    tok = load_tokenizer(root / "tok")
    torch.manual_seed(0)
    net = build_model(ModelConfig(arch="gpt", vocab_size=tok.vocab_size, d_model=32, n_layers=2, n_heads=4,
                                  max_seq_len=64, init_std=0.3))
    save_model(net, root / "ckpt", step=3)
    tok.save(root / "ckpt")
    return root / "ckpt"


def write_tasks(folder: Path, english_text: str) -> dict[str, Path]:
    """A multiple-choice task and a cloze task, as JSONL files and as lm-eval task YAMLs in `folder`."""
    sentences = [s.strip() for s in english_text[:20_000].split(".") if 6 <= len(s.split()) <= 14][:24]
    choice_items = [{"context": " ".join(s.split()[:-3]), "gold": i % 3,
                     "choices": [" ".join(sentences[(i + k) % len(sentences)].split()[-3:]) for k in range(3)]}
                    for i, s in enumerate(sentences)]
    for item in choice_items:  # the right answer is the sentence's own ending
        item["choices"][item["gold"]], item["choices"][0] = item["choices"][0], item["choices"][item["gold"]]
    files = {"mc": folder / "mc.jsonl", "cloze": folder / "cloze.jsonl"}
    files["mc"].write_text("".join(json.dumps(i) + "\n" for i in choice_items), encoding="utf-8")
    files["cloze"].write_text("".join(json.dumps({"text": s}) + "\n" for s in sentences), encoding="utf-8")
    for key, template in (("mc", CHOICE_YAML), ("cloze", CLOZE_YAML)):
        (folder / f"{key}.yaml").write_text(template.format(name=f"tfkit_{key}", data=files[key],
                                                            cache=folder / "datasets-cache"))
    return files


def run_lm_eval(model, folder: Path) -> dict[str, dict]:
    """lm-eval's results and samples of each task, a task per run: in one run, lm-eval 0.4.13's HF backend
    shares the logits of requests whose tokens differ only in the last one and then reads a shorter
    continuation's log-probabilities from the longer one's first positions (a cloze item and the same
    sentence as a multiple-choice item scored -51.9 instead of -52.3, which the HF backend gives that item
    alone). Only the local tasks are indexed: lm-eval's own ~27,000 task files would take most of the time."""
    from lm_eval.tasks import TaskManager

    manager = TaskManager(include_path=str(folder), include_defaults=False)
    return {task: lm_eval.simple_evaluate(model=model, tasks=[task], batch_size=4, task_manager=manager, device="cpu",
                                          log_samples=True)
            for task in ("tfkit_mc", "tfkit_cloze")}


def loglikelihoods(out: dict, task: str) -> list[float]:
    return [lp for sample in out[task]["samples"][task] for lp, _ in sample["filtered_resps"]]


@pytest.mark.slow  # four lm-eval runs and transformers' model: seconds; CI's slow run holds it
def test_a_local_task_scores_the_same_in_lm_eval_tfkit_and_lm_evals_hf_backend(checkpoint, english_text, offline,
                                                                               tmp_path):
    files = write_tasks(tmp_path, english_text)
    hf_dir = export_hf(checkpoint, tmp_path / "hf")
    bridged = run_lm_eval(TfkitLM(str(checkpoint), batch_size=4), tmp_path)
    reference = run_lm_eval(lm_eval.api.registry.get_model("hf")(pretrained=str(hf_dir), batch_size=4, device="cpu",
                                                                 dtype="float32"), tmp_path)
    own = {key: score_task(checkpoint, read_task(files[key]), batch_size=4) for key in files}

    for key, metrics in (("mc", ("acc", "acc_norm")), ("cloze", ("acc", "perplexity"))):
        task = f"tfkit_{key}"
        ours, theirs = bridged[task]["results"][task], reference[task]["results"][task]
        assert loglikelihoods(bridged, task) == pytest.approx(loglikelihoods(reference, task), abs=1e-3)
        for metric in metrics:
            assert ours[f"{metric},none"] == pytest.approx(theirs[f"{metric},none"], rel=1e-5), (key, metric)
            assert own[key][metric] == pytest.approx(theirs[f"{metric},none"], rel=1e-5), (key, metric)
        assert own[key]["acc_stderr"] == pytest.approx(theirs["acc_stderr,none"], rel=1e-5)
    assert 0 < own["mc"]["acc"] < 1  # a test that could tell two scorers apart


def test_rolling_loglikelihood_and_generation_answer_through_the_bridge(checkpoint):
    from lm_eval.api.instance import Instance

    model = TfkitLM(str(checkpoint), batch_size=2)
    text = "The quick brown fox jumps over the lazy dog. " * 8  # longer than one 64-token window
    rolling = model.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (text,), 0)])[0]
    ids = model.tokenizer.encode(text)
    assert len(ids) > 64
    stream = torch.tensor([model.tokenizer.eos_id] + ids)  # (n + 1,): a document starts after the separator
    total = 0.0
    with torch.no_grad():  # the oracle: each 64 tokens predicted from the 64 (or fewer) tokens before the last
        for start in range(0, len(ids), 64):
            end = min(start + 64, len(ids))  # predicts stream[start + 1 .. end]
            low = max(0, end - 64)
            logprobs = model.scorer.model(stream[None, low:end])[0].log_softmax(-1)  # (end - low, V)
            total += logprobs[start - low:].gather(-1, stream[start + 1:end + 1, None]).sum().item()
    assert rolling == pytest.approx(total, abs=1e-3)
    [text_out] = model.generate_until([Instance("generate_until", {}, ("The quick brown", {"until": ["."],
                                                                                          "max_gen_toks": 8}), 0)])
    assert "." not in text_out and isinstance(text_out, str)
