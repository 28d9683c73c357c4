"""Datasets: batch i is a pure function of (seed, i); CLM packing, MLM masking, seq2seq pairs/denoising."""

import json

import numpy as np
import pytest
import torch

from tfkit.errors import ConfigError, DataError
from tfkit.tokenization.batches import ClmDataset, MlmDataset, Seq2SeqDataset, read_pairs
from tfkit.tokenization.shards import prepare_tokens
from tfkit.tokenization.train import TokenizerSpec, load_tokenizer, train_tokenizer


@pytest.fixture(scope="module")
def setup(english_text, tmp_path_factory):
    """bpe and wordpiece tokenizers and shards of a JSONL corpus of paragraphs (one document each)."""
    text = english_text[:200_000]
    root = tmp_path_factory.mktemp("data")
    docs = [d for d in text.split("\n\n") if d.strip()]
    (root / "paragraphs.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    out = {"docs": docs}
    for kind in ("bpe", "wordpiece"):
        train_tokenizer(TokenizerSpec(kind=kind, vocab_size=600), [text], root / kind, show_progress=False)
        tok = load_tokenizer(root / kind)
        out[kind] = (tok, prepare_tokens(str(root / "paragraphs.jsonl"), tok, root / "cache", show_progress=False))
    return out


def test_clm_blocks_are_shifted_packed_slices_with_eos_between_documents(setup):
    tok, shards = setup["bpe"]
    ds = ClmDataset.from_shards(shards, seq_len=64, seed=0)
    b = ds.batch(3, 8)
    assert b["input_ids"].shape == b["labels"].shape == (8, 64) and b["input_ids"].dtype == torch.int64
    assert torch.equal(b["input_ids"][:, 1:], b["labels"][:, :-1])  # labels = inputs shifted by one
    stream = torch.from_numpy(np.asarray(shards.tokens, dtype=np.int64))
    for row in range(8):  # every row is a real slice of the stream
        starts = [s for s in range(0, len(stream) - 64, 64) if torch.equal(stream[s : s + 64], b["input_ids"][row])]
        assert starts and torch.equal(stream[starts[0] + 1 : starts[0] + 65], b["labels"][row])
    first = ClmDataset(shards.tokens, 256, 0, tok.eos_id).eval_batches(1, 1).__next__()["input_ids"][0]
    eos = (first == tok.eos_id).nonzero().flatten().tolist()
    assert eos and eos[0] == len(tok.encode(setup["docs"][0]))  # EOS right after the first document


def test_clm_epoch_visits_each_block_once_and_is_reproducible(setup):
    _, shards = setup["bpe"]
    ds = ClmDataset.from_shards(shards, seq_len=64, seed=1)
    n = ds.num_batches_per_epoch(16)
    assert n == ds.num_examples // 16
    seen = torch.cat([ds.batch(i, 16)["input_ids"] for i in range(n)])
    assert len({tuple(r.tolist()) for r in seen}) == n * 16  # no block twice within an epoch
    assert torch.equal(ds.batch(5, 16)["input_ids"], ClmDataset.from_shards(shards, 64, 1).batch(5, 16)["input_ids"])
    assert not torch.equal(ds.batch(n, 16)["input_ids"], ds.batch(0, 16)["input_ids"])  # next epoch reshuffles
    other_seed = ClmDataset.from_shards(shards, 64, 2)
    assert not torch.equal(ds.batch(5, 16)["input_ids"], other_seed.batch(5, 16)["input_ids"])


@pytest.mark.parametrize("kind", ["clm", "mlm", "seq2seq"])
def test_rank_slices_concatenate_to_the_global_batch(setup, kind):
    tok, shards = setup["wordpiece"]
    ds = {"clm": lambda: ClmDataset.from_shards(shards, 32, 0),
          "mlm": lambda: MlmDataset.from_shards(shards, tok, 32, 0),
          "seq2seq": lambda: Seq2SeqDataset.denoising(shards, tok, 0, max_src_len=32, max_tgt_len=32)}[kind]()
    whole = ds.batch(7, 8)
    for world in (2, 4):
        parts = [ds.batch(7, 8, rank=r, world_size=world) for r in range(world)]
        for key, value in whole.items():
            assert torch.equal(torch.cat([p[key] for p in parts]), value), key
    with pytest.raises(ConfigError, match="batch_size: 8 is not divisible by the world size 3"):
        ds.batch(0, 8, rank=0, world_size=3)


def test_eval_batches_are_identical_every_call(setup):
    tok, shards = setup["wordpiece"]
    ds = MlmDataset.from_shards(shards, tok, 32, seed=0)
    a, b = list(ds.eval_batches(3, 4)), list(ds.eval_batches(3, 4))
    assert len(a) == 3 and all(torch.equal(x["labels"], y["labels"]) for x, y in zip(a, b))


def test_fewer_eval_batches_than_the_set_holds_are_spread_through_it(setup):
    """A validation stream runs in document order (a held-out sample, a user's file), so n batches of a larger set
    are taken evenly through it, not from its start: 2 batches of 2 of 20 blocks are blocks 0, 5, 10 and 15."""
    _, shards = setup["bpe"]
    clm = ClmDataset(shards.tokens[: 20 * 16 + 1], 16, 0, 0)
    assert clm.num_examples == 20
    rows = torch.cat([b["input_ids"] for b in clm.eval_batches(2, 2)])
    assert [r.tolist() for r in rows] == [shards.tokens[k * 16: (k + 1) * 16].tolist() for k in (0, 5, 10, 15)]
    two = [torch.cat([b["input_ids"] for b in clm.eval_batches(2, 2, rank=r, world_size=2)]) for r in range(2)]
    assert sorted(map(tuple, torch.cat(two).tolist())) == sorted(map(tuple, rows.tolist()))  # the same rows on 2 ranks


def test_the_examples_left_after_the_full_validation_batches_are_scored_in_a_short_one(setup):
    """10 examples at batch 4: batches of 4, 4 and 2 (the short one), the same rows on one or two ranks."""
    _, shards = setup["bpe"]
    clm = ClmDataset(shards.tokens[: 10 * 16 + 1], 16, 0, 0)
    assert clm.num_examples == 10
    one = list(clm.eval_batches(5, 4))
    assert [len(b["input_ids"]) for b in one] == [4, 4, 2]
    assert one[2]["input_ids"][1].tolist() == shards.tokens[9 * 16: 10 * 16].tolist()
    two = [list(clm.eval_batches(5, 4, rank=r, world_size=2)) for r in range(2)]
    for k in range(3):
        assert torch.equal(torch.cat([two[0][k]["input_ids"], two[1][k]["input_ids"]]), one[k]["input_ids"])
    assert [len(b["input_ids"]) for b in clm.eval_batches(2, 4)] == [4, 4]  # n batches asked: no more
    odd = ClmDataset(shards.tokens[: 3 * 16 + 1], 16, 0, 0)
    assert [len(b["input_ids"]) for b in odd.eval_batches(5, 4, rank=0, world_size=2)] == [1]  # 3 rows: 2 scored


def test_too_little_data_for_one_batch_is_a_data_error(setup):
    _, shards = setup["bpe"]
    ds = ClmDataset(shards.tokens[:100], 64, 0, 0)
    with pytest.raises(DataError, match="gives 1 blocks, fewer than one batch of 2"):
        ds.batch(0, 2)


def _batch_rows(ds, i: int, B: int) -> np.ndarray:
    """The example indices of global batch i (the epoch's permutation, sliced)."""
    per = ds.num_batches_per_epoch(B)
    return ds._permutation(i // per)[(i % per) * B : (i % per + 1) * B]


def test_mlm_masking_statistics_on_a_large_batch(setup):
    tok, shards = setup["wordpiece"]
    ds = MlmDataset.from_shards(shards, tok, 64, seed=0)
    i, B = 2, 512
    b = ds.batch(i, B)
    orig = ds.originals(_batch_rows(ds, i, B))
    sel = b["labels"] != -100
    special = torch.isin(orig, torch.tensor(tok.special_ids))
    assert not (sel & special).any() and torch.equal(b["input_ids"][special], orig[special])  # specials untouched
    assert torch.equal(b["labels"][sel], orig[sel]) and torch.equal(b["input_ids"][~sel], orig[~sel])
    assert abs(sel.sum().item() / (~special).sum().item() - 0.15) < 0.015
    assert sel.any(dim=1).all()  # at least one target per sequence
    masked = (b["input_ids"][sel] == tok.mask_id).float().mean().item()
    kept = (b["input_ids"][sel] == orig[sel]).float().mean().item()
    assert abs(masked - 0.8) < 0.03 and abs(kept - 0.1) < 0.03 and abs(1 - masked - kept - 0.1) < 0.03
    assert not torch.isin(b["input_ids"][sel], torch.tensor([0, 1, 2, 3])).any()  # random ids are never specials
    assert (b["token_type_ids"] == 0).all()


def test_mlm_rows_pack_documents_back_to_back_without_padding(setup):
    """Row k = [CLS] + the k-th slice of the stream + [SEP]; documents meet at their separator; no padding."""
    tok, shards = setup["wordpiece"]
    L = 40
    ds = MlmDataset.from_shards(shards, tok, L, seed=0)
    assert ds.num_examples == shards.num_tokens // (L - 2)
    b = ds.batch(3, 16)
    assert set(b) == {"input_ids", "labels", "token_type_ids", "mlm_positions", "mlm_labels"}  # no attention mask
    assert b["input_ids"].shape == (16, L) and not (b["input_ids"] == tok.pad_id).any()
    rows = _batch_rows(ds, 3, 16)
    restored = torch.where(b["labels"] != -100, b["labels"], b["input_ids"])  # the text before masking
    for row, k in zip(restored.tolist(), rows):
        body = np.asarray(shards.tokens[k * (L - 2) : (k + 1) * (L - 2)]).tolist()
        assert row == [tok.cls_id, *body, tok.sep_id]
    # Across the whole stream, rows hold every document in order, separated by [SEP].
    whole = ds.originals(np.arange(ds.num_examples))[:, 1:-1].flatten()  # (rows * (L-2),)
    assert whole.tolist() == np.asarray(shards.tokens[: len(whole)]).tolist()
    assert (whole == tok.sep_id).sum() >= ds.num_examples // 4  # many rows hold a document boundary
    assert torch.isin(whole, torch.tensor([tok.sep_id])).sum() == (shards.doc_starts[1:] <= len(whole)).sum()


def test_mlm_is_deterministic_per_seed_and_batch(setup):
    tok, shards = setup["wordpiece"]
    ds = MlmDataset.from_shards(shards, tok, 64, seed=0)
    again = MlmDataset.from_shards(shards, tok, 64, seed=0)
    assert all(torch.equal(ds.batch(4, 8)[k], again.batch(4, 8)[k]) for k in ds.batch(4, 8))
    assert not torch.equal(ds.batch(4, 8)["labels"], ds.batch(5, 8)["labels"])


def test_whole_word_masking_masks_all_pieces_of_a_word(setup):
    tok, shards = setup["wordpiece"]
    ds = MlmDataset.from_shards(shards, tok, 64, seed=0, whole_word=True)
    b = ds.batch(0, 64)
    sel = (b["labels"] != -100).tolist()
    words_checked = 0
    for row_sel, row_ids in zip(sel, torch.where(b["labels"] != -100, b["labels"], b["input_ids"]).tolist()):
        words, current = [], []
        for pos, tid in enumerate(row_ids):
            piece = tok.id_to_token(tid)
            if current and (not piece.startswith("##") or row_ids[pos - 1] in tok.special_ids):
                words.append(current)
                current = []
            current.append(pos)
        words.append(current)
        for w in words:
            assert len({row_sel[p] for p in w}) == 1, [(tok.id_to_token(row_ids[p]), row_sel[p]) for p in w]
            words_checked += len(w) > 1 and row_sel[w[0]]
    assert words_checked > 10
    maskable = ~torch.isin(torch.where(b["labels"] != -100, b["labels"], b["input_ids"]), torch.tensor(tok.special_ids))
    frac = (b["labels"] != -100).sum().item() / maskable.sum().item()
    assert 0.1 < frac < 0.2


@pytest.mark.parametrize("whole_word", [False, True])
@pytest.mark.parametrize("L, mask_prob", [(40, 0.15), (64, 0.15), (33, 0.3), (10, 0.15)])
def test_mlm_targets_come_as_a_fixed_number_of_positions(setup, whole_word, L, mask_prob):
    """mlm_positions / mlm_labels (B, K), K fixed by the shape: the labelled positions of `labels` in order,
    then padding (position 0, label -100). Per-token masking never selects more than K, so nothing is
    dropped; whole-word masking that would overshoot K leaves whole words unmasked (input and label)."""
    tok, shards = setup["wordpiece"]
    ds = MlmDataset.from_shards(shards, tok, L, seed=0, mask_prob=mask_prob, whole_word=whole_word)
    K = ds.num_targets
    per_token = max(1, round(mask_prob * (L - 2)))
    assert K == (per_token if not whole_word else min(L - 2, per_token + max(4, per_token // 4)))
    for i in range(6):
        b = ds.batch(i, 32)
        labels, positions, targets = b["labels"], b["mlm_positions"], b["mlm_labels"]
        assert positions.shape == targets.shape == (32, K) and positions.dtype == torch.int64
        real = targets != -100
        assert torch.equal(real.sum(1), (labels != -100).sum(1))  # every target is there
        assert torch.equal(torch.gather(labels, 1, positions)[real], targets[real])
        assert (positions[~real] == 0).all()
        for row_pos, row_real in zip(positions, real):  # labelled positions in order, then the padding
            kept = row_pos[row_real].tolist()
            assert kept == sorted(kept) and row_real.tolist() == sorted(row_real.tolist(), reverse=True)
        orig = ds.originals(_batch_rows(ds, i, 32))
        assert torch.equal(b["input_ids"][labels == -100], orig[labels == -100])  # unmasked = original
    if not whole_word:  # exactly the masking's own count, at least one per row
        assert (real.sum(1) >= 1).all()


def test_whole_word_masking_past_k_unmasks_whole_words(setup, monkeypatch):
    """A vocabulary of 600 makes long words: some rows select past K and leave their last words unmasked
    (input and label), whole words only, never a piece of one."""
    from tfkit.tokenization import batches

    sel = torch.tensor([[0, 1, 1, 0, 1, 1, 1, 0, 1, 0]], dtype=torch.bool)  # words [0] [1 2] [3] [4 5 6] [7] [8] [9]
    starts = torch.tensor([[1, 1, 0, 1, 1, 0, 0, 1, 1, 1]], dtype=torch.bool)
    assert batches._words_past(sel, starts, 3).int().tolist() == [[0, 0, 0, 0, 1, 1, 1, 0, 1, 0]]  # 4..6 end at 5
    assert batches._words_past(sel, starts, 5).int().tolist() == [[0, 0, 0, 0, 0, 0, 0, 0, 1, 0]]
    tok, shards = setup["wordpiece"]
    ds = MlmDataset.from_shards(shards, tok, 32, seed=0, whole_word=True)
    words_past, unmasked = batches._words_past, []
    monkeypatch.setattr(batches, "_words_past", lambda *a: unmasked.append(words_past(*a)) or unmasked[-1])
    b = ds.batch(0, 64)
    assert unmasked[0].any(1).sum() >= 1  # rows that were capped
    assert ((b["labels"] != -100).sum(1) <= ds.num_targets).all()
    original = ds.originals(_batch_rows(ds, 0, 64))
    assert torch.equal(b["input_ids"][unmasked[0]], original[unmasked[0]]) and (b["labels"][unmasked[0]] == -100).all()
    for row_sel, row_ids in zip((b["labels"] != -100).tolist(), original.tolist()):  # whole words, as masked
        word = []
        for pos, tid in enumerate(row_ids + [tok.cls_id]):
            if word and (not tok.id_to_token(tid).startswith("##") or row_ids[pos - 1] in tok.special_ids):
                assert len({row_sel[p] for p in word}) == 1
                word = []
            word.append(pos)


def test_mlm_needs_a_mask_token(setup):
    tok, shards = setup["bpe"]
    with pytest.raises(ConfigError, match=r"kind bpe has no mask token.*<\|mask\|>"):
        MlmDataset.from_shards(shards, tok, 64, seed=0)


def test_seq2seq_pairs_from_tsv_and_jsonl(setup, tmp_path):
    tok, _ = setup["bpe"]
    (tmp_path / "p.tsv").write_text("hear me speak\tspeak\nfirst citizen\tcitizen of rome and more words here\n")
    (tmp_path / "p.jsonl").write_text(json.dumps({"en": "all", "fr": "tous"}) + "\n")
    assert read_pairs(str(tmp_path / "p.jsonl"), "en", "fr") == [("all", "tous")]
    ds = Seq2SeqDataset.from_file(str(tmp_path / "p.tsv"), tok, 0, max_src_len=16, max_tgt_len=6)
    b = next(ds.eval_batches(1, 2))
    assert b["src_ids"].shape == (2, 16) and b["tgt_ids"].shape == b["labels"].shape == (2, 6)
    src, tgt = tok.encode("hear me speak"), tok.encode("speak")
    assert b["src_ids"][0, : len(src) + 1].tolist() == src + [tok.eos_id]
    assert b["src_mask"][0].sum() == len(src) + 1
    assert b["tgt_ids"][0, : len(tgt) + 1].tolist() == [tok.bos_id] + tgt
    assert b["labels"][0].tolist() == tgt + [tok.eos_id] + [-100] * (5 - len(tgt))
    assert torch.equal(b["tgt_mask"], b["labels"] != -100)
    assert ds.truncated == {"source": 0, "target": 1} and b["tgt_mask"][1].all()


def test_bad_pair_files_name_the_line(tmp_path):
    (tmp_path / "bad.jsonl").write_text(json.dumps({"source": "a", "target": "b"}) + "\n" + json.dumps({"source": "c"}))
    with pytest.raises(DataError, match=r"bad\.jsonl:2: no string field 'target'"):
        read_pairs(str(tmp_path / "bad.jsonl"))
    (tmp_path / "bad.tsv").write_text("only one column\n")
    with pytest.raises(DataError, match=r"bad\.tsv:1: expected 2 tab-separated columns"):
        read_pairs(str(tmp_path / "bad.tsv"))


def test_seq2seq_denoising_replaces_spans_with_one_mask_each(setup):
    tok, shards = setup["wordpiece"]
    ds = Seq2SeqDataset.denoising(shards, tok, 0, max_src_len=64, max_tgt_len=64)
    b = ds.batch(0, 32)
    assert (b["tgt_ids"][:, 0] == tok.cls_id).all()  # wordpiece: [CLS] plays BOS, [SEP] plays EOS
    dropped = total = 0
    for src, smask, labels in zip(b["src_ids"], b["src_mask"], b["labels"]):
        source = src[smask].tolist()[:-1]
        target = labels[labels != -100].tolist()[:-1]
        assert source.count(tok.mask_id) >= 1 and source[0] != tok.mask_id  # kept text comes first
        it = iter(target)
        assert all(t in it for t in source if t != tok.mask_id)  # the rest is a subsequence of the target
        dropped += len(target) - (len(source) - source.count(tok.mask_id))
        total += len(target)
    assert 0.1 < dropped / total < 0.2
    assert torch.equal(ds.batch(0, 32)["src_ids"], b["src_ids"])


def _documents_of(shards, stream_positions: np.ndarray) -> np.ndarray:
    """The document of each stream position, read off doc_starts the slow way."""
    starts = np.asarray(shards.doc_starts)
    return np.array([[int((starts <= p).sum()) - 1 for p in row] for row in stream_positions])


def test_clm_document_mask_rows_carry_the_documents_of_the_shards(setup):
    tok, shards = setup["bpe"]
    ds = ClmDataset.from_shards(shards, seq_len=64, seed=0, document_mask=True, reset_positions=True)
    b = ds.batch(3, 8)
    plain = ClmDataset.from_shards(shards, seq_len=64, seed=0).batch(3, 8)
    assert torch.equal(b["input_ids"], plain["input_ids"]) and torch.equal(b["labels"], plain["labels"])
    idx = ds._permutation(0)[3 * 8 : 4 * 8]
    docs = _documents_of(shards, idx[:, None] * 64 + np.arange(64))
    assert torch.equal(b["doc_ids"], torch.from_numpy(docs - docs[:, :1]))
    eos = b["input_ids"] == tok.eos_id  # every separator ends its document: the next token starts another
    assert eos.any()
    for r, c in eos[:, :-1].nonzero().tolist():
        assert b["doc_ids"][r, c + 1] == b["doc_ids"][r, c] + 1 and b["position_ids"][r, c + 1] == 0
        assert c == 0 or b["doc_ids"][r, c - 1] == b["doc_ids"][r, c]  # the separator belongs to its document
    steps = b["position_ids"][:, 1:] - b["position_ids"][:, :-1]
    assert torch.equal(steps == 1, b["doc_ids"][:, 1:] == b["doc_ids"][:, :-1])  # +1 inside, 0 at each start
    assert torch.equal(ds.batch(3, 8)["doc_ids"], b["doc_ids"])  # a pure function of (seed, i)
    assert "doc_ids" not in plain and "position_ids" not in ClmDataset.from_shards(
        shards, seq_len=64, seed=0, document_mask=True).batch(3, 8)


def test_mlm_document_mask_gives_cls_the_first_and_sep_the_last_document(setup):
    tok, shards = setup["wordpiece"]
    ds = MlmDataset.from_shards(shards, tok, 64, seed=0, document_mask=True)
    b = ds.batch(0, 8)
    idx = ds._permutation(0)[:8]
    body = _documents_of(shards, idx[:, None] * 62 + np.arange(62))
    want = np.concatenate([body[:, :1], body, body[:, -1:]], axis=1)
    assert torch.equal(b["doc_ids"], torch.from_numpy(want - want[:, :1]))
    assert b["doc_ids"].max() > 0  # some row packs more than one document
