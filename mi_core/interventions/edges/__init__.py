"""The computational graph of a hooked model, and edge masks as an intervention.

Public modules, each small and plain:

- :mod:`~mi_core.interventions.edges.graph`: :class:`Graph` (senders, receivers, edges; how
  post-LN encoders are made linear), the model switches a graph needs, edge orders, MIB names;
- :mod:`~mi_core.interventions.edges.recording`: every sender's output in a run
  (:func:`node_outputs`) and over a data set (:func:`sender_means`);
- :mod:`~mi_core.interventions.edges.mask`: :class:`EdgeMask`, data (weights, fill, means, a
  corrupted run) that saves, loads and applies like every intervention;
- :mod:`~mi_core.interventions.edges.output_mask`: :class:`OutputMask`, each sender's output
  kept or replaced dimension by dimension (MIB's neuron level);
- :mod:`~mi_core.interventions.edges.reference`: the masked forward written plainly.

The fused masked forward that :meth:`EdgeMask.hooks` runs lives in the private ``_engine``
and ``_kernels`` modules; ``circuits/`` calls the engine's internal API directly.
"""

from mi_core.interventions.config import FILLS
from mi_core.interventions.edges.graph import (
    SUPPORTED_GRAPHS,
    Graph,
    NodeOutputs,
    from_mib_name,
    frozen_output_norms,
    graph_switches,
    greedy_order,
    to_mib_name,
    top_k_order,
)
from mi_core.interventions.edges.mask import EDGE_MASK_KIND, EdgeMask, graph_error
from mi_core.interventions.edges.output_mask import OUTPUT_MASK_KIND, OutputMask
from mi_core.interventions.edges.recording import head_results, node_outputs, sender_means
from mi_core.interventions.edges.reference import reference_hooks

__all__ = [
    "EDGE_MASK_KIND",
    "FILLS",
    "SUPPORTED_GRAPHS",
    "EdgeMask",
    "Graph",
    "OUTPUT_MASK_KIND",
    "OutputMask",
    "NodeOutputs",
    "from_mib_name",
    "graph_error",
    "frozen_output_norms",
    "graph_switches",
    "greedy_order",
    "head_results",
    "node_outputs",
    "reference_hooks",
    "sender_means",
    "to_mib_name",
    "top_k_order",
]
