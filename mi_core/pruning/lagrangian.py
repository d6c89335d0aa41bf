"""The Lagrangian sparsity constraint: keep the expected sparsity of the gates at a target.

Following Wang et al. (2020) and CoFi, the loss gets the term::

    L_s = lambda1 * (t - s) + lambda2 * (t - s) ** 2

where ``t`` is the current sparsity and ``s`` the target (the paper's sign and CoFi's; the
authors' code writes ``s - t``, which is the same up to ``lambda1 -> -lambda1``). ``t`` is
measured one of two ways (:data:`SPARSITY_ESTIMATES`):

* ``"sampled"`` (the authors' code, princeton-nlp/Heuristic-Core): ``1 - sum(z) / n`` over the
  gates ``z`` sampled for this forward pass (:func:`sampled_sparsity`); the gradient reaches
  ``log_alpha`` only through fractional samples.
* ``"expected"`` (CoFi): the closed-form expected L0, ``1 - sum(P(z != 0)) / n``
  (:func:`expected_sparsity`). At ``log_alpha = 0`` it counts a gate as 17 % removed, where the
  sampled estimate counts it 50 % removed on average. The gates' ``log_alpha`` are trained
by gradient *descent* on the total loss and the lambdas by gradient *ascent* on the same loss.
:func:`pruning_optimizer` does both with one AdamW: the lambdas sit in their own parameter group
with ``maximize=True``. (CoFi uses a negative learning rate instead, which current torch rejects.)

Dynamics: ``dL/dlambda1 = t - s`` and ``dL/dlambda2 = (t - s) ** 2``. So while the model is less
sparse than the target (``t < s``) ascent *decreases* lambda1 (it turns negative), and then
``dL/dt = lambda1 + 2 * lambda2 * (t - s) < 0``: descent on ``log_alpha`` raises ``t``. When the
model overshoots (``t > s``) lambda1 rises again and pushes ``t`` back down. lambda2 only ever
grows (its gradient is a square), which stiffens the quadratic well around the target.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

import torch
from jaxtyping import Float
from torch import nn

from mi_core.errors import ConfigError
from mi_core.pruning.constants import SPARSITY_ESTIMATES  # noqa: F401 (re-exported)

SparsityWeighting = Literal["components", "params"]


def sampled_sparsity(
    z: Float[torch.Tensor, "*components"],
    weights: Float[torch.Tensor, "*components"] | None = None,
) -> Float[torch.Tensor, ""]:
    """``1 - sum(w * z) / sum(w)``: the fraction of (weighted) components a gate sample removes.

    The authors' Lagrangian measures sparsity this way, on each forward pass's sample
    (``1 - z_sum / num_alpha_params`` in their ``modeling_pert.py``). Differentiable wrt ``z``.
    """
    if weights is None:
        return 1.0 - z.mean()
    check_sparsity_weights(weights, z)
    weights = weights.to(z)
    return 1.0 - (weights * z).sum() / weights.sum()


def check_sparsity_weights(
    weights: Float[torch.Tensor, " components"], gates: Float[torch.Tensor, " components"]
) -> None:
    """Raise :class:`ConfigError` unless ``weights`` give each gate a non-negative weight with a
    positive total."""
    if weights.shape != gates.shape:
        raise ConfigError(
            f"sparsity weights have shape {tuple(weights.shape)} but the gates have shape "
            f"{tuple(gates.shape)}; pass one weight per component"
        )
    if bool((weights < 0).any()) or float(weights.sum()) <= 0:
        raise ConfigError("sparsity weights must be non-negative with a positive sum")


def expected_sparsity(
    prob_nonzero: Float[torch.Tensor, "*components"],
    weights: Float[torch.Tensor, "*components"] | None = None,
) -> Float[torch.Tensor, ""]:
    """``1 - sum(w * P(z != 0)) / sum(w)``: the expected fraction of (weighted) components removed.

    ``weights=None`` counts every component once (heads and MLPs equal, the paper's default);
    pass parameter counts (see :func:`component_weights`) to measure sparsity in parameters.
    """
    if weights is None:
        return 1.0 - prob_nonzero.mean()
    check_sparsity_weights(weights, prob_nonzero)
    weights = weights.to(prob_nonzero)
    return 1.0 - (weights * prob_nonzero).sum() / weights.sum()


def component_weights(
    n_layers: int,
    n_heads: int,
    weighting: SparsityWeighting = "components",
    *,
    d_model: int | None = None,
    d_head: int | None = None,
    d_mlp: int | None = None,
) -> Float[torch.Tensor, " n_components"]:
    """One weight per component in the flat order of
    :func:`~mi_core.pruning.discretize.flatten_components`.

    ``"components"``: every head and MLP weighs 1. ``"params"``: a head weighs its Q, K, V and O
    matrices (``4 * d_model * d_head``), an MLP its two matrices (``2 * d_model * d_mlp``);
    biases are left out.
    """
    n_components = n_layers * n_heads + n_layers
    if n_layers <= 0 or n_heads <= 0:
        raise ConfigError(f"need positive n_layers and n_heads, got {n_layers} and {n_heads}")
    if weighting == "components":
        return torch.ones(n_components)
    if weighting != "params":
        raise ConfigError(f"sparsity weighting must be 'components' or 'params', got {weighting!r}")
    if not all(isinstance(d, int) and d > 0 for d in (d_model, d_head, d_mlp)):
        raise ConfigError("'params' weighting needs positive d_model, d_head and d_mlp")
    head = torch.full((n_layers * n_heads,), float(4 * d_model * d_head))
    mlp = torch.full((n_layers,), float(2 * d_model * d_mlp))
    return torch.cat([head, mlp])


def lagrangian_penalty(
    lambda_1: Float[torch.Tensor, "*runs"],
    lambda_2: Float[torch.Tensor, "*runs"],
    sparsity: Float[torch.Tensor, "*runs"],
    target: float | Float[torch.Tensor, "*runs"],
) -> Float[torch.Tensor, "*runs"]:
    """``lambda1 * (t - s) + lambda2 * (t - s) ** 2`` for sparsity ``t`` and target ``s``
    (elementwise: a batched group passes one entry per run)."""
    gap = sparsity - target
    return lambda_1 * gap + lambda_2 * gap * gap


class LagrangianController(nn.Module):
    """Holds lambda1 and lambda2 (both start at 0) and computes the sparsity penalty."""

    def __init__(self) -> None:
        super().__init__()
        self.lambda_1 = nn.Parameter(torch.zeros(()))
        self.lambda_2 = nn.Parameter(torch.zeros(()))

    def penalty(
        self, expected_sparsity: Float[torch.Tensor, ""], target: float
    ) -> Float[torch.Tensor, ""]:
        """``lambda1 * (t - s) + lambda2 * (t - s) ** 2``, ``t`` expected, ``s`` target sparsity."""
        return lagrangian_penalty(self.lambda_1, self.lambda_2, expected_sparsity, target)

    def forward(
        self, expected_sparsity: Float[torch.Tensor, ""], target: float
    ) -> Float[torch.Tensor, ""]:
        return self.penalty(expected_sparsity, target)


def pruning_optimizer(
    log_alpha_params: Iterable[nn.Parameter],
    controller: LagrangianController,
    lr_log_alpha: float,
    lr_lambda: float,
    weight_decay: float = 0.0,
    lambda_weight_decay: float | None = None,
) -> torch.optim.AdamW:
    """One AdamW that descends on the gates and *ascends* on the lambdas (``maximize=True``).

    Call ``loss.backward(); optimizer.step()`` on ``task_loss + controller.penalty(t, s)`` as
    usual; no gradient needs flipping by hand. ``weight_decay`` (decoupled, AdamW's
    ``p <- p * (1 - lr * weight_decay)`` before the Adam update) applies to both groups, as in
    the authors' code, which builds ``torch.optim.AdamW`` with its default 0.01: it is what pulls
    ``log_alpha`` from its initial 10 down to where sampled gates leave 1 and gradients flow.
    ``lambda_weight_decay`` (default: ``weight_decay``) sets the lambdas' own.
    """
    if lr_log_alpha <= 0 or lr_lambda <= 0:
        raise ConfigError(
            f"learning rates must be positive, got lr_log_alpha={lr_log_alpha}, "
            f"lr_lambda={lr_lambda}"
        )
    lambda_weight_decay = weight_decay if lambda_weight_decay is None else lambda_weight_decay
    for name, value in (
        ("weight_decay", weight_decay),
        ("lambda_weight_decay", lambda_weight_decay),
    ):
        if not 0.0 <= value < 1.0:
            raise ConfigError(f"{name} must lie in [0, 1), got {value}")
    log_alpha_params = list(log_alpha_params)
    on_gpu = all(p.is_cuda for p in [*log_alpha_params, *controller.parameters()])
    return torch.optim.AdamW(
        [
            {
                "params": log_alpha_params,
                "lr": lr_log_alpha,
                "maximize": False,
                "weight_decay": weight_decay,
            },
            {
                "params": list(controller.parameters()),
                "lr": lr_lambda,
                "maximize": True,
                "weight_decay": lambda_weight_decay,
            },
        ],
        # on a GPU one fused kernel per group: a batched sweep steps K optimizers a step
        fused=True if on_gpu else None,
    )
