"""Circuits: edge-level graphs, attribution (EAP, EAP-IG, exact patching), evaluation.

The graph and edge masks are interventions (:mod:`mi_core.interventions.edges`, re-exported
here); this package finds circuits in them and judges them::

    from mi_core.circuits import attribute, faithfulness_curve
    pairs = ioi_pairs(model.tokenizer, n=64)
    scores = attribute(model, pairs, method="eap-ig")
    circuit = scores.circuit(k=500)              # an EdgeMask of the 500 top edges
"""

from mi_core.circuits.analysis import circuit_overlap, edges_touching
from mi_core.circuits.attribution import (
    ATTRIBUTION_METHODS,
    EdgeScores,
    attribute,
    edge_attribution,
    exact_patching,
    select_circuit,
)
from mi_core.circuits.evaluate import (
    CURVE_FRACTIONS,
    CircuitScore,
    curve_area,
    evaluate_circuit,
    faithfulness_curve,
    to_mib,
    write_mib,
)
from mi_core.circuits.metrics import answer_logits, kl_divergence, logit_difference
from mi_core.circuits.prune import EdgePruneResult, EdgePruneSettings, prune_edges
from mi_core.interventions.edges import (
    EdgeMask,
    Graph,
    graph_error,
    node_outputs,
    sender_means,
    to_mib_name,
)

__all__ = [
    "ATTRIBUTION_METHODS",
    "CURVE_FRACTIONS",
    "CircuitScore",
    "circuit_overlap",
    "edges_touching",
    "curve_area",
    "evaluate_circuit",
    "faithfulness_curve",
    "to_mib",
    "write_mib",
    "EdgeMask",
    "EdgePruneResult",
    "EdgePruneSettings",
    "EdgeScores",
    "prune_edges",
    "Graph",
    "answer_logits",
    "attribute",
    "edge_attribution",
    "exact_patching",
    "select_circuit",
    "graph_error",
    "kl_divergence",
    "logit_difference",
    "node_outputs",
    "sender_means",
    "to_mib_name",
]
