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

from typing import TYPE_CHECKING

from mi_core.lazy import lazy_exports

if TYPE_CHECKING:
    from mi_core.analysis.attention_patterns import (
        ALL_CLASSES,
        DECODER_CLASSES,
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

#: Public name -> the module that defines it (imported on first use).
_NAMES = {
    "ALL_CLASSES": "mi_core.analysis.attention_patterns",
    "DECODER_CLASSES": "mi_core.analysis.attention_patterns",
    "PATTERN_CLASSES": "mi_core.analysis.attention_patterns",
    "AttentionPatternScores": "mi_core.analysis.attention_patterns",
    "PatternMassSums": "mi_core.analysis.attention_patterns",
    "class_key_masks": "mi_core.analysis.attention_patterns",
    "classify_heads": "mi_core.analysis.attention_patterns",
    "pattern_masses": "mi_core.analysis.attention_patterns",
    "score_attention_patterns": "mi_core.analysis.attention_patterns",
    "segment_ids_from_sep": "mi_core.analysis.attention_patterns",
    "TARGETS": "mi_core.analysis.effective_size",
    "effective_size": "mi_core.analysis.effective_size",
    "faithfulness_table": "mi_core.analysis.effective_size",
    "as_masks": "mi_core.analysis.subnetworks",
    "core_heads": "mi_core.analysis.subnetworks",
    "core_heads_by_group": "mi_core.analysis.subnetworks",
    "expected_random_intersection": "mi_core.analysis.subnetworks",
    "frequency_heatmap": "mi_core.analysis.subnetworks",
    "frequency_spearman": "mi_core.analysis.subnetworks",
    "frequency_table": "mi_core.analysis.subnetworks",
    "head_counts": "mi_core.analysis.subnetworks",
    "head_frequency": "mi_core.analysis.subnetworks",
    "head_label": "mi_core.analysis.subnetworks",
    "head_labels": "mi_core.analysis.subnetworks",
    "masks_from_labels": "mi_core.analysis.subnetworks",
    "parse_head_label": "mi_core.analysis.subnetworks",
    "subnetwork_table": "mi_core.analysis.subnetworks",
    "MODES": "mi_core.analysis.trajectory",
    "relative_performance": "mi_core.analysis.trajectory",
    "separability_area": "mi_core.analysis.trajectory",
    "separability_percent": "mi_core.analysis.trajectory",
    "trajectory_areas": "mi_core.analysis.trajectory",
    "trajectory_axes": "mi_core.analysis.trajectory",
}
__getattr__, __dir__ = lazy_exports(__name__, _NAMES)


__all__ = [
    "MODES",
    "ALL_CLASSES",
    "DECODER_CLASSES",
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
