"""Circuits: edge-level graphs, attribution (EAP, EAP-IG, exact patching), evaluation.

The graph and edge masks are interventions (:mod:`mi_core.interventions.edges`, re-exported
here); this package finds circuits in them and judges them::

    from mi_core.circuits import attribute, faithfulness_curve
    pairs = ioi_pairs(model.tokenizer, n=64)
    scores = attribute(model, pairs, method="eap-ig")
    circuit = scores.circuit(k=500)              # an EdgeMask of (at most) 500 top edges
"""

from typing import TYPE_CHECKING

from mi_core.lazy import lazy_exports

if TYPE_CHECKING:
    from mi_core.circuits.analysis import circuit_overlap, edges_touching
    from mi_core.circuits.attribution import (
        ATTRIBUTION_METHODS,
        EdgeScores,
        attribute,
        circuit_order,
        edge_attribution,
        exact_patching,
        select_circuit,
    )
    from mi_core.circuits.dla import DirectLogitAttribution, direct_logit_attribution
    from mi_core.circuits.evaluate import (
        CURVE_FRACTIONS,
        CircuitScore,
        circuit_baselines,
        curve_area,
        curve_difference,
        evaluate_circuit,
        faithfulness_curve,
        gap_is_small,
        to_mib,
        write_mib,
    )
    from mi_core.circuits.job import pair_sender_means
    from mi_core.circuits.metrics import (
        answer_accuracy,
        answer_logits,
        kl_divergence,
        logit_difference,
        metric_logits,
        reads_answer_logits,
    )
    from mi_core.circuits.mib import (
        MIB_PERCENTAGES,
        MIBScore,
        mib_areas,
        mib_circuits,
        mib_difference,
        mib_score,
        select_mib_circuits,
    )
    from mi_core.circuits.nodes import NodeScores, load_scores
    from mi_core.circuits.prune import EdgePruneResult, EdgePruneSettings, prune_edges
    from mi_core.circuits.refine import circuit_gradient, refine_circuit, refine_mib_circuits
    from mi_core.circuits.stability import CircuitStability, circuit_stability
    from mi_core.interventions.edges import (
        EdgeMask,
        Graph,
        graph_error,
        node_outputs,
        sender_means,
        to_mib_name,
    )

#: Public name -> the module that defines it (imported on first use).
_NAMES = {
    "MIB_PERCENTAGES": "mi_core.circuits.mib",
    "MIBScore": "mi_core.circuits.mib",
    "mib_areas": "mi_core.circuits.mib",
    "mib_circuits": "mi_core.circuits.mib",
    "mib_difference": "mi_core.circuits.mib",
    "mib_score": "mi_core.circuits.mib",
    "select_mib_circuits": "mi_core.circuits.mib",
    "circuit_gradient": "mi_core.circuits.refine",
    "refine_circuit": "mi_core.circuits.refine",
    "refine_mib_circuits": "mi_core.circuits.refine",
    "NodeScores": "mi_core.circuits.nodes",
    "load_scores": "mi_core.circuits.nodes",
    "CircuitStability": "mi_core.circuits.stability",
    "circuit_stability": "mi_core.circuits.stability",
    "circuit_overlap": "mi_core.circuits.analysis",
    "edges_touching": "mi_core.circuits.analysis",
    "ATTRIBUTION_METHODS": "mi_core.circuits.config",
    "EdgeScores": "mi_core.circuits.attribution",
    "attribute": "mi_core.circuits.attribution",
    "circuit_order": "mi_core.circuits.attribution",
    "edge_attribution": "mi_core.circuits.attribution",
    "exact_patching": "mi_core.circuits.attribution",
    "select_circuit": "mi_core.circuits.attribution",
    "CURVE_FRACTIONS": "mi_core.circuits.config",
    "CircuitScore": "mi_core.circuits.evaluate",
    "DirectLogitAttribution": "mi_core.circuits.dla",
    "direct_logit_attribution": "mi_core.circuits.dla",
    "circuit_baselines": "mi_core.circuits.evaluate",
    "curve_area": "mi_core.circuits.evaluate",
    "curve_difference": "mi_core.circuits.evaluate",
    "evaluate_circuit": "mi_core.circuits.evaluate",
    "faithfulness_curve": "mi_core.circuits.evaluate",
    "gap_is_small": "mi_core.circuits.evaluate",
    "to_mib": "mi_core.circuits.evaluate",
    "write_mib": "mi_core.circuits.evaluate",
    "answer_logits": "mi_core.circuits.metrics",
    "answer_accuracy": "mi_core.circuits.metrics",
    "kl_divergence": "mi_core.circuits.metrics",
    "logit_difference": "mi_core.circuits.metrics",
    "metric_logits": "mi_core.circuits.metrics",
    "reads_answer_logits": "mi_core.circuits.metrics",
    "EdgePruneResult": "mi_core.circuits.prune",
    "EdgePruneSettings": "mi_core.circuits.config",
    "prune_edges": "mi_core.circuits.prune",
    "EdgeMask": "mi_core.interventions.edges",
    "Graph": "mi_core.interventions.edges",
    "graph_error": "mi_core.interventions.edges",
    "node_outputs": "mi_core.interventions.edges",
    "sender_means": "mi_core.interventions.edges",
    "pair_sender_means": "mi_core.circuits.job",
    "to_mib_name": "mi_core.interventions.edges",
}
__getattr__, __dir__ = lazy_exports(__name__, _NAMES)


__all__ = [
    "ATTRIBUTION_METHODS",
    "CURVE_FRACTIONS",
    "CircuitScore",
    "DirectLogitAttribution",
    "direct_logit_attribution",
    "circuit_baselines",
    "circuit_overlap",
    "edges_touching",
    "curve_area",
    "curve_difference",
    "evaluate_circuit",
    "faithfulness_curve",
    "gap_is_small",
    "to_mib",
    "write_mib",
    "MIB_PERCENTAGES",
    "MIBScore",
    "mib_areas",
    "mib_circuits",
    "mib_difference",
    "mib_score",
    "select_mib_circuits",
    "circuit_gradient",
    "refine_circuit",
    "refine_mib_circuits",
    "CircuitStability",
    "circuit_stability",
    "NodeScores",
    "load_scores",
    "EdgeMask",
    "EdgePruneResult",
    "EdgePruneSettings",
    "EdgeScores",
    "prune_edges",
    "Graph",
    "answer_logits",
    "attribute",
    "circuit_order",
    "edge_attribution",
    "exact_patching",
    "select_circuit",
    "graph_error",
    "answer_accuracy",
    "kl_divergence",
    "logit_difference",
    "metric_logits",
    "reads_answer_logits",
    "node_outputs",
    "sender_means",
    "pair_sender_means",
    "to_mib_name",
]
