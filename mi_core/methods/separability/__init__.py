"""Separability of capabilities (the report on OPT / Galactica, seed 003), end to end.

Prune what a *cripple* data set uses more than a *focus* data set, step by step, and trace both
tasks' performance as a trajectory with a separability area, against random removal. The method
composes building blocks: activation statistics and scores (:mod:`mi_core.statistics`), neuron
masks and the OV-SVD rewrite (:mod:`mi_core.interventions`), next-token metrics
(:mod:`mi_core.evaluation`) and trajectory areas (:mod:`mi_core.analysis.trajectory`).

- :mod:`.config`: :class:`SeparabilityConfig`;
- :mod:`.run`: :func:`run_separability` (resumable, per step);
- :mod:`.job`: :func:`run_separability_job`, the whole job from one config (model and data);
- :mod:`.report`: the run's files (trajectory CSV, summary JSON, figures, masks).

Three lines from saved masks to a pruned model::

    masks = PruneMasks.load("masks.safetensors")
    with model.hooks(fwd_hooks=masks.hooks(model)): logits = model(tokens)
    zero_pruned_weights(model, masks)  # or for good, in the weights
"""

from typing import TYPE_CHECKING

from mi_core.lazy import lazy_exports

if TYPE_CHECKING:
    from mi_core.methods.separability.job import (
        load_separability_config,
        run_separability_job,
        separability_config_values,
        shipped_separability_configs,
    )
    from mi_core.methods.separability.learned import run_learned
    from mi_core.methods.separability.report import write_separability_outputs
    from mi_core.methods.separability.run import (
        SeparabilityConfig,
        SeparabilityResult,
        run_separability,
        separability_findings,
    )
    from mi_core.methods.separability.tokens import TaskTokens

#: Public name -> the module that defines it (imported on first use).
_NAMES = {
    "load_separability_config": "mi_core.methods.separability.job",
    "run_separability_job": "mi_core.methods.separability.job",
    "separability_config_values": "mi_core.methods.separability.job",
    "shipped_separability_configs": "mi_core.methods.separability.job",
    "write_separability_outputs": "mi_core.methods.separability.report",
    "SeparabilityConfig": "mi_core.methods.separability.config",
    "SeparabilityResult": "mi_core.methods.separability.run",
    "TaskTokens": "mi_core.methods.separability.tokens",
    "run_learned": "mi_core.methods.separability.learned",
    "run_separability": "mi_core.methods.separability.run",
    "separability_findings": "mi_core.methods.separability.run",
}
__getattr__, __dir__ = lazy_exports(__name__, _NAMES)


__all__ = [
    "SeparabilityConfig",
    "SeparabilityResult",
    "TaskTokens",
    "load_separability_config",
    "run_learned",
    "run_separability",
    "run_separability_job",
    "separability_config_values",
    "separability_findings",
    "shipped_separability_configs",
    "write_separability_outputs",
]
