"""The pruning constants a config names (gate parameters, rule and executor names): plain
Python, so a job's config, and ``mi-core prune --help``, import no torch."""

from __future__ import annotations

import math

from mi_core.errors import ConfigError

__all__ = [
    "BETA",
    "DISCRETIZE_RULES",
    "DROPRATE_INIT",
    "EXECUTORS",
    "PAPER_INIT_MEAN",
    "PAPER_INIT_STD",
    "SPARSITY_ESTIMATES",
    "check_ray_gpus",
    "initial_log_alpha",
]


#: The hard-concrete temperature (Louizos et al. 2018; CoFi and the authors use 2/3).
BETA = 2.0 / 3.0
#: The interval ``[l, r]`` a hard-concrete sample is stretched to before the clamp to [0, 1].
LIMIT_LEFT = -0.1
LIMIT_RIGHT = 1.1
#: CoFi's initial drop rate: every gate starts at log(0.99 / 0.01) (:func:`initial_log_alpha`).
DROPRATE_INIT = 0.01
#: The authors' initialisation (princeton-nlp/Heuristic-Core): log_alpha ~ N(10, 0.01) per gate.
PAPER_INIT_MEAN = 10.0
PAPER_INIT_STD = 0.01


def initial_log_alpha(droprate_init: float = DROPRATE_INIT) -> float:
    """The log_alpha at which a gate starts: ``log(1 - droprate_init) - log(droprate_init)``.

    This is CoFi's initialisation (CoFi draws around it with std 0.01; the ``cofi`` profile starts
    every component at exactly this value). With the default
    ``droprate_init = 0.01`` it is ``log 99 ~ 4.6``: the eval value of every gate is exactly 1
    (``sigmoid(4.6) * 1.2 - 0.1 ~ 1.09``, clamped), the probability of a non-zero sample is
    ``~0.998`` (so the expected L0 is ``~n``), and about 95 % of training samples are exactly 1.
    """
    if not 0.0 < droprate_init < 1.0:
        raise ConfigError(f"droprate_init must lie in (0, 1), got {droprate_init}")
    return math.log(1.0 - droprate_init) - math.log(droprate_init)


#: How learnt gates become a binary mask.
DISCRETIZE_RULES = ("reference", "exact")
#: How the Lagrangian term measures the current sparsity ``t``.
SPARSITY_ESTIMATES = ("sampled", "expected")
#: Where the runs of a sweep execute (mi_core.pruning.sweeps.run_sweep).
EXECUTORS = ("local", "batched", "ray")


def check_ray_gpus(executor: str, device: str, num_gpus_per_run: float) -> None:
    """Refuse a CUDA device for Ray tasks that ask for no GPU (Ray would hide it from them)."""
    if executor == "ray" and device.startswith("cuda") and num_gpus_per_run <= 0:
        raise ConfigError(
            f"--device {device} with --executor ray needs --num-gpus-per-run > 0 (Ray gives a "
            "task no GPU otherwise); or use --device auto"
        )


#: The objectives a mask learns against (:data:`mi_core.pruning.objectives.OBJECTIVES`, the
#: registry this must list; here so that a config is built without torch): ``auto`` picks by
#: the training data's kind.
AUTO_OBJECTIVE = "auto"
OBJECTIVE_NAMES = (AUTO_OBJECTIVE, "answer_kl", "every_position_kl", "logit_diff", "separate")
#: What the ``separate`` objective minimises on the cripple text (mi_core.pruning.objectives).
CRIPPLE_TERMS = ("uniform", "capped")
