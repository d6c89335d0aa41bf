"""Figures (plotly) and attention views (circuitsvis), written as offline HTML."""

from typing import TYPE_CHECKING

from mi_core.lazy import lazy_exports

if TYPE_CHECKING:
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
        pruning_dynamics,
        subcase_bars,
        subnetworks_figure,
        training_dynamics,
        write_figure_html,
    )
    from mi_core.viz.separability import score_distribution_figure, trajectory_figure

#: Public name -> the module that defines it (imported on first use).
_NAMES = {
    "attention_view_fragment": "mi_core.viz.attention_html",
    "attention_view_html": "mi_core.viz.attention_html",
    "write_attention_html": "mi_core.viz.attention_html",
    "circuit_graph_figure": "mi_core.viz.circuits",
    "circuit_graph_html": "mi_core.viz.circuits",
    "faithfulness_figure": "mi_core.viz.circuits",
    "accuracy_vs_sparsity": "mi_core.viz.figures",
    "attention_class_chart": "mi_core.viz.figures",
    "effective_size_over_training": "mi_core.viz.figures",
    "frequency_heatmap_figure": "mi_core.viz.figures",
    "id_vs_ood_scatter": "mi_core.viz.figures",
    "pruning_dynamics": "mi_core.viz.figures",
    "subcase_bars": "mi_core.viz.figures",
    "subnetworks_figure": "mi_core.viz.figures",
    "training_dynamics": "mi_core.viz.figures",
    "write_figure_html": "mi_core.viz.figures",
    "score_distribution_figure": "mi_core.viz.separability",
    "trajectory_figure": "mi_core.viz.separability",
}
__getattr__, __dir__ = lazy_exports(__name__, _NAMES)


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
    "pruning_dynamics",
    "score_distribution_figure",
    "subcase_bars",
    "subnetworks_figure",
    "training_dynamics",
    "trajectory_figure",
    "write_attention_html",
    "write_figure_html",
]
