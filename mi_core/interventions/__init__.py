"""Interventions: component and neuron masks, mean/zero ablation as hooks, means, ablation tables.

One abstraction (:mod:`~mi_core.interventions.base`): every intervention is plain data with
``hooks(model)`` and ``save(path)``, declares where its hooks go and what it claims, and
registers its kind (:func:`register_kind`) for :func:`load_intervention`; :func:`apply` puts any
number of them on a model::

    subnetwork = Subnetwork.load("subnetwork.safetensors")  # a mask with its means
    with apply(model, subnetwork, PruneMasks.load("masks.safetensors")):
        logits = model(**batch)

Three lines from a saved mask to an ablated model::

    mask = ComponentMask.load("mask.json")  # or ComponentMask.from_removed(model, "L2.H5")
    means = load_means("means.safetensors", model)  # checks the means are this model's
    with ablate(model, mask, means): logits = model(**batch)

Neuron masks (MLP neurons, attention pre-out neurons, whole heads; the separability report's
unit) are :class:`~mi_core.interventions.neurons.PruneMasks`; :mod:`~mi_core.interventions.svd`
rewrites attention in its OV-SVD basis so that its neurons are those directions.

See :mod:`~mi_core.interventions.mask`, :mod:`~mi_core.interventions.means`,
:mod:`~mi_core.interventions.ablation` and :mod:`~mi_core.interventions.ablation_table`.
"""

from typing import TYPE_CHECKING

from mi_core.lazy import lazy_exports

if TYPE_CHECKING:
    from mi_core.interventions.ablation import Fill, ablate, interpolate, mask_hooks
    from mi_core.interventions.ablation_table import (
        AblationLogits,
        AblationTable,
        AblationTableConfig,
        ablation_logits,
        ablation_table,
        naive_ablation_logits,
        parse_head_set,
        run_ablation_table,
    )
    from mi_core.interventions.base import (
        Intervention,
        apply,
        intervention_hooks,
        load_intervention,
    )
    from mi_core.interventions.components import (
        Component,
        all_heads,
        format_components,
        parse_components,
    )
    from mi_core.interventions.edges import (
        EdgeMask,
        Graph,
        graph_error,
        graph_switches,
        node_outputs,
        sender_means,
    )
    from mi_core.interventions.kinds import register_kind
    from mi_core.interventions.mask import ComponentMask
    from mi_core.interventions.means import (
        AVERAGING,
        ComponentMeans,
        MeansConfig,
        MeansSettings,
        compute_means,
        load_means,
        run_means,
    )
    from mi_core.interventions.neurons import PruneMasks, is_grouped_query, zero_pruned_weights
    from mi_core.interventions.subnetwork import Subnetwork
    from mi_core.interventions.svd import svd_attention

#: Public name -> the module that defines it (imported on first use).
_NAMES = {
    "Fill": "mi_core.interventions.ablation",
    "ablate": "mi_core.interventions.ablation",
    "interpolate": "mi_core.interventions.ablation",
    "mask_hooks": "mi_core.interventions.ablation",
    "AblationLogits": "mi_core.interventions.ablation_table",
    "AblationTable": "mi_core.interventions.ablation_table",
    "AblationTableConfig": "mi_core.interventions.config",
    "ablation_logits": "mi_core.interventions.ablation_table",
    "ablation_table": "mi_core.interventions.ablation_table",
    "naive_ablation_logits": "mi_core.interventions.ablation_table",
    "parse_head_set": "mi_core.interventions.ablation_table",
    "run_ablation_table": "mi_core.interventions.ablation_table",
    "Intervention": "mi_core.interventions.base",
    "apply": "mi_core.interventions.base",
    "intervention_hooks": "mi_core.interventions.base",
    "load_intervention": "mi_core.interventions.base",
    "Component": "mi_core.interventions.components",
    "all_heads": "mi_core.interventions.components",
    "format_components": "mi_core.interventions.components",
    "parse_components": "mi_core.interventions.components",
    "EdgeMask": "mi_core.interventions.edges",
    "Graph": "mi_core.interventions.edges",
    "graph_error": "mi_core.interventions.edges",
    "graph_switches": "mi_core.interventions.edges",
    "node_outputs": "mi_core.interventions.edges",
    "sender_means": "mi_core.interventions.edges",
    "register_kind": "mi_core.interventions.kinds",
    "ComponentMask": "mi_core.interventions.mask",
    "AVERAGING": "mi_core.interventions.means",
    "ComponentMeans": "mi_core.interventions.means",
    "MeansConfig": "mi_core.interventions.config",
    "MeansSettings": "mi_core.interventions.config",
    "compute_means": "mi_core.interventions.means",
    "load_means": "mi_core.interventions.means",
    "run_means": "mi_core.interventions.means",
    "PruneMasks": "mi_core.interventions.neurons",
    "is_grouped_query": "mi_core.interventions.neurons",
    "zero_pruned_weights": "mi_core.interventions.neurons",
    "Subnetwork": "mi_core.interventions.subnetwork",
    "svd_attention": "mi_core.interventions.svd",
}
__getattr__, __dir__ = lazy_exports(__name__, _NAMES)


__all__ = [
    "AVERAGING",
    "AblationLogits",
    "AblationTable",
    "AblationTableConfig",
    "PruneMasks",
    "Subnetwork",
    "Component",
    "ComponentMask",
    "ComponentMeans",
    "EdgeMask",
    "Fill",
    "Graph",
    "Intervention",
    "MeansConfig",
    "MeansSettings",
    "ablate",
    "ablation_logits",
    "ablation_table",
    "apply",
    "all_heads",
    "compute_means",
    "format_components",
    "graph_error",
    "graph_switches",
    "interpolate",
    "intervention_hooks",
    "is_grouped_query",
    "load_intervention",
    "load_means",
    "mask_hooks",
    "naive_ablation_logits",
    "node_outputs",
    "parse_head_set",
    "parse_components",
    "register_kind",
    "run_ablation_table",
    "run_means",
    "sender_means",
    "svd_attention",
    "zero_pruned_weights",
]
