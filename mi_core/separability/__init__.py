"""Separability of capabilities: prune what one data set uses more than another, and measure.

From the separability report (seed 003): collect activation statistics of every MLP neuron and
attention pre-out neuron on a *focus* and a *cripple* data set (:mod:`.stats`), score neurons by
the cripple/focus ratio of a statistic (:mod:`.scoring`), prune the top fraction iteratively
(:mod:`.prune`, removal by hooks or by weight editing in :mod:`.masks`, optional OV-circuit SVD
in :mod:`.svd`), evaluate next-token metrics on held-out tokens (:mod:`.metrics`) and summarise
the trajectory by its area (:mod:`.trajectory`); figures in :mod:`.figures`.

Three lines from saved masks to a pruned model::

    masks = PruneMasks.load("masks.safetensors")
    with model.hooks(fwd_hooks=masks.hooks(model)): logits = model(tokens)
    zero_pruned_weights(model, masks)  # or for good, in the weights
"""

from mi_core.separability.figures import score_distribution_figure, trajectory_figure
from mi_core.separability.masks import PruneMasks, is_grouped_query, zero_pruned_weights
from mi_core.separability.metrics import METRICS, evaluate_next_token, most_frequent_tokens
from mi_core.separability.prune import (
    SeparabilityConfig,
    SeparabilityResult,
    TaskTokens,
    run_separability,
)
from mi_core.separability.scoring import (
    HEAD_AGGREGATIONS,
    SCORINGS,
    head_scores,
    n_to_prune,
    neuron_scores,
    random_scores,
    score_ratio,
    select_top,
    statistic_for,
)
from mi_core.separability.stats import (
    SITES,
    STATISTICS,
    ActivationStats,
    NeuronStats,
    collect_activation_stats,
)
from mi_core.separability.svd import svd_attention
from mi_core.separability.trajectory import (
    MODES,
    relative_performance,
    separability_area,
    separability_percent,
    trajectory_areas,
    trajectory_axes,
)

__all__ = [
    "HEAD_AGGREGATIONS",
    "METRICS",
    "MODES",
    "SCORINGS",
    "SITES",
    "STATISTICS",
    "ActivationStats",
    "NeuronStats",
    "PruneMasks",
    "SeparabilityConfig",
    "SeparabilityResult",
    "TaskTokens",
    "collect_activation_stats",
    "evaluate_next_token",
    "head_scores",
    "is_grouped_query",
    "most_frequent_tokens",
    "n_to_prune",
    "neuron_scores",
    "random_scores",
    "relative_performance",
    "run_separability",
    "score_distribution_figure",
    "score_ratio",
    "select_top",
    "separability_area",
    "separability_percent",
    "statistic_for",
    "svd_attention",
    "trajectory_areas",
    "trajectory_axes",
    "trajectory_figure",
    "zero_pruned_weights",
]
