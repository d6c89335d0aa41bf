"""Activation statistics of neurons on a data set, and the scores that compare two data sets.

From the separability report (seed 003): :mod:`~mi_core.statistics.activations` streams
per-neuron statistics of every MLP neuron and attention pre-out neuron (frequency of positive
activation, mean, mean absolute value, standard deviation, ...); :mod:`~mi_core.statistics.scoring`
turns a *cripple* and a *focus* data set's statistics into a score per neuron or head and picks
the top fraction to prune.
"""

from mi_core.statistics.activations import (
    SITES,
    STATISTICS,
    ActivationStats,
    NeuronStats,
    collect_activation_stats,
)
from mi_core.statistics.scoring import (
    HEAD_AGGREGATIONS,
    SCHEDULES,
    SCORINGS,
    head_scores,
    n_to_prune,
    neuron_scores,
    random_scores,
    score_ratio,
    select_top,
    statistic_for,
)

__all__ = [
    "HEAD_AGGREGATIONS",
    "SCHEDULES",
    "SCORINGS",
    "SITES",
    "STATISTICS",
    "ActivationStats",
    "NeuronStats",
    "collect_activation_stats",
    "head_scores",
    "n_to_prune",
    "neuron_scores",
    "random_scores",
    "score_ratio",
    "select_top",
    "statistic_for",
]
