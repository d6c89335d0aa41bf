"""mi_core: subnetwork analysis and separability of capabilities on TransformerLens.

The names a notebook needs, importable from here::

    from mi_core import load_model, load_pairs, pair_batches, evaluate
    from mi_core import ComponentMask, Subnetwork, apply, compute_means, prune, sweep
    from mi_core import heuristic_core, separability, circuits, viz   # methods and figures

Everything is imported lazily: ``import mi_core`` is instant, and the first use of a name
imports its module (TransformerLens takes seconds), so the command line fails fast.
"""

from __future__ import annotations

import importlib
from typing import Any

#: The package's version: the one source that pyproject.toml, ``mi-core --version`` and
#: the built distributions read.
__version__ = "0.1.0"

#: Public name -> the module that defines it.
_NAMES: dict[str, str] = {
    # models and data
    "load_model": "mi_core.models",
    "load_pairs": "mi_core.data",
    "pair_batches": "mi_core.data",
    "token_windows": "mi_core.data",
    "evaluate": "mi_core.evaluation",
    "FinetuneConfig": "mi_core.training",
    "finetune": "mi_core.training",
    "walkthrough_classifier": "mi_core.training",
    # interventions
    "ComponentMask": "mi_core.interventions",
    "Subnetwork": "mi_core.interventions",
    "PruneMasks": "mi_core.interventions",
    "apply": "mi_core.interventions",
    "load_intervention": "mi_core.interventions",
    "ablate": "mi_core.interventions",
    "compute_means": "mi_core.interventions",
    "load_means": "mi_core.interventions",
    "ablation_table": "mi_core.interventions",
    # pruning
    "PruneConfig": "mi_core.pruning",
    "make_prune_config": "mi_core.pruning",
    "prune": "mi_core.pruning",
    "sweep": "mi_core.pruning.sweeps",
    "SweepResult": "mi_core.pruning",
    # the methods
    "ExperimentConfig": "mi_core.methods.heuristic_core",
    "run_heuristic_core": "mi_core.methods.heuristic_core",
    "compare_subnetworks": "mi_core.methods.heuristic_core",
    "SeparabilityConfig": "mi_core.methods.separability",
    "run_separability": "mi_core.methods.separability",
    "attention_view_html": "mi_core.viz",
    # circuits
    "Graph": "mi_core.interventions",
    "EdgeMask": "mi_core.interventions",
    "PromptPairs": "mi_core.data.circuit_pairs",
    "ioi_pairs": "mi_core.data.circuit_pairs",
    "hans_pairs": "mi_core.data.circuit_pairs",
    "make_tiny_checkpoint": "mi_core.testing",
}
#: Subpackages reachable as attributes (``mi_core.viz.subcase_bars``).
_MODULES: dict[str, str] = {
    "analysis": "mi_core.analysis",
    "data": "mi_core.data",
    "interventions": "mi_core.interventions",
    "pruning": "mi_core.pruning",
    "statistics": "mi_core.statistics",
    "viz": "mi_core.viz",
    "circuits": "mi_core.circuits",
    "heuristic_core": "mi_core.methods.heuristic_core",
    "separability": "mi_core.methods.separability",
}

__all__ = ["__version__", *_NAMES, *_MODULES]


def __getattr__(name: str) -> Any:
    if name in _NAMES:
        return getattr(importlib.import_module(_NAMES[name]), name)
    if name in _MODULES:
        return importlib.import_module(_MODULES[name])
    raise AttributeError(f"module 'mi_core' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
