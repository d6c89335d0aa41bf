"""Ablation tables: the cached-prefix computation equals the naive loop; rows and rendering."""

from __future__ import annotations

import math
import random

import pytest
import torch

from mi_core.data import PairDataset, pair_batches
from mi_core.errors import InterventionError
from mi_core.interventions import Component, all_heads, compute_means
from mi_core.interventions.ablation_table import (
    AblationTable,
    ablation_logits,
    ablation_table,
    naive_ablation_logits,
    parse_head_set,
)
from mi_core.models import load_model

WORDS = "the a cat dog man woman saw ate liked park house because when never always red".split()


def toy_pairs(n: int, seed: int = 0, name: str = "toy") -> PairDataset:
    rng = random.Random(seed)
    sentence = lambda: " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 14)))
    return PairDataset(
        name=name,
        task="mnli",
        text_a=[sentence() for _ in range(n)],
        text_b=[sentence() for _ in range(n)],
        labels=[rng.randrange(3) for _ in range(n)],
        num_labels=3,
        label_names=["entailment", "neutral", "contradiction"],
        prediction_map=[0, 1, 2],
    )


@pytest.fixture(scope="module", params=["bert-cls", "gpt2-cls"])
def classifier(request, tiny_checkpoints):
    model = load_model(tiny_checkpoints[request.param], task="mnli")
    data = toy_pairs(10)
    batches = list(pair_batches(data, model.tokenizer, batch_size=8, sort_by_length=True))
    means = compute_means(model, batches, dataset=data.name)
    return model, data, batches, means


@pytest.mark.parametrize("fill", ["mean", "zero"])
def test_cached_prefix_equals_naive_loop(classifier, fill):
    model, _, batches, means = classifier
    heads = all_heads(model)
    joints = [parse_head_set("L0.H1+L2.H3", model), parse_head_set("L1.H0+L1.H2+L2.H1", model)]
    naive = naive_ablation_logits(model, batches, heads, joints, means, fill)
    fast = ablation_logits(model, batches, heads, joints, means, fill)
    assert fast.max_abs_diff(naive) <= 1e-5
    # the comparison means something: every ablation moves the logits
    for values in list(fast.singles.values()) + list(fast.joints.values()):
        assert (values - fast.full).abs().max() > 1e-4
    if fill == "mean":  # one head per stacked chunk gives the same numbers
        one_by_one = ablation_logits(model, batches, heads, [], means, fill, max_tokens=1)
        assert (
            max(float((one_by_one.singles[h] - naive.singles[h]).abs().max()) for h in heads)
            <= 1e-5
        )


def test_logits_come_back_in_data_set_order(classifier):
    model, data, _, means = classifier
    shuffled = list(pair_batches(data, model.tokenizer, batch_size=5, shuffle=True, seed=4))
    plain = list(pair_batches(data, model.tokenizer, batch_size=7))
    heads = [Component(1, 2)]
    a = ablation_logits(model, shuffled, heads, means=means)
    b = ablation_logits(model, plain, heads, means=means)
    assert a.max_abs_diff(b) <= 1e-5
    direct = torch.cat([model(**batch) for batch in plain])
    assert torch.allclose(a.full, direct, atol=1e-5)


def test_table_rows_and_superadditivity(classifier):
    model, data, _, means = classifier
    other = toy_pairs(9, seed=1, name="toy2")
    joint = parse_head_set("L0.H0+L1.H1", model)
    listed = [Component(0, 0), Component(1, 1), Component(2, 3)]
    table = ablation_table(model, [data, other], listed, [joint], means, batch_size=8, others=True)
    frame = table.frame()
    assert list(frame["ablated"]) == [
        "None (full model)",
        "L0.H0",
        "L1.H1",
        "L2.H3",
        "Avg. (others)",
        "L0.H0+L1.H1",
        "Superadditivity L0.H0+L1.H1",
    ]
    assert len(table.singles) == model.cfg.n_layers * model.cfg.n_heads
    others = [c for c in all_heads(model) if c not in listed]
    accs = torch.tensor([table.singles[c]["toy"] for c in others], dtype=torch.float64)
    row = frame.set_index("ablated").loc["Avg. (others)"]
    assert row["toy"] == pytest.approx(100 * float(accs.mean()))
    assert row["toy std"] == pytest.approx(100 * float(accs.std(unbiased=False)))
    assert row["toy change"] == pytest.approx(100 * (float(accs.mean()) - table.full["toy"]))
    full, j = table.full["toy2"], table.joints[joint]["toy2"]
    s0, s1 = table.singles[Component(0, 0)]["toy2"], table.singles[Component(1, 1)]["toy2"]
    expected = (full - j) - ((full - s0) + (full - s1))
    sup = frame.set_index("ablated").loc["Superadditivity L0.H0+L1.H1", "toy2"]
    assert sup == pytest.approx(100 * expected)
    # accuracies agree with scoring the logits
    assert table.full["toy"] == data.score(table.logits["toy"].full)
    # without others: no Avg. row made of the joint set's few heads (ablated singly only for
    # the superadditivity), and they are not shown as if they were listed heads
    alone = ablation_table(model, [data], [Component(2, 3)], ["L0.H1+L1.H2"], means,
                           batch_size=8).frame()  # fmt: skip
    assert list(alone["ablated"]) == [
        "None (full model)", "L2.H3", "L0.H1+L1.H2", "Superadditivity L0.H1+L1.H2",
    ]  # fmt: skip


def test_rendering_like_the_paper():
    table = AblationTable(
        datasets=["MNLI", "HANS"],
        full={"MNLI": 0.846, "HANS": 0.646},
        singles={
            Component(2, 5): {"MNLI": 0.842, "HANS": 0.612},
            Component(3, 7): {"MNLI": 0.845, "HANS": 0.640},
            Component(0, 0): {"MNLI": 0.840, "HANS": 0.640},
            Component(0, 1): {"MNLI": 0.846, "HANS": 0.650},
        },
        listed=[Component(2, 5), Component(3, 7)],
        joints={(Component(2, 5), Component(3, 7)): {"MNLI": 0.830, "HANS": 0.500}},
        n_examples={"MNLI": 1000, "HANS": 1000},
    )
    md = table.markdown()
    assert "| Ablated | MNLI | HANS |" in md
    assert "| None (full model) | 84.6 | 64.6 |" in md
    assert "| L2.H5 | 84.2 (-0.4) | 61.2 (-3.4) |" in md
    assert "| Avg. (others) | 84.3 ± 0.3 (-0.3) | 64.5 ± 0.5 (-0.1) |" in md
    assert "| L2.H5+L3.H7 | 83.0 (-1.6) | 50.0 (-14.6) |" in md
    # HANS: joint drop 14.6, single drops 3.4 + 0.6 -> +10.6 superadditive
    assert "| Superadditivity L2.H5+L3.H7 | +1.1 | +10.6 |" in md
    html = table.html()
    assert html.startswith("<!DOCTYPE html>") and "61.2 (-3.4)" in html
    assert "Examples: MNLI: n=1000, HANS: n=1000." in html  # n, as the Markdown states it
    frame = table.frame()
    assert math.isnan(frame.loc[0, "MNLI std"])
    assert frame.loc[1, "HANS change"] == pytest.approx(-3.4)


def test_table_input_errors(classifier):
    model, data, _, means = classifier
    with pytest.raises(InterventionError, match="at least two heads"):
        parse_head_set("L0.H1", model)
    with pytest.raises(InterventionError, match="ablate attention heads, not L0.MLP"):
        parse_head_set("L0.H1+L0.MLP", model)
    with pytest.raises(InterventionError, match="L7.H0 does not exist"):
        parse_head_set("L0.H1+L7.H0", model)
    with pytest.raises(InterventionError, match="mean ablation needs means"):
        ablation_table(model, [data], [Component(0, 0)])
    with pytest.raises(InterventionError, match="empty"):
        ablation_table(model, [data.head(0)], [Component(0, 0)], means=means)


def test_names_and_tuples_work_wherever_components_do(classifier):
    from mi_core import ComponentMask, ablate
    from mi_core.evaluation import evaluate

    model, _, _, means = classifier
    data = toy_pairs(24)
    by_type = ablation_table(
        model, [data], [Component(0, 1), Component(1, 2)], [(Component(0, 1), Component(1, 2))],
        means,
    )  # fmt: skip
    by_name = ablation_table(model, [data], "L0.H1,L1.H2", ["L0.H1+L1.H2"], means)
    by_tuple = ablation_table(model, [data], [(0, 1), (1, 2)], ["L0.H1+L1.H2"], means)
    assert by_name.frame().equals(by_type.frame()) and by_tuple.frame().equals(by_type.frame())
    assert "Avg. (others)" not in set(by_name.frame()["ablated"])  # only when asked
    # evaluate(..., mask=, means=) is the accuracy under ablate()
    mask = ComponentMask.from_removed(model, [(0, 1), (1, 2)])
    with ablate(model, mask, means):
        expected = evaluate(model, data, batch_size=8)
    got = evaluate(model, data, batch_size=8, mask=mask, means=means)
    assert torch.equal(got.logits, expected.logits)
    assert not torch.equal(got.logits, evaluate(model, data, batch_size=8).logits)
