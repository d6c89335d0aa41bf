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
    from mi_core.pruning.discretize import (
        AchievedSparsity,
        binary_mask_from_log_alpha,
        discretize,
        flatten_components,
        make_gates,
        mask_sparsity,
        reference_binary_mask,
        unflatten_components,
    )
    from mi_core.pruning.hard_concrete import (
        BETA,
        DROPRATE_INIT,
        EPS,
        LIMIT_LEFT,
        LIMIT_RIGHT,
        HardConcrete,
        deterministic_hard_concrete,
        hard_concrete_prob_nonzero,
        initial_log_alpha,
        sample_hard_concrete,
    )
    from mi_core.pruning.jobs import (
        PruneJobSettings,
        PruneRunConfig,
        SweepConfig,
        run_prune_job,
        run_sweep_job,
    )
    from mi_core.pruning.lagrangian import (
        LagrangianController,
        component_weights,
        expected_sparsity,
        pruning_optimizer,
        sampled_sparsity,
    )
    from mi_core.pruning.objective import PruningLoss, kl_to_reference, pruning_loss
    from mi_core.pruning.profiles import (
        PruneConfig,
        make_prune_config,
        parse_seed_spec,
        parse_sparsities,
    )
    from mi_core.pruning.reference_logits import (
        compute_reference_logits,
        load_reference_logits,
        reference_logits,
    )
    from mi_core.pruning.run import (
        PruneResult,
        StepMember,
        frozen,
        group_pruning_step,
        is_complete,
        prune,
        prune_group,
        prune_run,
        pruning_step,
    )
    from mi_core.pruning.schedule import lr_factor, paper_schedule, target_sparsity_at
    from mi_core.pruning.sweep import (
        SweepResult,
        SweepRun,
        auto_group_size,
        collect_subnetworks,
        load_sweep,
        plan_sweep,
        run_dir_for,
        run_sweep,
    )

#: Public name -> the module that defines it (imported on first use).
_NAMES = {
    "length_grouped_batches": "mi_core.data.batches",
    "AchievedSparsity": "mi_core.pruning.discretize",
    "binary_mask_from_log_alpha": "mi_core.pruning.discretize",
    "discretize": "mi_core.pruning.discretize",
    "reference_binary_mask": "mi_core.pruning.discretize",
    "flatten_components": "mi_core.pruning.discretize",
    "make_gates": "mi_core.pruning.discretize",
    "mask_sparsity": "mi_core.pruning.discretize",
    "unflatten_components": "mi_core.pruning.discretize",
    "BETA": "mi_core.pruning.hard_concrete",
    "DROPRATE_INIT": "mi_core.pruning.hard_concrete",
    "EPS": "mi_core.pruning.hard_concrete",
    "LIMIT_LEFT": "mi_core.pruning.hard_concrete",
    "LIMIT_RIGHT": "mi_core.pruning.hard_concrete",
    "HardConcrete": "mi_core.pruning.hard_concrete",
    "deterministic_hard_concrete": "mi_core.pruning.hard_concrete",
    "hard_concrete_prob_nonzero": "mi_core.pruning.hard_concrete",
    "initial_log_alpha": "mi_core.pruning.hard_concrete",
    "sample_hard_concrete": "mi_core.pruning.hard_concrete",
    "LagrangianController": "mi_core.pruning.lagrangian",
    "component_weights": "mi_core.pruning.lagrangian",
    "expected_sparsity": "mi_core.pruning.lagrangian",
    "pruning_optimizer": "mi_core.pruning.lagrangian",
    "sampled_sparsity": "mi_core.pruning.lagrangian",
    "PruneConfig": "mi_core.pruning.profiles",
    "make_prune_config": "mi_core.pruning.profiles",
    "parse_seed_spec": "mi_core.pruning.profiles",
    "parse_sparsities": "mi_core.pruning.profiles",
    "paper_schedule": "mi_core.pruning.schedule",
    "lr_factor": "mi_core.pruning.schedule",
    "target_sparsity_at": "mi_core.pruning.schedule",
    "PruningLoss": "mi_core.pruning.objective",
    "kl_to_reference": "mi_core.pruning.objective",
    "pruning_loss": "mi_core.pruning.objective",
    "compute_reference_logits": "mi_core.pruning.reference_logits",
    "load_reference_logits": "mi_core.pruning.reference_logits",
    "reference_logits": "mi_core.pruning.reference_logits",
    "PruneResult": "mi_core.pruning.run",
    "StepMember": "mi_core.pruning.run",
    "frozen": "mi_core.pruning.run",
    "group_pruning_step": "mi_core.pruning.run",
    "is_complete": "mi_core.pruning.run",
    "prune": "mi_core.pruning.run",
    "prune_group": "mi_core.pruning.run",
    "prune_run": "mi_core.pruning.run",
    "pruning_step": "mi_core.pruning.run",
    "SweepResult": "mi_core.pruning.sweep",
    "SweepRun": "mi_core.pruning.sweep",
    "auto_group_size": "mi_core.pruning.sweep",
    "collect_subnetworks": "mi_core.pruning.sweep",
    "load_sweep": "mi_core.pruning.sweep",
    "plan_sweep": "mi_core.pruning.sweep",
    "run_dir_for": "mi_core.pruning.sweep",
    "run_sweep": "mi_core.pruning.sweep",
    "PruneJobSettings": "mi_core.pruning.jobs",
    "PruneRunConfig": "mi_core.pruning.jobs",
    "SweepConfig": "mi_core.pruning.jobs",
    "run_prune_job": "mi_core.pruning.jobs",
    "run_sweep_job": "mi_core.pruning.jobs",
}
__getattr__, __dir__ = lazy_exports(__name__, _NAMES)


__all__ = [
    "length_grouped_batches",
    "BETA",
    "DROPRATE_INIT",
    "EPS",
    "LIMIT_LEFT",
    "LIMIT_RIGHT",
    "AchievedSparsity",
    "HardConcrete",
    "LagrangianController",
    "PruneConfig",
    "binary_mask_from_log_alpha",
    "discretize",
    "reference_binary_mask",
    "sampled_sparsity",
    "lr_factor",
    "component_weights",
    "deterministic_hard_concrete",
    "expected_sparsity",
    "flatten_components",
    "hard_concrete_prob_nonzero",
    "initial_log_alpha",
    "make_prune_config",
    "make_gates",
    "mask_sparsity",
    "paper_schedule",
    "parse_seed_spec",
    "parse_sparsities",
    "pruning_optimizer",
    "sample_hard_concrete",
    "target_sparsity_at",
    "unflatten_components",
]

# The pruning run, its objective and sweeps (issue 4).

__all__ += [
    "PruneResult",
    "PruningLoss",
    "frozen",
    "pruning_step",
    "group_pruning_step",
    "prune_group",
    "StepMember",
    "SweepResult",
    "SweepRun",
    "collect_subnetworks",
    "compute_reference_logits",
    "is_complete",
    "kl_to_reference",
    "load_reference_logits",
    "load_sweep",
    "plan_sweep",
    "prune",
    "prune_run",
    "pruning_loss",
    "reference_logits",
    "run_dir_for",
    "run_sweep",
    "auto_group_size",
]
# The in-memory sweep() is mi_core.pruning.sweep.sweep (``from mi_core import sweep``): the
# package attribute ``sweep`` stays the module.

# The pruning jobs (one config each; the mi-core prune and sweep commands).

__all__ += ["PruneJobSettings", "PruneRunConfig", "SweepConfig", "run_prune_job", "run_sweep_job"]
