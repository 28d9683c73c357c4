"""Task heads (models/heads.py): shapes for every family and pooling, logits that do not depend on padding,
and the same logits as HuggingFace's `BertForSequenceClassification` and `GPT2ForSequenceClassification`
with copied weights (an independent reference for the pooler, the last-token pick and the classifier)."""

import json

import pytest
import torch

from tfkit.checkpoints.hf_names import RULES, split_to_tfkit
from tfkit.errors import ConfigError
from tfkit.models import build_model
from tfkit.models.heads import HeadConfig, SequenceClassifier, head_loss, predictions

from helpers import tiny_cfg

LABELS = ("neg", "neutral", "pos")
CASES = [("bert", "cls"), ("bert", "mean"), ("gpt", "last"), ("gpt", "mean"), ("transformer", "mean")]


def classifier(arch, pooling=None, task="classification", **model):
    torch.manual_seed(0)
    labels = LABELS if task == "classification" else ()
    head = HeadConfig(task=task, labels=labels, pooling=pooling, dropout=0.1)
    return SequenceClassifier(build_model(tiny_cfg(arch, **model)), head).eval()


@pytest.mark.parametrize("arch, pooling", CASES)
@pytest.mark.parametrize("task, outputs", [("classification", 3), ("regression", 1)])
def test_logits_have_one_row_per_text(arch, pooling, task, outputs):
    model = classifier(arch, pooling, task)
    ids = torch.randint(0, 61, (4, 9))
    mask = torch.ones(4, 9, dtype=torch.bool)
    mask[1, 5:] = False
    logits = model(ids, attention_mask=mask)
    assert logits.shape == (4, outputs) and torch.isfinite(logits).all()
    assert predictions(logits, task).shape == (4,)


@pytest.mark.parametrize("arch, pooling", CASES)
@pytest.mark.parametrize("tie", [True, False], ids=["tied", "untied"])
def test_the_unused_parameters_are_those_autograd_never_reaches(arch, pooling, tie):
    """What the trainer freezes for DDP is what a forward and backward leave without a gradient (autograd
    as the oracle): the pretraining heads, the decoder side, an unpooled pooler; never a tied embedding."""
    model = classifier(arch, pooling, tie_embeddings=tie).train()
    ids = torch.randint(0, 61, (3, 9))
    model(ids, attention_mask=torch.ones(3, 9, dtype=torch.bool)).sum().backward()
    untouched = {name for name, p in model.named_parameters() if p.grad is None}
    unused = {id(p) for p in model.unused_parameters()}
    assert {name for name, p in model.named_parameters() if id(p) in unused} == untouched
    assert bool(untouched) != (arch == "gpt" and tie)  # a tied GPT's LM head is its embedding: all used


@pytest.mark.parametrize("arch, pooling", CASES)
@pytest.mark.parametrize("positions", ["learned", "rope"])
def test_a_texts_logits_do_not_depend_on_the_padding_it_is_batched_with(arch, pooling, positions):
    model = classifier(arch, pooling, positions=positions)
    short = torch.randint(0, 61, (1, 5))
    alone = model(short)
    padded = torch.cat([short, torch.randint(0, 61, (1, 7))], dim=1)  # whatever ids stand in the padding
    batch = torch.cat([padded, torch.randint(0, 61, (1, 12))])
    mask = torch.ones(2, 12, dtype=torch.bool)
    mask[0, 5:] = False
    torch.testing.assert_close(model(batch, attention_mask=mask)[:1], alone, atol=1e-5, rtol=1e-4)


def test_padding_is_read_from_the_mask_not_ignored():
    """The check above could pass with a pooling that ignores the mask only if padding changed nothing."""
    model = classifier("bert", "mean")
    ids = torch.randint(0, 61, (1, 12))
    full = torch.ones(1, 12, dtype=torch.bool)
    assert not torch.allclose(model(ids, attention_mask=full), model(ids[:, :5]))


transformers = pytest.importorskip("transformers")
V, D, L, H, T_MAX = 61, 32, 2, 4, 32


@pytest.mark.parametrize("num_labels, task", [(3, "classification"), (1, "regression")])
def test_bert_head_equals_huggingface_bert_for_sequence_classification(num_labels, task):
    torch.manual_seed(1)
    hf = transformers.BertForSequenceClassification(transformers.BertConfig(
        vocab_size=V, hidden_size=D, num_hidden_layers=L, num_attention_heads=H, intermediate_size=4 * D,
        max_position_embeddings=T_MAX, num_labels=num_labels)).eval()
    ours = SequenceClassifier(build_model(tiny_cfg("bert", norm_placement="post", norm_eps=1e-12)),
                              HeadConfig(task=task, labels=LABELS if task == "classification" else ())).eval()
    hf_state = hf.state_dict()
    state = {f"body.{name}": tensor for rule in RULES["bert"](ours.config) if rule.hf in hf_state
             for name, tensor in split_to_tfkit(rule, hf_state[rule.hf]).items()}
    state.update({"classifier.weight": hf_state["classifier.weight"], "classifier.bias": hf_state["classifier.bias"]})
    missing, unexpected = ours.load_state_dict(state, strict=False)
    assert all(name.startswith("body.mlm.") for name in missing) and not unexpected  # the MLM head is not used
    ids, segments = torch.randint(0, V, (3, 10)), torch.tensor([[0] * 6 + [1] * 4] * 3)
    mask = torch.ones(3, 10, dtype=torch.bool)
    mask[1, 7:] = False
    expected = hf(input_ids=ids, attention_mask=mask.long(), token_type_ids=segments).logits
    torch.testing.assert_close(ours(ids, attention_mask=mask, token_type_ids=segments), expected,
                               atol=1e-5, rtol=1e-4)


def test_gpt_last_token_head_equals_huggingface_gpt2_for_sequence_classification():
    torch.manual_seed(2)
    pad = V - 1
    hf = transformers.GPT2ForSequenceClassification(transformers.GPT2Config(
        vocab_size=V, n_positions=T_MAX, n_embd=D, n_layer=L, n_head=H, activation_function="gelu",
        num_labels=3, pad_token_id=pad)).eval()
    ours = SequenceClassifier(build_model(tiny_cfg("gpt", activation="gelu")), HeadConfig(labels=LABELS)).eval()
    hf_state = hf.state_dict()
    state = {f"body.{name}": tensor for rule in RULES["gpt2"](ours.config) if rule.hf in hf_state
             for name, tensor in split_to_tfkit(rule, hf_state[rule.hf]).items()}
    state.update({"classifier.weight": hf_state["score.weight"], "classifier.bias": torch.zeros(3)})  # HF: no bias
    missing, unexpected = ours.load_state_dict(state, strict=False)
    assert missing == ["body.lm_head.weight"] and not unexpected  # tied to the embedding, which was copied
    ids = torch.randint(0, V - 1, (3, 10))
    mask = torch.ones(3, 10, dtype=torch.bool)
    mask[0, 4:], mask[2, 8:] = False, False
    ids[~mask] = pad  # HF finds the last real token from the pad id, tfkit from the mask
    expected = hf(input_ids=ids, attention_mask=mask.long()).logits
    torch.testing.assert_close(ours(ids, attention_mask=mask), expected, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("arch, head, message", [
    ("gpt", HeadConfig(labels=LABELS, pooling="cls"), "head.pooling: 'cls' is not a pooling of gpt models, "
                                                      "which pool last or mean"),
    ("transformer", HeadConfig(labels=LABELS, pooling="last"), "which pool mean"),
    ("bert", HeadConfig(labels=("pos",)), "head.labels: got ['pos'], expected at least two distinct class names"),
    ("bert", HeadConfig(task="regression", labels=LABELS), "a regression head has no classes"),
    ("bert", HeadConfig(task="ranking"), "head.task: got 'ranking'"),
    ("bert", HeadConfig(labels=LABELS, dropout=1.0), "head.dropout: got 1.0"),
])
def test_a_head_the_family_cannot_have_is_refused_naming_the_key(arch, head, message):
    with pytest.raises(ConfigError) as excinfo:
        SequenceClassifier(build_model(tiny_cfg(arch)), head)
    assert str(excinfo.value).startswith("head.") and message in str(excinfo.value)


def test_segments_are_refused_for_families_without_them():
    with pytest.raises(ValueError, match="a gpt model has none"):
        classifier("gpt")(torch.zeros(1, 3, dtype=torch.long), token_type_ids=torch.zeros(1, 3, dtype=torch.long))


def test_labels_round_trip_through_config_json_as_id2label_and_label2id():
    head = HeadConfig(labels=LABELS, pooling="mean", dropout=0.2)
    saved = json.loads(json.dumps(head.to_dict()))
    assert saved["id2label"] == {"0": "neg", "1": "neutral", "2": "pos"} and saved["label2id"]["pos"] == 2
    assert HeadConfig.from_dict(saved) == head
    for damaged, message in [({"id2label": {"0": "a", "2": "b"}}, "head.id2label is {'0': 'a', '2': 'b'}, expected"),
                             ({"id2label": ["a", "b"]}, "head.id2label is ['a', 'b'], expected class names"),
                             ({"id2label": {"0": "a"}, "dropout": "high"}, "head.dropout is 'high', expected"),
                             ({"id2label": {"0": "a"}, "bias": "yes"}, "head.bias is 'yes', expected true")]:
        with pytest.raises(ConfigError) as excinfo:
            HeadConfig.from_dict(damaged, source="ckpt/config.json")
        assert str(excinfo.value).startswith(f"ckpt/config.json: {message}")


def test_the_classifier_bias_follows_the_body_and_an_older_head_keeps_its_own():
    """A bias-free body (a Llama's) gets a bias-free classifier, as HF's `score`; config.json records the
    choice, and a head saved before the key existed had a bias, which its weights hold."""
    llama = SequenceClassifier(build_model(tiny_cfg("gpt", bias=False, norm="rmsnorm")), HeadConfig(labels=LABELS))
    assert llama.classifier.bias is None and llama.head_config.to_dict()["bias"] is False
    assert classifier("bert").classifier.bias is not None and classifier("bert").head_config.bias is True
    older = {k: v for k, v in llama.head_config.to_dict().items() if k != "bias"}
    kept = SequenceClassifier(build_model(tiny_cfg("gpt", bias=False, norm="rmsnorm")), HeadConfig.from_dict(older))
    assert kept.classifier.bias is not None


def test_regression_loss_compares_each_output_with_its_own_target():
    logits, targets = torch.tensor([[1.0], [2.0], [4.0]]), torch.tensor([1.0, 2.0, 3.0])
    assert head_loss(logits, targets, "regression").item() == pytest.approx(1 / 3)  # not the (B, B) broadcast
    ce = head_loss(torch.tensor([[2.0, 0.0], [0.0, 2.0]]), torch.tensor([0, 1]), "classification")
    assert ce.item() == pytest.approx(torch.nn.functional.cross_entropy(torch.tensor([[2.0, 0.0]]),
                                                                         torch.tensor([0])).item())
