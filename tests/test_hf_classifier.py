"""Fine-tuned classifiers through HuggingFace (checkpoints/hf_classifier.py): `export-hf` of a tiny BERT, GPT-2
(learned positions) and Llama-layout classifier loads as transformers' `*ForSequenceClassification` with the
same logits on padded batches, `import-hf` of the export gives the same logits back as a tfkit classifier,
and a head HF cannot compute is refused in one line, exit code 2."""

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from tfkit.checkpoints.weights import load_classifier, save_model
from tfkit.cli.main import app
from tfkit.models import build_model
from tfkit.models.heads import HeadConfig, SequenceClassifier

from helpers import tiny_cfg

transformers = pytest.importorskip("transformers")

LABELS = ("neg", "neutral", "pos")
PAD = 60  # the last id of tiny_cfg's vocabulary: never drawn as a real token below
LAYOUTS = {  # family: (model overrides, pooling, the HF class)
    "bert": (dict(arch="bert", norm_placement="post", activation="gelu", pad_token_id=PAD), "cls", "BertForSequenceClassification"),
    "gpt2": (dict(arch="gpt", positions="learned", activation="gelu", pad_token_id=PAD), "last",
             "GPT2ForSequenceClassification"),
    "llama": (dict(arch="gpt", positions="rope", norm="rmsnorm", activation="swiglu", bias=False, n_kv_heads=2,
                   tie_embeddings=False, pad_token_id=PAD), "last", "LlamaForSequenceClassification"),
}


def run(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def write_classifier(folder: Path, family: str, task: str = "classification", pooling: str | None = None,
                     bias: float = 0.0, head_bias: bool | None = None, **model) -> SequenceClassifier:
    """A tiny classifier checkpoint as `tfkit finetune` writes one, with trained-looking (random) weights;
    `head_bias` True gives a bias-free body a classifier bias, as fine-tuning did before it followed the body."""
    overrides, default_pooling, _ = LAYOUTS[family]
    torch.manual_seed(0)
    head = HeadConfig(task=task, labels=LABELS if task == "classification" else (), pooling=pooling or default_pooling,
                      dropout=0.1, bias=head_bias)
    classifier = SequenceClassifier(build_model(tiny_cfg(**{**overrides, **model})), head).eval()
    with torch.no_grad():
        for param in classifier.parameters():  # no zero biases, unit norms: every weight must be copied to match
            param.add_(torch.randn_like(param) * 0.05)
        if family != "bert" and classifier.classifier.bias is not None:
            classifier.classifier.bias.fill_(bias)
    save_model(classifier, folder)  # its head from the classifier
    return classifier


def padded_batch() -> tuple[torch.Tensor, torch.Tensor]:
    """Three rows of 10, two of them right-padded with PAD (the ids HF finds the last real token from)."""
    ids = torch.randint(0, PAD, (3, 10), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(3, 10, dtype=torch.bool)
    mask[0, 4:], mask[2, 7:] = False, False
    ids[~mask] = PAD
    return ids, mask


def tfkit_logits(model: SequenceClassifier) -> torch.Tensor:
    ids, mask = padded_batch()
    with torch.no_grad():
        return model(ids, attention_mask=mask)


@pytest.mark.parametrize("family", list(LAYOUTS))
@pytest.mark.parametrize("task", ["classification", "regression"])
def test_export_computes_tfkits_logits_in_transformers_and_imports_back(tmp_path, family, task):
    ours = write_classifier(tmp_path / "ckpt", family, task)
    result = run("export-hf", tmp_path / "ckpt", "--out", tmp_path / "hf")
    assert result.exit_code == 0, result.output
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["architectures"] == [LAYOUTS[family][2]] and config["pad_token_id"] == PAD
    assert config["problem_type"] == ("regression" if task == "regression" else "single_label_classification")
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "hf").eval()
    assert type(hf).__name__ == LAYOUTS[family][2]
    if task == "classification":
        assert hf.config.id2label == dict(enumerate(LABELS)) and hf.config.num_labels == 3
    ids, mask = padded_batch()
    with torch.no_grad():
        expected = hf(input_ids=ids, attention_mask=mask.long()).logits
    torch.testing.assert_close(tfkit_logits(ours), expected, atol=1e-5, rtol=1e-4)
    card = (tmp_path / "hf" / "README.md").read_text()  # the model card says what the folder is
    assert "pipeline_tag: text-classification" in card and LAYOUTS[family][2] in card
    assert "AutoModelForSequenceClassification" in card and "CausalLM" not in card and "MaskedLM" not in card

    result = run("import-hf", tmp_path / "hf", "--out", tmp_path / "back")
    assert result.exit_code == 0, result.output
    assert "head" not in result.stderr  # the bare body's missing LM head is no news for a classifier
    assert "label rows with: tfkit predict" in result.stderr and "pretrain" not in result.stderr
    back, _ = load_classifier(tmp_path / "back")
    assert back.head_config.task == task and back.head_config.labels == ours.head_config.labels
    torch.testing.assert_close(tfkit_logits(back), expected, atol=1e-5, rtol=1e-4)


def test_a_mean_pooled_bert_is_refused_saying_why(tmp_path):
    write_classifier(tmp_path / "ckpt", "bert", pooling="mean")
    result = run("export-hf", tmp_path / "ckpt", "--out", tmp_path / "hf")
    assert result.exit_code == 2 and len(result.stderr.strip().splitlines()) == 1, result.output
    assert "head.pooling=mean has no HuggingFace equivalent: BertForSequenceClassification pools the [CLS]" \
        in result.stderr
    assert not (tmp_path / "hf").exists()


def test_a_gpt2_classifiers_bias_moves_into_the_final_layernorm_with_the_same_logits(tmp_path):
    ours = write_classifier(tmp_path / "ckpt", "gpt2", bias=0.25)
    result = run("export-hf", tmp_path / "ckpt", "--out", tmp_path / "hf")
    assert result.exit_code == 0 and "classifier.bias folded into transformer.ln_f.bias" in result.stderr
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "hf").eval()
    ids, mask = padded_batch()
    with torch.no_grad():
        expected = hf(input_ids=ids, attention_mask=mask.long()).logits
    torch.testing.assert_close(tfkit_logits(ours), expected, atol=1e-5, rtol=1e-4)
    assert run("import-hf", tmp_path / "hf", "--out", tmp_path / "back").exit_code == 0
    torch.testing.assert_close(tfkit_logits(load_classifier(tmp_path / "back")[0]), expected, atol=1e-5, rtol=1e-4)


def test_a_llama_classifier_has_no_bias_as_hfs_score_and_an_older_one_with_a_bias_is_refused(tmp_path):
    assert write_classifier(tmp_path / "new", "llama").classifier.bias is None  # follows the bias-free body
    write_classifier(tmp_path / "ckpt", "llama", bias=0.25, head_bias=True)
    result = run("export-hf", tmp_path / "ckpt", "--out", tmp_path / "hf")
    assert result.exit_code == 2 and len(result.stderr.strip().splitlines()) == 1, result.output
    assert "classifier.bias is not zero (largest |value| 0.25)" in result.stderr and "score has no bias" in result.stderr
    assert not (tmp_path / "hf").exists()


def test_a_multi_label_classifier_is_refused_on_import(tmp_path):
    write_classifier(tmp_path / "ckpt", "bert")
    assert run("export-hf", tmp_path / "ckpt", "--out", tmp_path / "hf").exit_code == 0
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    (tmp_path / "hf" / "config.json").write_text(json.dumps({**config, "problem_type": "multi_label_classification"}))
    result = run("import-hf", tmp_path / "hf", "--out", tmp_path / "back")
    assert result.exit_code == 2 and len(result.stderr.strip().splitlines()) == 1, result.output
    assert "problem_type='multi_label_classification' has no tfkit equivalent" in result.stderr
    assert not (tmp_path / "back").exists()


@pytest.fixture(scope="module")
def bpe(tmp_path_factory) -> Path:
    from tfkit.tokenization.train import TokenizerSpec, train_tokenizer

    out = tmp_path_factory.mktemp("tok") / "tokenizer"
    texts = [f"the {word} sat on the mat {n} times" for n in range(40) for word in ("cat", "dog", "bird")]
    train_tokenizer(TokenizerSpec(kind="bpe", vocab_size=300, min_frequency=1), texts, out, show_progress=False)
    return out


def test_gpt_rows_as_finetuning_pads_them_pool_the_same_token_in_transformers(tmp_path, bpe):
    """With the checkpoint's own tokenizer, config.json's pad_token_id is the tokenizer's, and rows laid out
    and padded as `tfkit finetune` does (EOS text EOS, then padding) give HF's logits; the import predicts."""
    from tfkit.tokenization.labelled import Examples
    from tfkit.tokenization.task_batches import task_dataset
    from tfkit.tokenization.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(bpe)
    torch.manual_seed(0)
    head = HeadConfig(labels=LABELS, dropout=0.0)
    ours = SequenceClassifier(build_model(tiny_cfg("gpt", vocab_size=300, activation="gelu")), head).eval()
    save_model(ours, tmp_path / "ckpt")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (tmp_path / "ckpt" / name).write_bytes((bpe / name).read_bytes())
    texts = ["the cat sat", "the dog sat on the mat 3 times", "a bird"]
    data = task_dataset(Examples("rows", texts, None, [0, 1, 2]), tokenizer, "gpt", max_len=16, seed=0,
                        regression=False)
    batch = next(data.every_example(3))
    assert batch["attention_mask"].sum(1).tolist() != [16, 16, 16]  # padded rows, or the check is empty

    assert run("export-hf", tmp_path / "ckpt", "--out", tmp_path / "hf").exit_code == 0
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "hf").eval()
    assert hf.config.pad_token_id == tokenizer.pad_id != tokenizer.separator_id
    with torch.no_grad():
        expected = hf(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"].long()).logits
        torch.testing.assert_close(ours(batch["input_ids"], attention_mask=batch["attention_mask"]), expected,
                                   atol=1e-5, rtol=1e-4)

    assert run("import-hf", tmp_path / "hf", "--out", tmp_path / "back").exit_code == 0
    (tmp_path / "rows.csv").write_text("text\n" + "\n".join(texts) + "\n")
    result = run("predict", tmp_path / "back", "--data", tmp_path / "rows.csv", "--out", tmp_path / "labels.csv")
    assert result.exit_code == 0, result.output
    predicted = (tmp_path / "labels.csv").read_text().splitlines()[1:]
    assert [row.split(",")[1] for row in predicted] == [LABELS[i] for i in expected.argmax(-1).tolist()]
    (tmp_path / "labelled.csv").write_text("text,label\n" + "\n".join(f"{t},{n}" for t, n in zip(texts, LABELS)))
    result = run("eval", tmp_path / "back", "--data", tmp_path / "labelled.csv", "--json", tmp_path / "scores.json")
    assert result.exit_code == 0, result.output
    hits = (expected.argmax(-1) == torch.arange(3)).double().mean().item()  # row k is labelled LABELS[k]
    assert json.loads((tmp_path / "scores.json").read_text())[0]["accuracy"] == pytest.approx(hits)


def test_a_tokenizer_that_pads_with_its_eos_is_refused_for_a_decoder(tmp_path, bpe):
    """GPT rows end with EOS: were EOS the pad id too, HF would pool the token before it."""
    write_classifier(tmp_path / "ckpt", "gpt2", vocab_size=300)
    config = json.loads((bpe / "tokenizer_config.json").read_text())
    (tmp_path / "ckpt" / "tokenizer.json").write_bytes((bpe / "tokenizer.json").read_bytes())
    (tmp_path / "ckpt" / "tokenizer_config.json").write_text(json.dumps({**config, "pad_token": config["eos_token"]}))
    result = run("export-hf", tmp_path / "ckpt", "--out", tmp_path / "hf")
    assert result.exit_code == 2 and len(result.stderr.strip().splitlines()) == 1, result.output
    assert "the tokenizer pads with id" in result.stderr and "the id that ends every row" in result.stderr
    assert not (tmp_path / "hf").exists()


def test_export_force_replaces_an_earlier_classifier_export(tmp_path):
    write_classifier(tmp_path / "ckpt", "bert")
    assert run("export-hf", tmp_path / "ckpt", "--out", tmp_path / "hf").exit_code == 0
    result = run("export-hf", tmp_path / "ckpt", "--out", tmp_path / "hf", "--force")
    assert result.exit_code == 0, result.output


def test_whether_a_classifier_can_be_exported_is_known_before_it_is_trained():
    """`export_problem` (said at the start of a fine-tune) agrees with what export-hf refuses after it."""
    from tfkit.checkpoints.hf_classifier import export_problem

    bert = tiny_cfg("bert", norm_placement="post")
    assert export_problem(bert, HeadConfig(labels=("a", "b"), pooling="cls")) is None
    assert export_problem(tiny_cfg("gpt"), HeadConfig(labels=("a", "b"))) is None  # gpt's own: its last token
    assert "fine-tune with task.pooling: cls to export" in export_problem(bert, HeadConfig(labels=("a", "b"),
                                                                                            pooling="mean"))
    assert export_problem(tiny_cfg("gpt", positions="alibi"), HeadConfig(labels=("a", "b"))) is not None
