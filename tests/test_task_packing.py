"""Packed fine-tuning batches (tokenization/task_packing.py): every example placed once in rows of max_len,
positions restarted and attention kept inside each, and a classifier reading packed rows computes what it
computes on the padded ones: the same logits for every family, pooling and layout, and the same gradients
of a training step (the padded layout is the oracle)."""

import pytest
import torch

from tfkit.models import ModelConfig, build_model
from tfkit.models.heads import HeadConfig, SequenceClassifier, classifier_inputs, head_loss
from tfkit.tokenization.labelled import Examples
from tfkit.tokenization.task_batches import task_dataset
from tfkit.tokenization.task_packing import first_fit, packed_batch
from tfkit.tokenization.train import TokenizerSpec, load_tokenizer, train_tokenizer
from tfkit.trainer.objectives import task_loss

TEXTS = ["the event loop runs callbacks", "a message has headers and a payload " * 3, "json",
         "handlers format log records", "a request to a server and its response " * 2, "sockets", "paths and files",
         "a queue of tasks waits for workers that take them one by one"]
PAIRS = ["short", "the second text of a pair " * 2, "x", "y z", "and more words here", "a", "b c d", "e"]


@pytest.fixture(scope="module")
def tokenizers(english_text, tmp_path_factory):
    root = tmp_path_factory.mktemp("tokenizers")
    for kind in ("wordpiece", "bpe"):
        train_tokenizer(TokenizerSpec(kind=kind, vocab_size=400), [english_text[:60_000]], root / kind,
                        show_progress=False)
    return {kind: load_tokenizer(root / kind) for kind in ("wordpiece", "bpe")}


def test_first_fit_places_every_example_once_in_rows_that_hold_it():
    lengths = [5, 9, 3, 7, 2, 8, 4]
    places = first_fit(lengths, 10)
    taken: dict[int, set[int]] = {}
    for (row, at), n in zip(places, lengths):
        span = set(range(at, at + n))
        assert at + n <= 10 and not span & taken.get(row, set())
        taken.setdefault(row, set()).update(span)
    assert sum(lengths) == sum(len(s) for s in taken.values())
    assert len(taken) == 4 and places[1] == (0, 0) and places[5] == (1, 0)  # longest first: 9, then 8
    assert first_fit(lengths, 10) == places  # a pure function of the lengths
    assert first_fit([3, 3], 10) == [(0, 0), (0, 3)]  # equal lengths keep batch order
    with pytest.raises(ValueError, match="1..10"):
        first_fit([4, 11], 10)


def test_a_packed_batch_holds_each_example_with_its_positions_and_segments():
    rows = [[2, 10, 11, 3], [2, 12, 3, 13, 3], [2, 14, 3]]
    segments = [[0, 0, 0, 0], [0, 0, 0, 1, 1], [0, 0, 0]]
    batch = packed_batch(rows, segments, row_len=8, pad_id=0)
    assert batch["input_ids"].shape == (2, 8) and batch["starts"].tolist() == [8, 0, 5]
    assert batch["lengths"].tolist() == [4, 5, 3]
    flat = {k: batch[k].flatten() for k in ("input_ids", "token_type_ids", "position_ids", "example_ids")}
    for k, (start, n) in enumerate(zip(batch["starts"].tolist(), batch["lengths"].tolist())):
        span = slice(start, start + n)
        assert flat["input_ids"][span].tolist() == rows[k] and flat["token_type_ids"][span].tolist() == segments[k]
        assert flat["position_ids"][span].tolist() == list(range(n)) and (flat["example_ids"][span] == k).all()
    padding = flat["example_ids"] == 3  # E = 3: the row ends
    assert padding.sum() == 16 - 12 and (flat["input_ids"][padding] == 0).all()


def classifier(arch: str, vocab: int, pooling: str, norm: str = "layernorm") -> SequenceClassifier:
    torch.manual_seed(0)
    cfg = ModelConfig(arch=arch, vocab_size=vocab, d_model=32, n_layers=2, n_heads=4, max_seq_len=48, norm=norm,
                      dropout=0.0, attn_dropout=0.0)
    return SequenceClassifier(build_model(cfg), HeadConfig(labels=("a", "b", "c"), pooling=pooling, dropout=0.0))


CASES = [("bert", "wordpiece", "cls", True), ("bert", "wordpiece", "mean", True), ("bert", "wordpiece", "cls", False),
         ("gpt", "bpe", "last", False), ("gpt", "bpe", "mean", False)]


@pytest.mark.parametrize("arch, kind, pooling, pairs", CASES)
def test_packed_rows_give_the_padded_rows_logits_and_gradients(tokenizers, arch, kind, pooling, pairs):
    """The same 8 examples as 8 padded rows and as fewer packed ones: equal logits, loss and gradients."""
    tok = tokenizers[kind]
    examples = Examples("test", TEXTS, PAIRS if pairs else None, [0, 1, 2, 0, 1, 2, 0, 1])
    padded, packed = (task_dataset(examples, tok, arch, max_len=48, seed=3, regression=False, packed=flag)
                      for flag in (False, True))
    rows, grads = [], []
    for data in (padded, packed):
        batch = data.batch(0, batch_size=8)
        model = classifier(arch, tok.vocab_size, pooling)
        model.eval()  # dropout is 0; eval for the logits, then the gradient of a training loss
        with torch.no_grad():
            rows.append(model(**classifier_inputs(batch)))  # (E, N)
        model.train()
        out = task_loss(model, batch, regression=False)
        out.loss.backward()
        grads.append({name: p.grad for name, p in model.named_parameters() if p.grad is not None})
    assert packed.batch(0, 8)["input_ids"].shape[0] < 8 <= padded.batch(0, 8)["input_ids"].shape[0]
    torch.testing.assert_close(rows[1], rows[0], atol=1e-5, rtol=1e-5)
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], atol=1e-5, rtol=1e-4, msg=name)


def test_packed_batchnorm_statistics_skip_the_row_ends(tokenizers):
    """BatchNorm normalises over the batch's real positions, so the padding at the ends of packed rows must
    be left out as padded rows' is: the training-mode logits agree."""
    tok = tokenizers["wordpiece"]
    examples = Examples("test", TEXTS, None, [0, 1, 2, 0, 1, 2, 0, 1])
    out = []
    for flag in (False, True):
        batch = task_dataset(examples, tok, "bert", max_len=48, seed=0, regression=False, packed=flag).batch(0, 8)
        out.append(classifier("bert", tok.vocab_size, "mean", norm="batchnorm").train()(**classifier_inputs(batch)))
    torch.testing.assert_close(out[1], out[0], atol=1e-5, rtol=1e-5)


def test_every_example_packed_scores_every_example_in_order(tokenizers):
    tok = tokenizers["wordpiece"]
    examples = Examples("test", TEXTS * 2, None, [0, 1, 2, 0, 1, 2, 0, 1] * 2)
    data = task_dataset(examples, tok, "bert", max_len=48, seed=0, regression=False, packed=True)
    model = classifier("bert", tok.vocab_size, "cls").eval()
    with torch.no_grad():
        whole = torch.cat([model(**classifier_inputs(b)) for b in data.every_example(5)])  # (16, N)
        one = torch.cat([model(**classifier_inputs(b)) for b in data.every_example(1)])  # one example a batch
    torch.testing.assert_close(whole, one, atol=1e-5, rtol=1e-5)
    assert torch.equal(torch.cat([b["labels"] for b in data.every_example(5)]), torch.tensor(examples.targets))


def test_the_encoder_decoder_stays_padded_and_refuses_packed_arguments(tokenizers):
    tok = tokenizers["bpe"]
    examples = Examples("test", TEXTS, None, [0, 1, 2, 0, 1, 2, 0, 1])
    batch = task_dataset(examples, tok, "transformer", max_len=48, seed=0, regression=False, packed=True).batch(0, 4)
    assert "example_ids" not in batch and batch["input_ids"].shape == (4, 48)
    cfg = ModelConfig(arch="transformer", vocab_size=tok.vocab_size, d_model=32, n_layers=1, n_heads=4, max_seq_len=48)
    model = SequenceClassifier(build_model(cfg), HeadConfig(labels=("a", "b", "c")))
    ids = batch["input_ids"]
    with pytest.raises(ValueError, match="packed rows need"):
        model(ids, example_ids=torch.zeros_like(ids), position_ids=torch.zeros_like(ids),
              starts=torch.zeros(4, dtype=torch.long), lengths=torch.ones(4, dtype=torch.long))
    bert = classifier("bert", tok.vocab_size, "cls")
    with pytest.raises(ValueError, match="together"):
        bert(ids, example_ids=torch.zeros_like(ids))
    assert head_loss(model(**classifier_inputs(batch)), batch["labels"], "classification").isfinite()
