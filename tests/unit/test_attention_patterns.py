"""Attention-pattern classes on hand-made patterns, padding, segments, and a tiny real encoder."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch
from transformer_lens import HookedEncoder, HookedTransformerConfig

from mi_core.analysis.attention_patterns import (
    PATTERN_CLASSES,
    AttentionPatternScores,
    classify_heads,
    pattern_masses,
    score_attention_patterns,
    segment_ids_from_sep,
)

CLS, SEP, PAD = 101, 102, 0
# [CLS] 5 6 7 [SEP] 7 5 8 [SEP] [PAD] [PAD]: 5 and 7 repeat across the two sentences.
IDS = torch.tensor([[CLS, 5, 6, 7, SEP, 7, 5, 8, SEP, PAD, PAD]])
MASK = torch.tensor([[1] * 9 + [0] * 2])
TYPES = torch.tensor([[0] * 5 + [1] * 4 + [0] * 2])
N_VALID, N = 9, 11
REPEAT = {1: 6, 6: 1, 3: 5, 5: 3}  # query position -> the identical token in the other sentence


def _one_hot_rows(targets: dict[int, list[int]]) -> torch.Tensor:
    """A [q, k] pattern: valid query q spreads its mass evenly over targets[q]; padded queries
    put everything on a padded key (which must never count)."""
    rows = torch.zeros(N, N)
    for q in range(N):
        keys = targets.get(q, [N - 1]) if q < N_VALID else [N - 1]
        rows[q, keys] = 1.0 / len(keys)
    return rows


def _heads() -> dict[str, torch.Tensor]:
    uniform = torch.zeros(N, N)
    uniform[:, :N_VALID] = 1.0 / N_VALID
    return {
        "prev": _one_hot_rows({q: [max(q - 1, 0)] for q in range(N_VALID)}),
        "sep": _one_hot_rows({q: [4, 8] for q in range(N_VALID)}),
        "overlap": _one_hot_rows({q: [REPEAT.get(q, 0)] for q in range(N_VALID)}),
        "next": _one_hot_rows({q: [min(q + 1, N_VALID - 1)] for q in range(N_VALID)}),
        "self": _one_hot_rows({q: [q] for q in range(N_VALID)}),
        "uniform": uniform,
    }


def _scores(pattern: torch.Tensor, **kwargs) -> AttentionPatternScores:
    scores = AttentionPatternScores(1, pattern.shape[1], sep_ids={SEP}, **kwargs)
    scores.add(0, pattern, IDS, MASK, TYPES)
    return scores


def test_hand_made_patterns_get_their_class():
    heads = _heads()
    pattern = torch.stack(list(heads.values()))[None]  # [1, head, q, k]
    table = classify_heads(_scores(pattern))
    assert list(table["pattern_class"]) == ["prev", "sep", "overlap", "next", "self", "other"]
    by_head = table.set_index("head")
    assert by_head.loc[0, "prev_mass"] == pytest.approx(1.0)
    assert by_head.loc[1, "sep_mass"] == pytest.approx(1.0)
    assert by_head.loc[2, "overlap_mass"] == pytest.approx(1.0)
    # Overlap is averaged only over the 4 queries that have a repeated token across sentences.
    assert by_head.loc[2, "overlap_n"] == 4
    assert by_head.loc[2, "overlap_uniform"] == pytest.approx(1 / N_VALID)
    assert by_head.loc[2, "overlap_ratio"] == pytest.approx(N_VALID)
    # prev exists for 8 of the 9 valid queries, next likewise; self/first for all 9.
    assert by_head.loc[0, "prev_n"] == 8 and by_head.loc[0, "next_n"] == 8
    assert by_head.loc[0, "self_n"] == 9 and by_head.loc[0, "first_n"] == 9
    assert set(table.columns) >= {"layer", "head", "label", "dominant", "dominant_mass"}
    assert table.loc[0, "label"] == "L0.H0"


def test_uniform_pattern_equals_uniform_baseline():
    pattern = _heads()["uniform"][None, None]
    row = classify_heads(_scores(pattern)).iloc[0]
    for c in PATTERN_CLASSES:
        assert row[f"{c}_mass"] == pytest.approx(row[f"{c}_uniform"]), c
        assert row[f"{c}_excess"] == pytest.approx(0.0, abs=1e-7)
        assert row[f"{c}_ratio"] == pytest.approx(1.0)
    assert row["sep_uniform"] == pytest.approx(2 / N_VALID)
    assert row["pattern_class"] == "other"


def test_padding_never_counts():
    heads = _heads()
    pattern = torch.stack(list(heads.values()))[None]
    padded = pattern_masses(pattern, IDS, MASK, TYPES, {SEP})
    trimmed = pattern_masses(
        pattern[..., :N_VALID, :N_VALID],
        IDS[:, :N_VALID],
        MASK[:, :N_VALID],
        TYPES[:, :N_VALID],
        {SEP},
    )
    for c in PATTERN_CLASSES:
        assert padded.count[c] == trimmed.count[c]
        assert torch.allclose(padded.mass[c], trimmed.mass[c])
        assert float(padded.uniform[c]) == pytest.approx(float(trimmed.uniform[c]))
    # Mass that valid queries put on padded keys is dropped, not attributed to any class.
    leaky = torch.zeros(1, 1, N, N)
    leaky[0, 0, :, N - 1] = 1.0  # every query attends only to the last (padded) key
    sums = pattern_masses(leaky, IDS, MASK, TYPES, {SEP})
    assert all(float(sums.mass[c].sum()) == 0.0 for c in PATTERN_CLASSES)
    assert sums.count["self"] == N_VALID
    # Padded tokens share an id (PAD) across segments, yet never make overlap queries.
    assert sums.count["overlap"] == 4


def test_threshold_and_min_excess():
    # 15 % on the previous token, the rest uniform: mass 0.15 + 0.85/9 = 0.244, excess 0.133.
    mixed = _heads()["uniform"] * 0.85 + _heads()["prev"] * 0.15
    scores = _scores(mixed[None, None])
    row = classify_heads(scores).iloc[0]
    assert row["prev_mass"] == pytest.approx(0.15 + 0.85 / N_VALID)
    assert row["prev_excess"] == pytest.approx(0.15 * (1 - 1 / N_VALID))
    assert row["dominant"] == "prev"
    assert row["pattern_class"] == "other"  # below the default threshold 0.3
    assert classify_heads(scores, threshold=0.2).iloc[0]["pattern_class"] == "prev"
    assert classify_heads(scores, threshold=0.2, min_excess=0.2).iloc[0]["pattern_class"] == "other"


def test_accumulator_is_additive_over_batches_and_layers():
    pattern = torch.stack(list(_heads().values()))[None]
    two = AttentionPatternScores(3, pattern.shape[1], sep_ids={SEP})
    for _ in range(2):
        two.add(2, pattern, IDS, MASK, TYPES)
    one = _scores(pattern)
    a = two.to_frame().drop(columns=["layer", "label"])
    b = one.to_frame().drop(columns=["layer", "label"])
    counts = [f"{c}_n" for c in PATTERN_CLASSES]
    pd.testing.assert_frame_equal(a.drop(columns=counts), b.drop(columns=counts))
    assert (a[counts].to_numpy() == 2 * b[counts].to_numpy()).all()
    assert set(two.to_frame()["layer"]) == {2}  # only layers that saw data
    via_sums = AttentionPatternScores(1, pattern.shape[1], sep_ids={SEP})
    via_sums.add_sums(0, pattern_masses(pattern, IDS, MASK, TYPES, {SEP}))
    pd.testing.assert_frame_equal(via_sums.to_frame(), one.to_frame())
    assert list(two.to_frame(heads=["L2.H1"])["label"]) == ["L2.H1"]


def test_segment_ids_from_sep_roberta_and_gpt2():
    # RoBERTa: <s> A </s></s> B </s> <pad>
    ids = torch.tensor([[0, 10, 11, 2, 2, 12, 13, 2, 1]])
    mask = torch.tensor([[1] * 8 + [0]])
    assert segment_ids_from_sep(ids, {2}, mask).tolist() == [[0, 0, 0, 0, 0, 1, 1, 1, 0]]
    # GPT-2, left padded with the separator id itself: padding must not count as separator.
    eos = 50256
    ids = torch.tensor([[eos, eos, 20, 21, eos, 22, 23]])
    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1]])
    assert segment_ids_from_sep(ids, {eos}, mask).tolist() == [[0, 0, 0, 0, 0, 1, 1]]
    # No separator: one segment.
    assert segment_ids_from_sep(torch.tensor([[5, 6, 7]]), {eos}).tolist() == [[0, 0, 0]]


def test_causal_overlap_only_looks_back_and_next_is_undefined():
    eos = 50
    ids = torch.tensor([[5, 6, 7, eos, 7, 5, 8]])
    mask = torch.ones_like(ids)
    n = ids.shape[1]
    pattern = torch.zeros(1, 1, n, n)
    targets = {0: 0, 1: 0, 2: 0, 3: 0, 4: 2, 5: 0, 6: 0}  # 7 -> earlier 7, 5 -> earlier 5
    for q, k in targets.items():
        pattern[0, 0, q, k] = 1.0
    sums = pattern_masses(pattern, ids, mask, None, {eos}, causal=True, first_is_special=False)
    assert sums.count["overlap"] == 2  # queries at positions 4 and 5 only
    assert float(sums.mass["overlap"][0]) == pytest.approx(2.0)
    assert float(sums.uniform["overlap"]) == pytest.approx(1 / 5 + 1 / 6)
    assert sums.count["next"] == 0
    # Uniform causal baseline of "self": sum over q of 1/(q+1).
    assert float(sums.uniform["self"]) == pytest.approx(sum(1 / (q + 1) for q in range(n)))
    scores = AttentionPatternScores(1, 1, sep_ids={eos}, causal=True, first_is_special=False)
    scores.add(0, pattern, ids, mask)
    row = classify_heads(scores).iloc[0]
    assert math.isnan(row["next_mass"])
    assert row["pattern_class"] == "overlap"  # 1.0 over 2 queries beats first (5/7 - uniform)


# --------------------------------------------------------------------------- tiny real encoder


class _Adapter(torch.nn.Module):
    """Stands in for the classifier: forward(input_ids, attention_mask, token_type_ids)."""

    is_encoder = True

    def __init__(self, model: HookedEncoder) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask=None, token_type_ids=None):
        return self.model(
            input_ids, token_type_ids=token_type_ids, one_zero_attention_mask=attention_mask
        )


@pytest.fixture(scope="module")
def encoder() -> HookedEncoder:
    cfg = HookedTransformerConfig(
        n_layers=2,
        d_model=32,
        n_heads=4,
        d_head=8,
        d_mlp=64,
        n_ctx=32,
        d_vocab=120,
        act_fn="gelu",
        attention_dir="bidirectional",
        seed=0,
        device="cpu",
    )
    model = HookedEncoder(cfg, move_to_device=False)
    # HookedEncoder leaves its weights uninitialised (torch.empty): garbage, NaN or inf that
    # changes from run to run. Initialise them, large enough for non-uniform attention.
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.ndim >= 2:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.3)
            elif name.endswith(".w"):
                param.fill_(1.0)
            else:
                param.zero_()
    model.eval()
    return model


def _batches():
    a = {"input_ids": IDS, "attention_mask": MASK, "token_type_ids": TYPES}
    ids2 = torch.tensor([[CLS, 9, 10, SEP, 10, 11, 9, 12, SEP, PAD, PAD]])
    b = {
        "input_ids": ids2,
        "attention_mask": MASK.clone(),
        "token_type_ids": torch.tensor([[0] * 4 + [1] * 5 + [0] * 2]),
    }
    return [a, b]


def test_score_attention_patterns_matches_cached_patterns(encoder):
    adapter = _Adapter(encoder)
    scores = score_attention_patterns(adapter, _batches(), sep_ids={SEP})
    assert scores.causal is False
    manual = AttentionPatternScores(2, 4, sep_ids={SEP})
    for batch in _batches():
        _, cache = encoder.run_with_cache(
            batch["input_ids"],
            token_type_ids=batch["token_type_ids"],
            one_zero_attention_mask=batch["attention_mask"],
        )
        for layer in range(2):
            manual.add(
                layer,
                cache[f"blocks.{layer}.attn.hook_pattern"],
                batch["input_ids"],
                batch["attention_mask"],
                batch["token_type_ids"],
            )
    pd.testing.assert_frame_equal(scores.to_frame(), manual.to_frame(), atol=1e-6, rtol=1e-5)
    table = classify_heads(scores)
    assert len(table) == 8 and set(table["pattern_class"]) <= {*PATTERN_CLASSES, "other"}
    assert table.filter(like="_mass").notna().all().all()  # an encoder: "next" exists
    assert not table["self_mass"].between(1 / N_VALID - 1e-4, 1 / N_VALID + 1e-4).all()
    assert encoder.hook_dict["blocks.0.attn.hook_pattern"].fwd_hooks == []  # hooks removed


def test_score_attention_patterns_padding_and_heads(encoder):
    adapter = _Adapter(encoder)
    padded = score_attention_patterns(adapter, _batches()[:1], sep_ids={SEP}, heads=["L1.H2"])
    trimmed_batch = {k: v[:, :N_VALID] for k, v in _batches()[0].items()}
    calls = []

    def forward(batch):
        calls.append(batch["input_ids"].shape)
        return adapter(**batch)

    trimmed = score_attention_patterns(
        encoder, [trimmed_batch], sep_ids={SEP}, heads=["L1.H2"], forward=forward
    )
    assert calls == [(1, N_VALID)]
    a, b = padded.to_frame(), trimmed.to_frame()
    assert list(a["label"]) == ["L1.H2"] and padded.layers_seen == {1}
    pd.testing.assert_frame_equal(a, b, atol=1e-5, rtol=1e-4)


# --------------------------------------------------------------------------- figures / HTML


def test_attention_class_chart():
    from mi_core.viz import attention_class_chart

    pattern = torch.stack(list(_heads().values()))[None]
    table = classify_heads(_scores(pattern))
    fig = attention_class_chart(table, ["L0.H2", "L0.H0"], show_uniform=True)
    bars = [t for t in fig.data if t.type == "bar"]
    assert [t.name for t in bars] == list(PATTERN_CLASSES)
    assert len(fig.data) == 12  # + one uniform-baseline marker trace per class
    overlap = fig.data[0]
    assert list(overlap.x) == ["L0.H2", "L0.H0"]
    assert overlap.y[0] == pytest.approx(1.0)
    assert fig.layout.yaxis.title.text == "mean attention mass"
    with pytest.raises(Exception, match="L9.H9"):
        attention_class_chart(table, ["L9.H9"])


def test_attention_html_is_offline_and_has_tokens(tmp_path):
    import re

    from mi_core.viz import attention_view_html, write_attention_html

    tokens = ["[CLS]", "doctor", "advised", "president", "[SEP]", "</script>"]
    pattern = torch.softmax(torch.randn(2, 6, 6), dim=-1)
    page = attention_view_html(tokens, pattern, ["L2.H5", "L4.H0"], title="SO-Swap")
    assert page.startswith("<!DOCTYPE html>")
    for token in ["doctor", "advised", "president", "L2.H5", "[SEP]"]:
        assert f'"{token}"' in page
    assert "CircuitsVis.render(" in page  # the bundled JavaScript is inlined
    assert not re.search(r"(unpkg|jsdelivr|cdn)[^\"'\s]*circuitsvis", page, re.I)
    assert not re.search(r"<script[^>]+src=[\"']?https?://", page, re.I)
    assert not re.search(r"from\s+[\"']https?://", page)
    # A "</script>" token cannot end the script early (it is escaped in the JSON props).
    assert page.count("</script>") == 1 and '"\\u003c/script>"' in page
    path = write_attention_html(tmp_path / "attn.html", tokens, pattern, ["a", "b"])
    assert '"president"' in path.read_text()
    with pytest.raises(Exception, match="6"):
        attention_view_html(tokens[:3], pattern)


def test_attention_view_greys_the_upper_triangle_only_for_causal_attention(tiny_checkpoints):
    from mi_core.models import load_model
    from mi_core.viz import attention_view_html

    tokens = ["[CLS]", "a", "b", "[SEP]"]
    encoder = torch.softmax(torch.randn(2, 4, 4), dim=-1)  # attends to later tokens too
    decoder = torch.softmax(
        torch.randn(2, 4, 4).masked_fill(torch.ones(4, 4).triu(1) > 0, -1e9), -1
    )

    def masked(page: str) -> bool:
        return '"maskUpperTri": true' in page

    assert not masked(attention_view_html(tokens, encoder))  # derived from the pattern
    assert masked(attention_view_html(tokens, decoder))
    bert = load_model(tiny_checkpoints["bert-cls"], task="mnli")
    gpt2 = load_model(tiny_checkpoints["gpt2-cls"], task="mnli")
    assert not masked(attention_view_html(tokens, decoder, model=bert))  # from the model
    assert masked(attention_view_html(tokens, decoder, model=gpt2))
    assert not masked(attention_view_html(tokens, decoder, causal=False))


@pytest.mark.parametrize(
    "kind, causal, overlap_queries", [("bert-cls", False, 12), ("gpt2-cls", True, 6)]
)
def test_score_attention_patterns_on_project_classifiers(
    tiny_checkpoints, kind, causal, overlap_queries
):
    """The real classifiers: BERT uses token_type_ids; GPT-2 derives segments from [SEP] and
    only counts overlap from the second sentence back to the first."""
    from mi_core.models import load_model

    model = load_model(str(tiny_checkpoints[kind]), task="mnli")
    tok = model.tokenizer
    batch = dict(
        tok(
            ["the doctor advised the president", "a cat"],
            ["the president advised the doctor", "a dog sat"],
            return_tensors="pt",
            padding=True,
        )
    )
    scores = score_attention_patterns(model, [batch], sep_ids={tok.sep_token_id})
    assert scores.causal is causal
    table = classify_heads(scores)
    assert len(table) == model.cfg.n_layers * model.cfg.n_heads
    # Pair 1 repeats all 5 words across the sentences, pair 2 repeats "a": 2 x 6 queries for
    # an encoder, 5 + 1 (second sentence only) for a decoder.
    assert (table["overlap_n"] == overlap_queries).all()
    assert (table["next_n"] == 0).all() == causal
    # Masses are probabilities: between 0 and 1, uniform baselines too.
    masses = table.filter(regex="_(mass|uniform)$").to_numpy(dtype=float)
    assert ((masses[~np.isnan(masses)] >= 0) & (masses[~np.isnan(masses)] <= 1 + 1e-6)).all()


# A language model's prompt: BOS, then A B C twice, then D; the answer token is B, the
# distractor C. Induction keys of the second A B C are the tokens after the first one's.
BOS, EOS = 1, 2
LM_IDS = torch.tensor([[BOS, 5, 6, 7, 5, 6, 7, 8, EOS]])
LM_MASK = torch.tensor([[1] * 8 + [0]])  # EOS pads


def _lm_head(targets: dict[int, list[int]], n: int = 9, valid: int = 8) -> torch.Tensor:
    """A causal [q, k] pattern: query q spreads its mass over targets[q] (default: BOS)."""
    rows = torch.zeros(n, n)
    for q in range(n):
        keys = targets.get(q, [0]) if q < valid else [0]
        rows[q, keys] = 1.0 / len(keys)
    return rows


def test_decoder_classes_on_hand_made_patterns():
    """A pure previous-token head scores 1 on prev and 0 on induction; a pure induction head
    the reverse; duplicate, first-token (BOS), self and the answer-position classes each find
    their own head (the DECODER_CLASSES of a language model on a prompt task)."""
    from mi_core.analysis.attention_patterns import DECODER_CLASSES

    heads = {
        "prev": _lm_head({q: [max(q - 1, 0)] for q in range(8)}),
        "induction": _lm_head({4: [2], 5: [3], 6: [4]}),
        "duplicate": _lm_head({4: [1], 5: [2], 6: [3]}),
        "first": _lm_head({}),
        "self": _lm_head({q: [q] for q in range(8)}),
        "to_answer": _lm_head({7: [2, 5]}),
        "to_distractor": _lm_head({7: [3, 6]}),
    }
    pattern = torch.stack(list(heads.values()))[None]
    scores = AttentionPatternScores(1, len(heads), sep_ids={EOS}, causal=True,
                                    classes=DECODER_CLASSES)  # fmt: skip
    masks = scores.key_masks(LM_IDS, LM_MASK, None, torch.tensor([6]), torch.tensor([7]))
    scores.add(0, pattern, key_masks=masks)
    frame = scores.to_frame().set_index("head")
    prev, induction = 0, 1
    assert frame.loc[prev, "prev_mass"] == pytest.approx(1.0)
    assert frame.loc[prev, "induction_mass"] == pytest.approx(0.0)
    assert frame.loc[induction, "induction_mass"] == pytest.approx(1.0)
    # its other queries rest on BOS, which is the previous token of position 1 only
    assert frame.loc[induction, "prev_mass"] == pytest.approx(1 / 7)
    # contributing queries: induction and duplicate keys exist for the second A B C only
    assert frame.loc[prev, "induction_n"] == 3 and frame.loc[prev, "duplicate_n"] == 3
    # the answer classes read the last real query only (position 7, D)
    assert frame.loc[prev, "to_answer_n"] == 1 and frame.loc[5, "to_answer_mass"] == 1.0
    assert frame.loc[6, "to_distractor_mass"] == 1.0 and frame.loc[5, "to_distractor_mass"] == 0
    # uniform baseline of to_answer: two of the last query's eight keys
    assert frame.loc[prev, "to_answer_uniform"] == pytest.approx(2 / 8)
    table = classify_heads(scores)
    assert list(table["pattern_class"]) == list(heads)
    # no answer ids given: the answer classes have no query, and no head is put in them
    plain = AttentionPatternScores(1, len(heads), sep_ids={EOS}, causal=True,
                                   classes=DECODER_CLASSES)  # fmt: skip
    plain.add(0, pattern, LM_IDS, LM_MASK)
    assert (plain.to_frame()["to_answer_n"] == 0).all()
    assert classify_heads(plain)["pattern_class"].tolist()[5:] == ["first", "first"]


def test_decoder_classes_of_a_language_model_on_ioi(tiny_checkpoints):
    """score_attention_patterns on an answer model and tokenised IOI prompts equals the same
    sums written out from run_with_cache's patterns."""
    from mi_core.analysis.attention_patterns import DECODER_CLASSES, class_key_masks
    from mi_core.data import load_prompt_task, pair_batches, tokenize_pairs
    from mi_core.models import load_model
    from mi_core.tasks import NEXT_TOKEN

    model = load_model(tiny_checkpoints["llama-lm"], task=NEXT_TOKEN)
    task = load_prompt_task("ioi", 8, tokenizer=model.tokenizer)
    tokens = tokenize_pairs(task, model.tokenizer)
    scores = score_attention_patterns(
        model, pair_batches(tokens, batch_size=3), sep_ids=[model.tokenizer.sep_token_id],
        prompts=tokens,
    )  # fmt: skip
    assert scores.classes == DECODER_CLASSES
    batch = tokens.collate(range(8))
    _, cache = model.run_with_cache(batch["input_ids"], batch["attention_mask"])
    members, allowed = class_key_masks(
        batch["input_ids"], batch["attention_mask"], None, [model.tokenizer.sep_token_id],
        causal=True, classes=DECODER_CLASSES, answer_ids=torch.tensor(tokens.labels),
        distractor_ids=torch.tensor(tokens.distractors),
    )  # fmt: skip
    k = DECODER_CLASSES.index("to_answer")
    assert int(members[k].any(-1).sum()) == 8  # every prompt names its indirect object
    for layer in range(model.cfg.n_layers):
        pattern = cache["pattern", layer]
        want = torch.einsum("bhqk,cbqk->ch", pattern.double(), members.double())
        torch.testing.assert_close(scores.mass[:, layer], want, rtol=1e-5, atol=1e-6)
