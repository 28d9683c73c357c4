"""Chat fine-tuning data: the template's ids and loss mask token by token, HF's `apply_chat_template` giving
the same ids, packed rows that keep every conversation to itself, the embeddings grown with mean rows, and
bad conversations refused with one line naming the file, line and field."""

import gzip
import json
import math

import numpy as np
import pytest
import torch

from tfkit.errors import DataError
from tfkit.models import ModelConfig, build_model
from tfkit.models.resize import grow_vocab
from tfkit.tokenization.chat import CHAT_TEMPLATE, encode_chat, grow_tokenizer, read_conversations
from tfkit.tokenization.sft_batches import SftDataset
from tfkit.tokenization.train import TokenizerSpec, load_tokenizer, train_tokenizer

TEXT = "reverse the word and answer briefly. a b c d e f g h. " * 40


@pytest.fixture(scope="module")
def chat_tokenizer(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tok")
    train_tokenizer(TokenizerSpec(kind="bpe", vocab_size=300), [TEXT], folder, show_progress=False)
    plain = load_tokenizer(folder)
    grown = grow_tokenizer(plain)
    grown.save(folder)
    return load_tokenizer(folder), plain.vocab_size


def test_chat_tokens_are_added_once_at_the_end_of_the_vocabulary(chat_tokenizer):
    tok, before = chat_tokenizer
    assert tok.vocab_size == before + 4
    assert [tok.token_to_id(t) for t in ("<|system|>", "<|user|>", "<|assistant|>", "<|end|>")] == \
        list(range(before, before + 4))
    assert tok.chat_template == CHAT_TEMPLATE
    assert grow_tokenizer(tok) is tok  # a chat model fine-tuned again keeps its ids
    assert set(tok.special_ids) >= set(range(before, before + 4))


def test_the_loss_is_on_the_assistants_tokens_and_its_end_of_turn_only(chat_tokenizer):
    tok, _ = chat_tokenizer
    S, U, A, E = (tok.token_to_id(t) for t in ("<|system|>", "<|user|>", "<|assistant|>", "<|end|>"))
    sys_ids, user_ids, answer_ids = tok.encode("be brief"), tok.encode("reverse a b"), tok.encode("b a")
    ids, trained = encode_chat(tok, [("system", "be brief"), ("user", "reverse a b"), ("assistant", "b a")])
    assert ids == [S, *sys_ids, E, U, *user_ids, E, A, *answer_ids, E]
    assert trained == [False] * (len(sys_ids) + len(user_ids) + 5) + [True] * (len(answer_ids) + 1)
    prompt, mask = encode_chat(tok, [("user", "reverse a b")], generation_prompt=True)
    assert prompt == [U, *user_ids, E, A] and not any(mask)


def test_apply_chat_template_on_the_saved_tokenizer_gives_the_same_ids(chat_tokenizer):
    transformers = pytest.importorskip("transformers")
    tok, _ = chat_tokenizer
    hf = transformers.PreTrainedTokenizerFast.from_pretrained(str(tok.path.parent))
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "reverse  a b\nc"},
                {"role": "assistant", "content": " c b a!"}]
    turns = [(m["role"], m["content"]) for m in messages]
    for prompt in (False, True):
        shown = messages[:2] if prompt else messages
        theirs = hf.apply_chat_template(shown, tokenize=True, add_generation_prompt=prompt)
        theirs = theirs["input_ids"] if isinstance(theirs, dict) or hasattr(theirs, "keys") else theirs
        assert theirs == encode_chat(tok, turns[:2] if prompt else turns, generation_prompt=prompt)[0]


def _examples(tok, n: int):
    return [encode_chat(tok, [("user", f"reverse {'a b c'[: 1 + 2 * (k % 3)]}"), ("assistant", "c b a")])
            for k in range(n)]


def test_packed_rows_keep_each_conversation_to_itself_and_label_only_answers(chat_tokenizer):
    tok, _ = chat_tokenizer
    examples = _examples(tok, 40)
    data = SftDataset(examples, seq_len=32, seed=3, pad_id=tok.pad_id)
    batch = data.batch(0, 4)
    ids, labels, docs, pos = batch["input_ids"], batch["labels"], batch["doc_ids"], batch["position_ids"]
    assert ids.shape == labels.shape == docs.shape == pos.shape == (4, 32)
    for r in range(4):
        for d in docs[r].unique().tolist():
            span = (docs[r] == d).nonzero().flatten()
            assert span.tolist() == list(range(span[0], span[-1] + 1))  # one contiguous run per document
            assert pos[r, span].tolist() == list(range(len(span)))  # positions restart in each
            row_ids = ids[r, span].tolist()
            if row_ids[0] == tok.pad_id:  # the padding after the last conversation: nothing to learn
                assert (labels[r, span] == -100).all()
                continue
            match = next((i, t) for i, t in examples if i[:-1] == row_ids)  # a whole conversation
            expected = [nxt if keep else -100 for nxt, keep in zip(match[0][1:], match[1][1:])]
            assert labels[r, span].tolist() == expected
    assert torch.equal(data.batch(5, 4)["input_ids"], SftDataset(examples, 32, 3, tok.pad_id).batch(5, 4)["input_ids"])


def test_a_conversation_longer_than_a_row_is_cut_and_counted(chat_tokenizer):
    tok, _ = chat_tokenizer
    long = encode_chat(tok, [("user", "a b " * 30), ("assistant", "b a")])
    data = SftDataset([long, *_examples(tok, 3)], seq_len=16, seed=0, pad_id=tok.pad_id)
    assert data.cut == 1 and data.rows.shape[2] == 16


def test_grown_embeddings_keep_old_rows_and_start_new_ones_at_their_mean():
    model = build_model(ModelConfig(arch="gpt", vocab_size=50, d_model=16, n_layers=1, n_heads=2, max_seq_len=16))
    state = grow_vocab(model.state_dict(), 54)
    grown = build_model(ModelConfig(arch="gpt", vocab_size=54, d_model=16, n_layers=1, n_heads=2, max_seq_len=16))
    grown.load_state_dict(state)
    old = model.embed.tok.weight
    torch.testing.assert_close(grown.embed.tok.weight[:50], old)
    torch.testing.assert_close(grown.embed.tok.weight[50:], old.mean(0).expand(4, -1))
    assert grown.lm_head.weight.data_ptr() == grown.embed.tok.weight.data_ptr()  # still tied
    ids = torch.tensor([[1, 2, 3]])
    torch.testing.assert_close(grown(ids)[..., :50], model(ids))  # the old tokens' logits are unchanged


def _write_jsonl(path, records, compress=False):
    text = "".join(json.dumps(r) + "\n" for r in records)
    if compress:
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)
    return path


def test_both_layouts_and_compressed_files_are_read(tmp_path):
    pair = {"prompt": "hi", "response": "hello"}
    chat = {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "hi"},
                         {"role": "assistant", "content": "hello"}]}
    found = list(read_conversations(_write_jsonl(tmp_path / "c.jsonl.gz", [pair, chat], compress=True)))
    assert [turns for _, turns in found] == [[("user", "hi"), ("assistant", "hello")],
                                             [("system", "s"), ("user", "hi"), ("assistant", "hello")]]
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa
    pq.write_table(pa.Table.from_pylist([chat]), tmp_path / "c.parquet")
    assert [turns for _, turns in read_conversations(tmp_path / "c.parquet")] == [found[1][1]]


@pytest.mark.parametrize("record, message", [
    ({"messages": [{"role": "robot", "content": "x"}, {"role": "assistant", "content": "y"}]},
     ":2: field messages[0].role: got 'robot', expected one of system, user, assistant"),
    ({"messages": [{"role": "user", "content": "x"}]}, ":2: field messages: no assistant turn"),
    ({"prompt": "x", "response": 3}, ":2: field response: expected text, got int"),
    ({"text": "x"}, ":2: expected fields prompt and response, or messages; found text"),
])
def test_a_bad_conversation_is_one_line_naming_file_line_and_field(tmp_path, record, message):
    path = _write_jsonl(tmp_path / "bad.jsonl", [{"prompt": "a", "response": "b"}, record])
    with pytest.raises(DataError) as info:
        list(read_conversations(path))
    assert str(info.value).startswith(str(path)) and message in str(info.value)
    assert "\n" not in str(info.value)


def test_packing_is_a_pure_function_of_the_seed(chat_tokenizer):
    tok, _ = chat_tokenizer
    a = SftDataset(_examples(tok, 30), 32, 7, tok.pad_id).rows
    b = SftDataset(_examples(tok, 30), 32, 7, tok.pad_id).rows
    assert np.array_equal(a, b)


def test_a_packed_row_gives_each_conversation_the_logits_it_has_alone(chat_tokenizer):
    tok, _ = chat_tokenizer
    examples = _examples(tok, 12)
    batch = SftDataset(examples, seq_len=32, seed=1, pad_id=tok.pad_id).batch(0, 2)
    torch.manual_seed(0)
    model = build_model(ModelConfig(arch="gpt", vocab_size=tok.vocab_size, d_model=32, n_layers=2, n_heads=4,
                                    max_seq_len=32)).eval()
    with torch.no_grad():
        packed = model(batch["input_ids"], doc_ids=batch["doc_ids"], position_ids=batch["position_ids"])  # (B, T, V)
        for r in range(2):
            for d in batch["doc_ids"][r].unique().tolist():
                span = (batch["doc_ids"][r] == d).nonzero().flatten()
                alone = model(batch["input_ids"][r, span][None])  # (1, L, V): at positions 0..L-1, nothing else
                torch.testing.assert_close(packed[r, span], alone[0], atol=1e-5, rtol=1e-5)


def test_a_validation_set_smaller_than_a_batch_is_scored_not_refused(chat_tokenizer):
    """A few conversations pack into fewer rows than eval.batch_size: validation scores them in one short batch
    (it used to stop the run: "the validation data gives no batch of 16")."""
    from tfkit.trainer.distributed import DistInfo
    from tfkit.trainer.objectives import LossModule
    from tfkit.trainer.recipe import ObjectiveSection
    from tfkit.trainer.validation import validate

    tok, _ = chat_tokenizer
    data = SftDataset(_examples(tok, 4), seq_len=32, seed=0, pad_id=tok.pad_id)
    assert 0 < data.num_examples < 16
    torch.manual_seed(0)
    model = build_model(ModelConfig(vocab_size=tok.vocab_size, d_model=16, n_layers=1, n_heads=2, max_seq_len=32))
    result = validate(LossModule(model, ObjectiveSection(name="clm")), data, 20, 16, DistInfo(), "fp32")
    labels = torch.cat([b["labels"] for b in data.eval_batches(20, 16)])
    assert result.tokens == int((labels != -100).sum()) > 0 and math.isfinite(result.loss)
