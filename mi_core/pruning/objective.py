"""The pruning objective: stay close to the full model while meeting the sparsity target.

``loss = KL(p_full || p_masked) + lambda1 (t - s) + lambda2 (t - s)^2`` where ``p_full`` is the
unmasked model's class distribution (cached, see :mod:`~mi_core.pruning.reference_logits`),
``p_masked`` the masked model's, ``t`` the expected sparsity of the gates and ``s`` the target.
The KL is summed over classes and averaged over the batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from jaxtyping import Float

from mi_core.pruning.lagrangian import LagrangianController


def kl_to_reference(
    reference_logits: Float[torch.Tensor, "batch label"],
    masked_logits: Float[torch.Tensor, "batch label"],
) -> Float[torch.Tensor, ""]:
    """``KL(full || masked) = sum_c p_full (log p_full - log p_masked)``, batch-averaged."""
    log_p_full, log_p_masked = _log_probs(reference_logits, masked_logits)
    return F.kl_div(log_p_masked, log_p_full, reduction="batchmean", log_target=True)


def _log_probs(
    reference_logits: torch.Tensor, masked_logits: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Both class log-distributions, in the masked logits' dtype."""
    log_p_full = F.log_softmax(reference_logits.to(masked_logits.dtype), dim=-1)
    return log_p_full, F.log_softmax(masked_logits, dim=-1)


def kl_per_example(
    reference_logits: Float[torch.Tensor, "batch label"],
    masked_logits: Float[torch.Tensor, "batch label"],
) -> Float[torch.Tensor, " batch"]:
    """``KL(full || masked)`` of every example (:func:`kl_to_reference` is their mean)."""
    log_p_full, log_p_masked = _log_probs(reference_logits, masked_logits)
    return F.kl_div(log_p_masked, log_p_full, reduction="none", log_target=True).sum(-1)


@dataclass(frozen=True)
class PruningLoss:
    """The total loss and its parts (all scalar tensors; ``total`` carries the gradient)."""

    total: torch.Tensor
    kl: torch.Tensor
    penalty: torch.Tensor


def pruning_loss(
    reference_logits: Float[torch.Tensor, "batch label"],
    masked_logits: Float[torch.Tensor, "batch label"],
    controller: LagrangianController,
    expected_sparsity: Float[torch.Tensor, ""],
    target_sparsity: float,
) -> PruningLoss:
    """KL to the full model plus the Lagrangian sparsity penalty."""
    kl = kl_to_reference(reference_logits, masked_logits)
    penalty = controller.penalty(expected_sparsity, target_sparsity)
    return PruningLoss(kl + penalty, kl, penalty)
