"""Activation statistics of neurons on a data set, and the scores that compare two data sets.

From the separability report (seed 003): :mod:`~mi_core.statistics.activations` streams
per-neuron statistics of every MLP neuron and attention pre-out neuron (frequency of positive
activation, mean, mean absolute value, standard deviation, ...); :mod:`~mi_core.statistics.scoring`
turns a *cripple* and a *focus* data set's statistics into a score per neuron or head and picks
the top fraction to prune.
"""

from typing import TYPE_CHECKING

from mi_core.lazy import lazy_exports

if TYPE_CHECKING:
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

#: Public name -> the module that defines it (imported on first use).
_NAMES = {
    "SITES": "mi_core.statistics.activations",
    "STATISTICS": "mi_core.statistics.activations",
    "ActivationStats": "mi_core.statistics.activations",
    "NeuronStats": "mi_core.statistics.activations",
    "collect_activation_stats": "mi_core.statistics.activations",
    "HEAD_AGGREGATIONS": "mi_core.statistics.scoring",
    "SCHEDULES": "mi_core.statistics.scoring",
    "SCORINGS": "mi_core.statistics.scoring",
    "head_scores": "mi_core.statistics.scoring",
    "n_to_prune": "mi_core.statistics.scoring",
    "neuron_scores": "mi_core.statistics.scoring",
    "random_scores": "mi_core.statistics.scoring",
    "score_ratio": "mi_core.statistics.scoring",
    "select_top": "mi_core.statistics.scoring",
    "statistic_for": "mi_core.statistics.scoring",
}
__getattr__, __dir__ = lazy_exports(__name__, _NAMES)


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
