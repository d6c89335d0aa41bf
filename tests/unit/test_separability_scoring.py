"""Scores, head aggregation, selection, and trajectory areas."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from mi_core.analysis.trajectory import (
    relative_performance,
    separability_area,
    separability_percent,
    trajectory_areas,
)
from mi_core.errors import ConfigError
from mi_core.evaluation.next_token import METRICS, most_frequent_tokens
from mi_core.statistics.activations import STATISTICS, ActivationStats, NeuronStats
from mi_core.statistics.scoring import (
    SCORINGS,
    head_scores,
    n_to_prune,
    neuron_scores,
    random_scores,
    score_ratio,
    select_top,
    statistic_for,
)


def test_score_ratio_is_cripple_over_focus():
    focus = torch.tensor([1.0, 2.0, 0.0])
    cripple = torch.tensor([2.0, 1.0, 0.0])
    torch.testing.assert_close(score_ratio(focus, cripple, eps=0.0)[:2], torch.tensor([2.0, 0.5]))
    # the reference's cripple / (focus + eps): a neuron silent on both scores 0, not 1
    assert float(score_ratio(focus, cripple, eps=1e-6)[2]) == 0.0
    assert float(score_ratio(focus, cripple, eps=0.5)[0]) == pytest.approx(2.0 / 1.5)
    with pytest.raises(ConfigError):
        score_ratio(focus, cripple, eps=-1.0)


def test_every_scoring_maps_to_a_statistic():
    # one ratio scoring per statistic, plus the reference's difference of means
    assert set(SCORINGS) == set(STATISTICS) | {"mean_diff"}
    assert set(SCORINGS.values()) == set(STATISTICS)
    assert statistic_for("freq") == "freq" and statistic_for("abs") == "abs"
    assert statistic_for("mean_diff") == "mean"
    with pytest.raises(ConfigError):
        statistic_for("variance")


def test_neuron_scores_use_the_named_statistic():
    def stats(x):
        part = NeuronStats.zeros(1, (2,))
        part.update(0, x)
        return ActivationStats(mlp=part, attn=None)

    focus = stats(torch.tensor([[1.0, -1.0], [-1.0, -1.0]], dtype=torch.float64))
    cripple = stats(torch.tensor([[1.0, 1.0], [1.0, -1.0]], dtype=torch.float64))
    freq = neuron_scores(focus, cripple, "freq", eps=0.0)
    assert set(freq) == {"mlp"}
    # focus freq [0.5, 0]; cripple freq [1, 0.5]
    assert freq["mlp"][0, 0] == pytest.approx(2.0)
    assert neuron_scores(focus, cripple, "freq", eps=1e-6)["mlp"][0, 1] > 1e4
    # by default each site's reference eps, whatever the scoring: 1e-3 for MLP neurons
    assert neuron_scores(focus, cripple, "freq")["mlp"][0, 1] == pytest.approx(500.0)
    assert neuron_scores(focus, cripple, "abs")["mlp"][0, 1] == pytest.approx(1 / (1 + 1e-3))
    absolute = neuron_scores(focus, cripple, "abs", eps=0.0)["mlp"]
    torch.testing.assert_close(absolute, torch.ones(1, 2, dtype=torch.float64))


def test_the_reference_eps_orders_a_silent_neuron_below_a_selective_one():
    """freq with the reference's eps (1e-3, numerator without it): a neuron firing 3 times in
    1e5 code tokens and never on text ranks below a code-selective one (0.3 vs 0.01); with
    (c + 1e-6) / (f + 1e-6) it had ranked first (31 against 30)."""
    from mi_core.statistics.scoring import site_eps

    focus = torch.tensor([0.0, 0.01], dtype=torch.float64)
    cripple = torch.tensor([3e-5, 0.3], dtype=torch.float64)
    scores = score_ratio(focus, cripple, site_eps("mlp"))
    torch.testing.assert_close(scores, torch.tensor([0.03, 0.3 / 0.011], dtype=torch.float64))
    assert scores[1] > scores[0]
    # the reference's runs: ff_eps 1e-3, attn_eps 1e-4 (PruningConfig, examples/prune_30.py)
    assert site_eps("attn") == 1e-4 and site_eps("mlp", 0.5) == 0.5


def test_head_aggregation_mean_and_median_are_what_they_say():
    scores = torch.tensor([[[1.0, 2.0, 9.0], [3.0, 3.0, 3.0]]])
    as_f64 = lambda rows: torch.tensor(rows, dtype=torch.float64)
    torch.testing.assert_close(head_scores(scores, "mean"), as_f64([[4.0, 3.0]]))
    torch.testing.assert_close(head_scores(scores, "median"), as_f64([[2.0, 3.0]]))
    keep = torch.tensor([[[True, True, False], [True, True, True]]])
    torch.testing.assert_close(head_scores(scores, "mean", keep), as_f64([[1.5, 3.0]]))
    with pytest.raises(ConfigError):
        head_scores(scores, "max")


def test_random_scores_are_seeded():
    a, b, c = random_scores((3, 4), 1), random_scores((3, 4), 1), random_scores((3, 4), 2)
    torch.testing.assert_close(a, b)
    assert not torch.equal(a, c)


def test_select_top_is_global_and_skips_removed_units():
    scores = torch.tensor([[5.0, 1.0, 4.0], [3.0, 9.0, 2.0]])
    remaining = torch.tensor([[True, True, True], [True, False, True]])
    chosen, threshold = select_top(scores, remaining, 2)
    assert chosen.tolist() == [[True, False, True], [False, False, False]]
    assert threshold == 4.0
    nan_scores = torch.tensor([float("nan"), 1.0, 0.5])
    chosen, _ = select_top(nan_scores, torch.ones(3, dtype=torch.bool), 2)
    assert chosen.tolist() == [False, True, True]
    chosen, threshold = select_top(scores, remaining, 0)
    assert not chosen.any() and np.isnan(threshold)
    chosen, _ = select_top(scores, remaining, 100)  # capped at what remains
    assert torch.equal(chosen, remaining)


def test_n_to_prune_rounds_a_fraction_of_the_remaining():
    assert n_to_prune(1000, 0.05) == 50
    assert n_to_prune(950, 0.05) == 48
    assert n_to_prune(6, 0.25) == 2  # 1.5 rounds up
    assert n_to_prune(3, 0.0) == 0
    assert n_to_prune(3, 1.0) == 3
    with pytest.raises(ConfigError):
        n_to_prune(10, 1.5)


def test_area_of_the_diagonal_is_one():
    x = np.linspace(1, 0, 11)
    assert separability_area(x, x) == pytest.approx(1.0)
    assert separability_area([1.0, 0.5], [1.0, 0.5]) == pytest.approx(1.0)  # closed to (0, 0)
    assert separability_percent(1.0) == 0.0


def test_area_of_the_extreme_shapes_is_two_and_zero():
    # cripple task drops first at full focus performance, then focus goes
    assert separability_area([1, 0, 0], [1, 1, 0]) == pytest.approx(2.0)
    assert separability_area([1, 1, 0], [1, 0, 0]) == pytest.approx(0.0)
    # nearly extreme trajectories
    x = [1, 0.5, 0.02, 0.0]
    y = [1, 0.99, 0.97, 0.0]
    area = separability_area(x, y)
    assert 1.9 < area < 2.0
    assert separability_area(y, x) == pytest.approx(2.0 - area)  # mirrored about the diagonal
    assert separability_percent(area) == pytest.approx(abs(1 - area) * 100)
    assert separability_percent(0.3) == pytest.approx(70.0)


def test_area_clips_and_handles_nan():
    assert separability_area([1.0, 1.2, 0.0], [1.0, 1.3, 0.0]) == pytest.approx(1.0)
    assert np.isnan(separability_area([1.0, np.nan], [1.0, 0.5]))
    with pytest.raises(ConfigError):
        separability_area([1.0, 0.5], [1.0])


def test_relative_performance():
    np.testing.assert_allclose(relative_performance([0.5, 0.25, 0.0], "top1"), [1.0, 0.5, 0.0])
    np.testing.assert_allclose(relative_performance([2.0, 2.0 + np.log(2)], "loss"), [1.0, 0.5])


def _frame(focus_top1, cripple_top1):
    rows = []
    for step, (f, c) in enumerate(zip(focus_top1, cripple_top1, strict=True)):
        row = {"step": step}
        for metric in METRICS:
            row[f"focus_{metric}"] = f if "loss" not in metric else -np.log(f)
            row[f"cripple_{metric}"] = c if "loss" not in metric else -np.log(c)
        rows.append(row)
    return pd.DataFrame(rows)


def test_modes_orient_the_trajectory():
    # the cripple data set loses performance first: a successful "cripple" run
    frame = _frame([0.5, 0.49, 0.45, 0.3], [0.4, 0.1, 0.02, 0.01])
    cripple = trajectory_areas(frame, "cripple")
    focus = trajectory_areas(frame, "focus")
    assert cripple["top1"]["area"] > 1.5
    assert focus["top1"]["area"] == pytest.approx(2.0 - cripple["top1"]["area"])
    assert cripple["top1"]["separability_pct"] == pytest.approx(focus["top1"]["separability_pct"])
    assert cripple["loss"]["area"] > 1.0
    with pytest.raises(ConfigError):
        trajectory_areas(frame, "sideways")


def test_most_frequent_tokens_counts_real_tokens_only():
    tokens = torch.tensor([[5, 5, 5, 2, 2, 9], [7, 7, 7, 7, 0, 0]])
    mask = torch.tensor([[True] * 6, [True, True, True, True, False, False]])
    assert most_frequent_tokens(tokens, mask, k=3).tolist() == [7, 5, 2]
    assert most_frequent_tokens(tokens, None, k=2).tolist() == [7, 5]
    assert most_frequent_tokens(tokens, mask, k=50).numel() == 4
