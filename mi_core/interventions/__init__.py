"""Interventions: component masks and mean/zero ablation as hooks, means, ablation tables.

Three lines from a saved mask to an ablated model::

    mask = ComponentMask.load("mask.json")  # or ComponentMask.from_removed(model, "L2.H5")
    means = load_means("means.safetensors", model)  # checks the means are this model's
    with ablate(model, mask, means): logits = model(**batch)

See :mod:`~mi_core.interventions.mask`, :mod:`~mi_core.interventions.means`,
:mod:`~mi_core.interventions.ablation` and :mod:`~mi_core.interventions.ablation_table`.
"""

from mi_core.interventions.ablation import Ablation, ablate, interpolate, mask_hooks
from mi_core.interventions.ablation_table import (
    AblationLogits,
    AblationTable,
    ablation_logits,
    ablation_table,
    naive_ablation_logits,
    parse_head_set,
)
from mi_core.interventions.components import (
    Component,
    all_heads,
    format_components,
    parse_components,
)
from mi_core.interventions.mask import ComponentMask
from mi_core.interventions.means import (
    AVERAGING,
    ComponentMeans,
    compute_means,
    load_means,
)

__all__ = [
    "AVERAGING",
    "Ablation",
    "AblationLogits",
    "AblationTable",
    "Component",
    "ComponentMask",
    "ComponentMeans",
    "ablate",
    "ablation_logits",
    "ablation_table",
    "all_heads",
    "compute_means",
    "format_components",
    "interpolate",
    "load_means",
    "mask_hooks",
    "naive_ablation_logits",
    "parse_head_set",
    "parse_components",
]
