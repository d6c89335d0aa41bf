"""Model-independent analyses of pruned subnetworks and attention heads.

- :mod:`mi_core.analysis.subnetworks`: head frequencies, the shared core, Spearman agreement,
  chance-level intersections, the frequency heatmap (paper Figure 5);
- :mod:`mi_core.analysis.attention_patterns`: per-head attention mass on overlap / previous /
  next / separator / first / self tokens, and a pattern class per head (paper Figure 9);
- :mod:`mi_core.analysis.effective_size`: the largest faithful sparsity per checkpoint and
  evaluation target (paper Figure 6);
- :mod:`mi_core.analysis.trajectory`: a separability trajectory's relative performance and its
  separability area (the separability report).
"""

from mi_core.analysis.attention_patterns import (
    PATTERN_CLASSES,
    AttentionPatternScores,
    PatternMassSums,
    class_key_masks,
    classify_heads,
    pattern_masses,
    score_attention_patterns,
    segment_ids_from_sep,
)
from mi_core.analysis.effective_size import TARGETS, effective_size, faithfulness_table
from mi_core.analysis.subnetworks import (
    as_masks,
    core_heads,
    core_heads_by_group,
    expected_random_intersection,
    frequency_heatmap,
    frequency_spearman,
    frequency_table,
    head_counts,
    head_frequency,
    head_label,
    head_labels,
    masks_from_labels,
    parse_head_label,
    subnetwork_table,
)
from mi_core.analysis.trajectory import (
    MODES,
    relative_performance,
    separability_area,
    separability_percent,
    trajectory_areas,
    trajectory_axes,
)

__all__ = [
    "MODES",
    "PATTERN_CLASSES",
    "TARGETS",
    "AttentionPatternScores",
    "PatternMassSums",
    "as_masks",
    "class_key_masks",
    "classify_heads",
    "core_heads",
    "core_heads_by_group",
    "effective_size",
    "expected_random_intersection",
    "faithfulness_table",
    "frequency_heatmap",
    "frequency_spearman",
    "frequency_table",
    "head_counts",
    "head_frequency",
    "head_label",
    "head_labels",
    "masks_from_labels",
    "parse_head_label",
    "pattern_masses",
    "relative_performance",
    "score_attention_patterns",
    "segment_ids_from_sep",
    "separability_area",
    "separability_percent",
    "subnetwork_table",
    "trajectory_areas",
    "trajectory_axes",
]
