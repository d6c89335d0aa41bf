"""Turn learnt gates into a binary subnetwork that meets the target sparsity exactly.

Heads and MLPs are ranked together, so the gates of a model live in one flat vector of
``n_layers * n_heads + n_layers`` components: every head first, row-major by (layer, head), then
one MLP per layer. :func:`flatten_components` and :func:`unflatten_components` convert between
that vector and the ``(heads [n_layers, n_heads], mlps [n_layers])`` pair; they work for
``log_alpha``, masks and weights alike.

Two rules (:data:`DISCRETIZE_RULES`):

* ``"reference"`` -- the authors' rule (``deterministic_z_from_log_alpha`` in their ``l0.py`` and
  the thresholds of their evaluation scripts): within each module (a layer's heads, a layer's
  MLP) zero the ``round(expected number of zero gates)`` entries with the smallest soft value
  ``sigmoid(0.8 * log_alpha / beta)``, then keep the components whose soft value exceeds one
  global threshold, picked from a grid of stride 0.05 so the sparsity comes as close to the
  target as the grid allows (:func:`reference_binary_mask`). The achieved sparsity may differ
  from the target; it is reported.
* ``"exact"`` -- rank by ``log_alpha`` and remove exactly ``round(target * n)`` components
  (:func:`binary_mask_from_log_alpha`): hits the target exactly and is monotone in the same
  quantity (the soft value is a non-decreasing function of ``log_alpha``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from jaxtyping import Bool, Float

from mi_core.errors import ConfigError, InterventionError, TrainingError
from mi_core.pruning.constants import DISCRETIZE_RULES
from mi_core.pruning.hard_concrete import BETA, EPS, HardConcrete, hard_concrete_prob_nonzero
from mi_core.seeding import derive_seed

if TYPE_CHECKING:
    from mi_core.pruning.profiles import PruneConfig

#: The authors' soft value is ``sigmoid(log_alpha / beta * 0.8)`` (``FACTOR`` in their l0.py).
REFERENCE_FACTOR = 0.8
#: The thresholds the reference rule searches: 0, 0.05, ..., 0.95.
THRESHOLD_GRID: tuple[float, ...] = tuple(round(0.05 * i, 2) for i in range(20))


@dataclass(frozen=True)
class AchievedSparsity:
    """The sparsity a binary mask achieves: by component count, and by weight when weights given.

    ``threshold`` is the global threshold the reference rule chose (None for the exact rule).
    """

    by_count: float
    by_weight: float | None = None
    threshold: float | None = None


def flatten_components(heads: torch.Tensor, mlps: torch.Tensor) -> torch.Tensor:
    """Join ``heads [n_layers, n_heads]`` (row-major) and ``mlps [n_layers]`` into one vector."""
    if heads.ndim != 2 or mlps.ndim != 1 or heads.shape[0] != mlps.shape[0]:
        raise InterventionError(
            f"expected heads of shape [n_layers, n_heads] and mlps of shape [n_layers], got "
            f"{tuple(heads.shape)} and {tuple(mlps.shape)}"
        )
    return torch.cat([heads.reshape(-1), mlps])


def unflatten_components(
    flat: Float[torch.Tensor, "*batch components"], n_layers: int, n_heads: int
) -> tuple[Float[torch.Tensor, "*batch n_layers n_heads"], Float[torch.Tensor, "*batch n_layers"]]:
    """Split a flat component vector back into ``(heads [n_layers, n_heads], mlps [n_layers])``
    (a leading batch axis, one vector per example, is kept)."""
    expected = n_layers * n_heads + n_layers
    if flat.ndim not in (1, 2) or flat.shape[-1] != expected:
        raise InterventionError(
            f"expected a flat vector of {expected} components ({n_layers} layers x {n_heads} "
            f"heads + {n_layers} MLPs), got shape {tuple(flat.shape)}"
        )
    n_head_entries = n_layers * n_heads
    heads = flat[..., :n_head_entries].reshape(*flat.shape[:-1], n_layers, n_heads)
    return heads, flat[..., n_head_entries:]


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


def reference_soft_mask(
    log_alpha: Float[torch.Tensor, " components"],
    n_layers: int,
    n_heads: int,
    beta: float = BETA,
) -> Float[torch.Tensor, " components"]:
    """The authors' deterministic gates, flat: per module, the expected zeros set to 0.

    Each module (the ``n_heads`` heads of a layer; the MLP of a layer) gets
    ``k = round(sum(P(z = 0)))`` zeros (each ``P(z = 0)`` clamped to ``[EPS, 1 - EPS]``), on its
    ``k`` entries with the smallest soft value ``sigmoid(0.8 * log_alpha / beta)`` as
    ``torch.topk(largest=False)`` picks them (among tied values, topk's choice, as in the
    authors' ``deterministic_z_from_log_alpha``, not the lowest indices); the other entries keep
    their soft value in (0, 1).
    ``beta``: the run's temperature (the authors' one ``TEMPERATURE`` for sampling and this).
    """
    flat = log_alpha.detach().reshape(-1).double().cpu()
    if not bool(torch.isfinite(flat).all()):
        raise TrainingError("log_alpha contains NaN or infinite values; cannot rank components")
    soft = torch.sigmoid(flat / beta * REFERENCE_FACTOR)
    heads, mlps = unflatten_components(torch.arange(flat.numel()), n_layers, n_heads)
    groups = [heads[layer] for layer in range(n_layers)] + [
        mlps[l : l + 1] for l in range(n_layers)
    ]
    for index in groups:
        # P(z = 0) clamped to [EPS, 1 - EPS] before the sum, as the authors' cdf is: a layer of
        # open gates adds EPS each, which decides a sum within ~1e-5 of k + 0.5
        p_zero = (1.0 - hard_concrete_prob_nonzero(flat[index], beta)).clamp(EPS, 1.0 - EPS)
        k = int(torch.round(p_zero.sum()).item())
        if k > 0:  # torch.topk as theirs: among tied soft values, its choice of which go
            order = torch.topk(soft[index], k, largest=False).indices
            soft[index[order]] = 0.0
    return soft.to(log_alpha.dtype)


def reference_binary_mask(
    log_alpha: Float[torch.Tensor, " components"],
    n_layers: int,
    n_heads: int,
    target_sparsity: float,
    weights: Float[torch.Tensor, " components"] | None = None,
    grid: tuple[float, ...] = THRESHOLD_GRID,
    beta: float = BETA,
) -> tuple[Bool[torch.Tensor, " components"], AchievedSparsity]:
    """The authors' discretisation: keep ``soft > threshold`` (see :func:`reference_soft_mask`).

    The threshold is the grid value whose mask's sparsity (by count) lies closest to
    ``target_sparsity``; on a tie the lower threshold (the denser mask) wins. Returns the mask
    (True = kept) and the sparsity it achieves, with the threshold chosen.
    """
    if not 0.0 <= target_sparsity <= 1.0:
        raise ConfigError(f"target sparsity must lie in [0, 1], got {target_sparsity}")
    soft = reference_soft_mask(log_alpha, n_layers, n_heads, beta).cpu()
    n = soft.numel()
    best: tuple[float, float, torch.Tensor] | None = None
    for threshold in grid:
        keep = soft > threshold
        # in components, in float64: a float32 mean splits exact ties by rounding (77 and 79
        # of 156 around 78), and the sparser mask would win one of two mirror-image ties
        gap = abs(int((~keep).sum()) - target_sparsity * n)
        if best is None or gap < best[0] - 1e-9:
            best = (gap, threshold, keep)
    assert best is not None
    _, threshold, keep = best
    keep = keep.to(log_alpha.device)
    achieved = mask_sparsity(keep, weights)
    return keep, AchievedSparsity(achieved.by_count, achieved.by_weight, threshold)


def discretize(
    log_alpha: Float[torch.Tensor, " components"],
    n_layers: int,
    n_heads: int,
    target_sparsity: float,
    rule: str = "reference",
    weights: Float[torch.Tensor, " components"] | None = None,
    beta: float = BETA,
) -> tuple[Bool[torch.Tensor, " components"], AchievedSparsity]:
    """A binary mask from flat gates by ``rule`` (``"reference"`` or ``"exact"``); ``beta``: the
    run's temperature, which the reference rule's soft gates and expected zeros read."""
    if rule == "reference":
        return reference_binary_mask(
            log_alpha, n_layers, n_heads, target_sparsity, weights, beta=beta
        )
    if rule == "exact":
        return binary_mask_from_log_alpha(log_alpha, target_sparsity, weights)
    raise ConfigError(f"unknown discretisation {rule!r}; choose one of {DISCRETIZE_RULES}")


def make_gates(
    cfg: PruneConfig, n_layers: int, n_heads: int, generator: torch.Generator | None = None
) -> HardConcrete:
    """The gates a pruning run of ``cfg`` learns, one per head and MLP (flat: heads, then MLPs),
    initialised as :func:`~mi_core.pruning.prune` initialises them (``generator``: by default
    the run's seeded one). In eval mode they give the run's own subnetwork (``cfg.discretize``
    at ``cfg.target_sparsity``, as 0 / 1 gates): the model the run probes and reports. Louizos'
    deterministic gate, a plain :class:`HardConcrete`'s eval value, lies up to 0.44 from the
    ``paper`` profile's gates."""
    if generator is None:
        generator = torch.Generator().manual_seed(derive_seed("prune", "init", cfg.seed, 0))
    return HardConcrete(
        n_layers * n_heads + n_layers,
        cfg.beta,
        init_mean=cfg.log_alpha_init,
        init_std=cfg.log_alpha_init_std,
        generator=generator,
        eval_gate=functools.partial(
            _subnetwork_gates,
            n_layers=n_layers,
            n_heads=n_heads,
            target=cfg.target_sparsity,
            rule=cfg.discretize,
            beta=cfg.beta,
        ),
    )


def _subnetwork_gates(
    log_alpha: Float[torch.Tensor, " components"],
    *,
    n_layers: int,
    n_heads: int,
    target: float,
    rule: str,
    beta: float,
) -> Float[torch.Tensor, " components"]:
    keep, _ = discretize(log_alpha, n_layers, n_heads, target, rule, beta=beta)
    return keep.to(log_alpha.dtype)
