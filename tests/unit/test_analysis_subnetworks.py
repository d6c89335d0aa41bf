"""Head frequencies, the shared core, Spearman agreement, chance level and Figure 5 counts."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.stats import spearmanr

from mi_core.analysis.subnetworks import (
    core_heads,
    core_heads_by_group,
    expected_random_intersection,
    frequency_heatmap,
    frequency_spearman,
    frequency_table,
    head_counts,
    head_frequency,
    head_labels,
    masks_from_labels,
    parse_head_label,
    subnetwork_table,
)
from mi_core.errors import ConfigError


def _masks() -> torch.Tensor:
    # 3 subnetworks of a 2-layer, 3-head model.
    return torch.tensor(
        [
            [[1, 1, 0], [0, 1, 1]],
            [[1, 0, 0], [0, 1, 1]],
            [[1, 1, 1], [0, 1, 0]],
        ],
        dtype=torch.bool,
    )


def test_labels_round_trip():
    assert head_labels(2, 2) == ["L0.H0", "L0.H1", "L1.H0", "L1.H1"]
    assert parse_head_label("L11.H3") == (11, 3)
    # one vocabulary: "2.5" was read here and refused by Component.parse (a heuristic-core
    # config took it for attention heads and refused it for ablation sets)
    for bad in ("2.5", "layer two", "L2.MLP"):
        with pytest.raises(ConfigError, match="expected 'L<layer>.H<head>'"):
            parse_head_label(bad)


def test_frequency_and_counts():
    m = _masks()
    assert head_counts(m).tolist() == [[3, 2, 1], [0, 3, 2]]
    freq = head_frequency(m)
    assert freq.shape == (2, 3)
    assert torch.allclose(freq, torch.tensor([[1, 2 / 3, 1 / 3], [0, 1, 2 / 3]]))
    # A list of 0/1 float masks works the same.
    assert torch.equal(head_frequency([x.float() for x in m]), freq)


def test_core_heads_sorted_and_grouped():
    m = _masks()
    assert core_heads(m) == ["L0.H0", "L1.H1"]
    other = torch.tensor([[[1, 0, 0], [1, 0, 0]], [[1, 0, 1], [1, 1, 0]]], dtype=torch.bool)
    groups = core_heads_by_group({0.5: m, 0.7: other})
    assert groups[0.5] == ["L0.H0", "L1.H1"]
    assert groups[0.7] == ["L0.H0", "L1.H0"]
    assert groups["all"] == ["L0.H0"]
    with pytest.raises(ConfigError):
        core_heads_by_group({0.5: m, 0.7: torch.ones(2, 3, 3, dtype=torch.bool)})


def test_masks_from_labels_and_tables():
    m = masks_from_labels([["L0.H0", "L1.H2"], ["L0.H0"]], 2, 3)
    assert core_heads(m) == ["L0.H0"]
    table = subnetwork_table(m, names=["a", "b"], sparsity=0.5)
    assert len(table) == 2 * 6
    assert table.loc[(table.subnetwork == "a") & (table.label == "L1.H2"), "kept"].item()
    assert not table.loc[(table.subnetwork == "b") & (table.label == "L1.H2"), "kept"].item()
    assert (table.sparsity == 0.5).all()
    freq = frequency_table({50: _masks(), 70: m})
    assert list(freq.columns) == [
        "layer",
        "head",
        "label",
        "count_50",
        "freq_50",
        "count_70",
        "freq_70",
    ]
    assert freq.set_index("label").loc["L0.H1", "count_50"] == 2
    with pytest.raises(ConfigError):
        masks_from_labels([["L5.H0"]], 2, 3)


def test_spearman_matches_scipy_and_is_one_for_monotone_maps():
    gen = torch.Generator().manual_seed(0)
    a = torch.rand(12, 12, generator=gen)
    b = a**2 + 0.0  # monotone transform: rho = 1
    rho, p = frequency_spearman(a, b)
    assert rho == pytest.approx(1.0)
    assert p < 1e-30
    c = torch.rand(12, 12, generator=gen)
    rho, p = frequency_spearman(a, c)
    ref = spearmanr(a.flatten().numpy(), c.flatten().numpy())
    assert rho == pytest.approx(ref.statistic)
    assert p == pytest.approx(ref.pvalue)
    assert all(math.isnan(x) for x in frequency_spearman(torch.ones(4), torch.rand(4)))


def test_expected_random_intersection_paper_number():
    # Paper: 12 random 70 %-sparsity subnetworks of BERT-base's 144 heads share 7.7e-5 heads.
    value = expected_random_intersection(144, 0.3 * 144, 12)
    assert value == pytest.approx(144 * 0.3**12)
    assert value == pytest.approx(7.65e-5, rel=1e-3)
    assert f"{value:.1e}" == "7.7e-05"
    assert expected_random_intersection(10, 10, 5) == 10  # keep everything: all shared
    assert expected_random_intersection(10, 4, 0) == 10
    with pytest.raises(ConfigError):
        expected_random_intersection(10, 11, 2)


def test_expected_random_intersection_matches_simulation():
    rng = np.random.default_rng(0)
    n, m, k, trials = 20, 10, 3, 4000
    total = 0
    for _ in range(trials):
        keep = np.ones(n, dtype=bool)
        for _ in range(k):
            mask = np.zeros(n, dtype=bool)
            mask[rng.choice(n, m, replace=False)] = True
            keep &= mask
        total += keep.sum()
    assert total / trials == pytest.approx(expected_random_intersection(n, m, k), rel=0.05)


def test_frequency_heatmap_counts():
    a = _masks()  # counts [[3,2,1],[0,3,2]], k_a = 3
    b = torch.tensor([[[1, 0, 0], [0, 1, 1]], [[1, 0, 0], [1, 1, 0]]], dtype=torch.bool)
    # counts b: [[2,0,0],[1,2,1]], k_b = 2
    heat = frequency_heatmap(a, b)
    assert heat.shape == (4, 3)
    assert heat.sum().item() == 6
    expected = torch.zeros(4, 3, dtype=torch.long)
    for ca, cb in [(3, 2), (2, 0), (1, 0), (0, 1), (3, 2), (2, 1)]:
        expected[ca, cb] += 1
    assert torch.equal(heat, expected)
    # The corner is the size of the core shared by every subnetwork of both groups.
    assert heat[-1, -1].item() == len(core_heads(torch.cat([a, b])))
    with pytest.raises(ConfigError):
        frequency_heatmap(a, torch.ones(2, 3, 3, dtype=torch.bool))


def test_frequency_heatmap_figure(tmp_path):
    from mi_core.viz import frequency_heatmap_figure, write_figure_html

    heat = frequency_heatmap(_masks(), _masks()[:2])
    fig = frequency_heatmap_figure(heat, label_a="50%", label_b="70%")
    assert len(fig.data) == 1 and fig.data[0].type == "heatmap"
    assert np.array_equal(np.asarray(fig.data[0].z), heat.numpy())
    assert list(fig.data[0].x) == [0, 1, 2] and list(fig.data[0].y) == [0, 1, 2, 3]
    assert "70%" in fig.layout.xaxis.title.text and "50%" in fig.layout.yaxis.title.text
    path = write_figure_html(fig, tmp_path / "fig5" / "heatmap.html")
    text = path.read_text()
    assert "plotly" in text and '<script src="https://cdn.plot.ly' not in text  # embedded
    cdn = write_figure_html(fig, tmp_path / "cdn.html", include_plotlyjs="cdn").read_text()
    assert len(cdn) < len(text) / 10
    assert not list(tmp_path.rglob("*.tmp"))
