"""Structured L0 pruning, model-independent core: gates, constraint, schedule, discretisation.

The pieces a training loop composes (one gate per attention head and per MLP layer), with the
``paper`` profile's values (the authors' recipe; :func:`prune` runs exactly this, with the
gates' noise seeded per step, gradient clipping and checkpoints)::

    cfg = make_prune_config("paper", target_sparsity=0.5, seed=1)
    gates = make_gates(cfg, n_layers, n_heads)               # flat: heads, then MLPs
    controller = LagrangianController()
    optimizer = pruning_optimizer(gates.parameters(), controller, cfg.lr_log_alpha,
                                  cfg.lr_lambda, cfg.weight_decay, cfg.lambda_weight_decay)
    base = [group["lr"] for group in optimizer.param_groups]
    for step in range(cfg.steps):
        for group, lr in zip(optimizer.param_groups, base):
            group["lr"] = lr * lr_factor(step, cfg.lr_warmup_steps, cfg.steps, cfg.lr_schedule)
        z = gates()                                          # a sample (train mode)
        heads, mlps = unflatten_components(z, n_layers, n_heads)
        t = sampled_sparsity(z)                              # cfg.sparsity_estimate
        s = target_sparsity_at(step, cfg.target_sparsity, cfg.warmup_steps)
        loss = task_loss(heads, mlps) + controller.penalty(t, s)
        optimizer.zero_grad(); loss.backward(); optimizer.step()
    keep, achieved = discretize(gates.log_alpha, n_layers, n_heads, cfg.target_sparsity,
                                cfg.discretize)              # the authors' rule: "reference"
    gates.eval(); gates()                                    # the same subnetwork, as 0 / 1

The ``cofi`` profile swaps in :func:`expected_sparsity`, no weight decay, a constant rate and
:func:`binary_mask_from_log_alpha` (``discretize="exact"``).
"""

from typing import TYPE_CHECKING

from mi_core.lazy import lazy_exports

if TYPE_CHECKING:
    from mi_core.pruning.discretize import discretize, make_gates, unflatten_components
    from mi_core.pruning.hard_concrete import HardConcrete
    from mi_core.pruning.lagrangian import (
        LagrangianController,
        expected_sparsity,
        pruning_optimizer,
        sampled_sparsity,
    )
    from mi_core.pruning.profiles import PruneConfig, make_prune_config
    from mi_core.pruning.reference_logits import reference_logits
    from mi_core.pruning.run import PruneResult, prune, prune_group
    from mi_core.pruning.schedule import lr_factor, target_sparsity_at
    from mi_core.pruning.sweeps import SweepResult, collect_subnetworks, load_sweep, sweep

#: Public name -> the module that defines it (imported on first use). The rest of the pieces
#: (the hard-concrete constants, schedules, steps, run folders, jobs) are imported from their
#: modules: ``mi_core.pruning.hard_concrete``, ``.schedule``, ``.step``, ``.run_folder``, ...
_NAMES = {
    "PruneConfig": "mi_core.pruning.profiles",
    "make_prune_config": "mi_core.pruning.profiles",
    "prune": "mi_core.pruning.run",
    "prune_group": "mi_core.pruning.run",
    "sweep": "mi_core.pruning.sweeps",
    "PruneResult": "mi_core.pruning.run",
    "SweepResult": "mi_core.pruning.sweeps",
    "load_sweep": "mi_core.pruning.sweeps",
    "collect_subnetworks": "mi_core.pruning.sweeps",
    "HardConcrete": "mi_core.pruning.hard_concrete",
    "make_gates": "mi_core.pruning.discretize",
    "LagrangianController": "mi_core.pruning.lagrangian",
    "pruning_optimizer": "mi_core.pruning.lagrangian",
    "discretize": "mi_core.pruning.discretize",
    "sampled_sparsity": "mi_core.pruning.lagrangian",
    "expected_sparsity": "mi_core.pruning.lagrangian",
    "target_sparsity_at": "mi_core.pruning.schedule",
    "lr_factor": "mi_core.pruning.schedule",
    "unflatten_components": "mi_core.pruning.discretize",
    "reference_logits": "mi_core.pruning.reference_logits",
}
__getattr__, __dir__ = lazy_exports(__name__, _NAMES)

__all__ = [
    "PruneConfig",
    "make_prune_config",
    "prune",
    "prune_group",
    "sweep",
    "PruneResult",
    "SweepResult",
    "load_sweep",
    "collect_subnetworks",
    "HardConcrete",
    "make_gates",
    "LagrangianController",
    "pruning_optimizer",
    "discretize",
    "sampled_sparsity",
    "expected_sparsity",
    "target_sparsity_at",
    "lr_factor",
    "unflatten_components",
    "reference_logits",
]
