"""Turn learnt gates into a binary subnetwork that meets the target sparsity exactly.

Heads and MLPs are ranked together, so the gates of a model live in one flat vector of
``n_layers * n_heads + n_layers`` components: every head first, row-major by (layer, head), then
one MLP per layer. :func:`flatten_components` and :func:`unflatten_components` convert between
that vector and the ``(heads [n_layers, n_heads], mlps [n_layers])`` pair; they work for
``log_alpha``, masks and weights alike.

The paper picks a threshold on the deterministic gate by grid search (stride 0.05) to match the
target "as closely as possible"; ranking by ``log_alpha`` and removing exactly
``round(target * n)`` components hits the target exactly and is monotone in the same quantity
(the deterministic gate is a non-decreasing function of ``log_alpha``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from jaxtyping import Bool, Float

from mi_core.errors import ConfigError, InterventionError, TrainingError


@dataclass(frozen=True)
class AchievedSparsity:
    """The sparsity a binary mask achieves: by component count, and by weight when weights given."""

    by_count: float
    by_weight: float | None = None


def flatten_components(heads: torch.Tensor, mlps: torch.Tensor) -> torch.Tensor:
    """Join ``heads [n_layers, n_heads]`` (row-major) and ``mlps [n_layers]`` into one vector."""
    if heads.ndim != 2 or mlps.ndim != 1 or heads.shape[0] != mlps.shape[0]:
        raise InterventionError(
            f"expected heads of shape [n_layers, n_heads] and mlps of shape [n_layers], got "
            f"{tuple(heads.shape)} and {tuple(mlps.shape)}"
        )
    return torch.cat([heads.reshape(-1), mlps])


def unflatten_components(
    flat: torch.Tensor, n_layers: int, n_heads: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Split a flat component vector back into ``(heads [n_layers, n_heads], mlps [n_layers])``."""
    expected = n_layers * n_heads + n_layers
    if flat.ndim != 1 or flat.shape[0] != expected:
        raise InterventionError(
            f"expected a flat vector of {expected} components ({n_layers} layers x {n_heads} "
            f"heads + {n_layers} MLPs), got shape {tuple(flat.shape)}"
        )
    n_head_entries = n_layers * n_heads
    return flat[:n_head_entries].reshape(n_layers, n_heads), flat[n_head_entries:]


def mask_sparsity(
    mask: Bool[torch.Tensor, "*components"],
    weights: Float[torch.Tensor, "*components"] | None = None,
) -> AchievedSparsity:
    """The fraction of components a binary mask (True = kept) removes, by count and by weight."""
    removed = ~mask.bool()
    by_count = float(removed.float().mean())
    if weights is None:
        return AchievedSparsity(by_count)
    if weights.shape != mask.shape:
        raise InterventionError(
            f"weights have shape {tuple(weights.shape)} but the mask has shape {tuple(mask.shape)}"
        )
    weights = weights.detach().double().cpu()
    total = float(weights.sum())
    if bool((weights < 0).any()) or total <= 0:
        raise ConfigError("sparsity weights must be non-negative with a positive sum")
    return AchievedSparsity(by_count, float(weights[removed.cpu()].sum()) / total)


def binary_mask_from_log_alpha(
    log_alpha: Float[torch.Tensor, "*components"],
    target_sparsity: float,
    weights: Float[torch.Tensor, "*components"] | None = None,
) -> tuple[Bool[torch.Tensor, "*components"], AchievedSparsity]:
    """Keep all but the ``round(target_sparsity * n)`` components with the lowest ``log_alpha``.

    Returns the mask (same shape as ``log_alpha``, True = kept) and the sparsity it achieves.
    Ties are broken by position: among equal ``log_alpha`` the component with the lower flat
    index is removed first. ``weights`` only affect the reported ``by_weight`` sparsity, never
    which components are removed. Python's ``round`` (half to even) picks the count.
    """
    if not 0.0 <= target_sparsity <= 1.0:
        raise ConfigError(f"target sparsity must lie in [0, 1], got {target_sparsity}")
    flat = log_alpha.detach().reshape(-1)
    if not bool(torch.isfinite(flat).all()):
        raise TrainingError("log_alpha contains NaN or infinite values; cannot rank components")
    n_removed = round(target_sparsity * flat.numel())
    order = torch.sort(flat, stable=True).indices
    keep = torch.ones(flat.numel(), dtype=torch.bool, device=flat.device)
    keep[order[:n_removed]] = False
    mask = keep.reshape(log_alpha.shape)
    return mask, mask_sparsity(mask, weights)
