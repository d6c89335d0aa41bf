"""Structured L0 pruning, model-independent core: gates, constraint, schedule, discretisation.

The pieces a training loop composes (one gate per attention head and per MLP layer)::

    gates = HardConcrete(n_layers * n_heads + n_layers)        # flat: heads, then MLPs
    controller = LagrangianController()
    optimizer = pruning_optimizer(gates.parameters(), controller, cfg.lr_log_alpha, cfg.lr_lambda)
    for step in range(cfg.steps):
        z = gates()                                            # sample (train) / eval value
        heads, mlps = unflatten_components(z, n_layers, n_heads)
        t = expected_sparsity(gates.prob_nonzero())
        s = target_sparsity_at(step, cfg.target_sparsity, cfg.warmup_steps)
        loss = task_loss(heads, mlps) + controller.penalty(t, s)
        optimizer.zero_grad(); loss.backward(); optimizer.step()
    mask, achieved = binary_mask_from_log_alpha(gates.log_alpha, cfg.target_sparsity)
"""

from mi_core.pruning.discretize import (
    AchievedSparsity,
    binary_mask_from_log_alpha,
    flatten_components,
    mask_sparsity,
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
from mi_core.pruning.lagrangian import (
    LagrangianController,
    component_weights,
    expected_sparsity,
    pruning_optimizer,
)
from mi_core.pruning.profiles import (
    PruneConfig,
    make_prune_config,
    parse_seeds,
    parse_sparsities,
)
from mi_core.pruning.schedule import paper_schedule, target_sparsity_at

__all__ = [
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
    "component_weights",
    "deterministic_hard_concrete",
    "expected_sparsity",
    "flatten_components",
    "hard_concrete_prob_nonzero",
    "initial_log_alpha",
    "make_prune_config",
    "mask_sparsity",
    "paper_schedule",
    "parse_seeds",
    "parse_sparsities",
    "pruning_optimizer",
    "sample_hard_concrete",
    "target_sparsity_at",
    "unflatten_components",
]

# The pruning run, its objective and sweeps (issue 4).
from mi_core.pruning.objective import PruningLoss, kl_to_reference, pruning_loss  # noqa: E402
from mi_core.pruning.reference_logits import (  # noqa: E402
    compute_reference_logits,
    load_reference_logits,
    reference_logits,
)
from mi_core.pruning.run import (  # noqa: E402
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
from mi_core.pruning.sweep import (  # noqa: E402
    SweepResult,
    SweepRun,
    auto_group_size,
    collect_subnetworks,
    load_sweep,
    plan_sweep,
    run_dir_for,
    run_sweep,
)

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
from mi_core.pruning.jobs import (  # noqa: E402
    PruneJobSettings,
    PruneRunConfig,
    SweepConfig,
    run_prune_job,
    run_sweep_job,
)

__all__ += ["PruneJobSettings", "PruneRunConfig", "SweepConfig", "run_prune_job", "run_sweep_job"]
