"""The pruning objective: stay close to the full model while meeting the sparsity target.

``loss = KL(p_full || p_masked) + lambda1 (t - s) + lambda2 (t - s)^2`` where ``p_full`` is the
unmasked model's class distribution (cached, see :mod:`~mi_core.pruning.reference_logits`),
``p_masked`` the masked model's, ``t`` the expected sparsity of the gates and ``s`` the target.
The KL is summed over classes and averaged over the batch.

On plain text (:class:`~mi_core.data.TextTask`) the classes are the vocabulary and the KL is
taken at every position (:func:`every_position_kl`): a task-free subnetwork. The full model's
distributions there are computed each step, as the authors' code computes its targets, since
examples x positions x vocabulary is too large to cache.
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
    """The total loss and its parts (all scalar tensors; ``total`` carries the gradient):
    ``kl``, the objective's value (a KL for the KL objectives), and the Lagrangian penalty."""

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
    return with_penalty(kl, controller, expected_sparsity, target_sparsity)


def with_penalty(
    kl: Float[torch.Tensor, ""],
    controller: LagrangianController,
    expected_sparsity: Float[torch.Tensor, ""],
    target_sparsity: float,
) -> PruningLoss:
    """An objective's value (:mod:`~mi_core.pruning.objectives`: a KL to the full model, a
    logit-difference gap) plus the Lagrangian sparsity penalty."""
    penalty = controller.penalty(expected_sparsity, target_sparsity)
    return PruningLoss(kl + penalty, kl, penalty)


def every_position_kl(
    reference_logits: Float[torch.Tensor, "batch pos vocab"],
    masked_logits: Float[torch.Tensor, "batch pos vocab"],
    attention_mask: Float[torch.Tensor, "batch pos"] | torch.Tensor,
) -> Float[torch.Tensor, " batch"]:
    """``KL(full || masked)`` of every example's next-token distributions, summed over the
    vocabulary and averaged over the example's real positions (``attention_mask`` 1)."""
    log_p_full, log_p_masked = _log_probs(reference_logits, masked_logits)
    per_token = F.kl_div(log_p_masked, log_p_full, reduction="none", log_target=True).sum(-1)
    real = attention_mask.to(per_token.dtype)
    return (per_token * real).sum(-1) / real.sum(-1).clamp(min=1)
