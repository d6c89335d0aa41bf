"""Figures (plotly) and attention views (circuitsvis), written as offline HTML."""

from mi_core.viz.attention_html import (
    attention_view_fragment,
    attention_view_html,
    write_attention_html,
)
from mi_core.viz.circuits import circuit_graph_figure, circuit_graph_html, faithfulness_figure
from mi_core.viz.figures import (
    accuracy_vs_sparsity,
    attention_class_chart,
    effective_size_over_training,
    frequency_heatmap_figure,
    id_vs_ood_scatter,
    subcase_bars,
    subnetworks_figure,
    training_dynamics,
    write_figure_html,
)
from mi_core.viz.separability import score_distribution_figure, trajectory_figure

__all__ = [
    "accuracy_vs_sparsity",
    "attention_class_chart",
    "attention_view_fragment",
    "attention_view_html",
    "circuit_graph_figure",
    "circuit_graph_html",
    "effective_size_over_training",
    "faithfulness_figure",
    "frequency_heatmap_figure",
    "id_vs_ood_scatter",
    "score_distribution_figure",
    "subcase_bars",
    "subnetworks_figure",
    "training_dynamics",
    "trajectory_figure",
    "write_attention_html",
    "write_figure_html",
]
