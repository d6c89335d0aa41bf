"""Separability scores: how much more a neuron is used on the cripple data than on the focus data.

For a statistic ``s`` (one of :data:`mi_core.statistics.activations.STATISTICS`) a neuron's score is
``s_cripple / (s_focus + eps)``, as the reference code computes it (``eps`` 1e-3 for MLP
neurons and 1e-4 for attention pre-out neurons, as its pruning runs pass them, unless given);
the neurons with the highest scores are the ones the cripple
data set relies on most relative to the focus data set, so they are pruned first. A neuron
that never fires on either data set scores 0 (pruned last), not 1.
``mean`` is that ratio of the signed means; ``mean_diff`` is the reference code's ``mean``
scoring, the difference ``|mean_cripple - mean_focus|`` (no ratio, no eps).
Scores of a whole attention head aggregate its pre-out neurons' scores by their mean or by their
median (:func:`head_scores` -- each named for what it computes; the reference code swapped them).
"""

from __future__ import annotations

import math

import torch
from jaxtyping import Bool, Float

from mi_core.errors import ConfigError
from mi_core.statistics.activations import STATISTICS, ActivationStats
from mi_core.statistics.constants import (
    DEFAULT_EPS,
    DIFFERENCE_SCORINGS,
    HEAD_AGGREGATIONS,
    REFERENCE_EPS,
    SCHEDULES,
    SCORINGS,
)


def statistic_for(scoring: str) -> str:
    """The statistic a scoring name compares (raises :class:`ConfigError` on unknown names)."""
    if scoring not in SCORINGS:
        raise ConfigError(f"unknown scoring {scoring!r}; expected one of {list(SCORINGS)}")
    return SCORINGS[scoring]


def score_ratio(
    focus: Float[torch.Tensor, "*neurons"],
    cripple: Float[torch.Tensor, "*neurons"],
    eps: float = DEFAULT_EPS,
) -> Float[torch.Tensor, "*neurons"]:
    """``cripple / (focus + eps)`` (the reference's ratio): large where the cripple data set
    uses a neuron more; 0 where it never does.

    For the signed ``mean`` statistic the ratio may be negative (a neuron whose mean changes
    sign); such neurons rank below every neuron with a positive ratio.
    """
    if eps < 0:
        raise ConfigError(f"eps must be non-negative, got {eps}")
    return cripple / (focus + eps)


def site_eps(site: str, eps: float | None = None) -> float:
    """``eps`` if given, else the reference's for ``site`` (``mlp`` 1e-3, ``attn`` 1e-4)."""
    return REFERENCE_EPS.get(site, DEFAULT_EPS) if eps is None else eps


def neuron_scores(
    focus: ActivationStats,
    cripple: ActivationStats,
    scoring: str,
    eps: float | None = None,
    attn_scoring: str | None = None,
) -> dict[str, torch.Tensor]:
    """Scores of every collected neuron: ``{"mlp": [L, d_mlp], "attn": [L, H, d_head]}``.

    ``scoring`` scores the MLP neurons, and the attention pre-out neurons too unless
    ``attn_scoring`` names another (the report scores MLP neurons by ``freq`` and attention
    neurons by ``abs`` in the same run). ``eps``: one value for both sites, or None for each
    site's reference value (:func:`site_eps`).
    """
    by_site = {"mlp": scoring, "attn": attn_scoring or scoring}
    out = {}
    for site in ("mlp", "attn"):
        f, c = getattr(focus, site), getattr(cripple, site)
        if f is None or c is None:
            continue
        name = by_site[site]
        statistic = statistic_for(name)
        assert statistic in STATISTICS
        # on the focus statistics' device (one set may be read from a file, the other from a GPU)
        f_stat = f.statistic(statistic)
        c_stat = c.statistic(statistic).to(f_stat.device)
        if name in DIFFERENCE_SCORINGS:
            out[site] = (c_stat - f_stat).abs()
        else:
            out[site] = score_ratio(f_stat, c_stat, site_eps(site, eps))
    return out


def head_scores(
    attn_scores: Float[torch.Tensor, "n_layers n_heads d_head"],
    aggregation: str = "mean",
    keep: Bool[torch.Tensor, "n_layers n_heads d_head"] | None = None,
) -> Float[torch.Tensor, "n_layers n_heads"]:
    """Aggregate pre-out neuron scores per head: ``"mean"`` or ``"median"`` over ``d_head``.

    With ``keep``, only a head's remaining neurons count (a head with none left scores NaN).
    """
    if aggregation not in HEAD_AGGREGATIONS:
        raise ConfigError(
            f"unknown head aggregation {aggregation!r}; expected one of {list(HEAD_AGGREGATIONS)}"
        )
    scores = attn_scores.double()
    if keep is not None:
        scores = torch.where(keep.to(scores.device), scores, torch.nan)
    if aggregation == "mean":
        return scores.nanmean(dim=-1)
    return scores.nanmedian(dim=-1).values


def random_scores(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """Uniform random scores (the random baseline), reproducible from ``seed``."""
    generator = torch.Generator().manual_seed(seed)
    return torch.rand(shape, generator=generator, dtype=torch.float64)


def n_to_prune(n_remaining: int, frac: float) -> int:
    """How many of ``n_remaining`` units a step with fraction ``frac`` removes (half rounds up)."""
    if not 0.0 <= frac <= 1.0:
        raise ConfigError(f"pruning fractions must be in [0, 1], got {frac}")
    return min(n_remaining, math.floor(frac * n_remaining + 0.5))


def n_to_prune_at(step: int, n_total: int, n_remaining: int, frac: float, schedule: str) -> int:
    """How many units step ``step`` (from 1) removes under ``schedule``.

    ``"total"`` (the report: "20 steps of 5 %" prune the whole model): the count removed after
    ``step`` steps is ``round(step * frac * n_total)``, so every step removes a ``frac`` share of
    *all* units and ``1 / frac`` steps remove exactly all of them (the reference code takes
    ``int(frac * n_total)`` each step, which can fall a few units short). ``"remaining"``:
    ``round(frac * n_remaining)`` (geometric: 20 steps of 5 % remove 64 %).
    """
    if schedule == "remaining":
        return n_to_prune(n_remaining, frac)
    if schedule != "total":
        raise ConfigError(f"unknown schedule {schedule!r}; expected one of {SCHEDULES}")
    if not 0.0 <= frac <= 1.0:
        raise ConfigError(f"pruning fractions must be in [0, 1], got {frac}")
    goal = min(n_total, math.floor(step * frac * n_total + 0.5))
    return max(0, min(n_remaining, goal - (n_total - n_remaining)))


def select_top(
    scores: torch.Tensor,
    remaining: Bool[torch.Tensor, "..."],
    k: int,
) -> tuple[Bool[torch.Tensor, "..."], float]:
    """The ``k`` remaining units with the highest scores (ties broken by position), globally.

    Returns the boolean selection and the threshold (lowest selected score; ``nan`` if none).
    NaN scores never rank above a number.
    """
    if scores.shape != remaining.shape:
        raise ConfigError(
            f"scores of shape {tuple(scores.shape)} do not match units {tuple(remaining.shape)}"
        )
    flat = scores.flatten().double().cpu()
    candidates = torch.nonzero(remaining.flatten().cpu()).flatten()
    selection = torch.zeros(flat.shape, dtype=torch.bool)
    k = min(k, candidates.numel())
    if k <= 0:
        return selection.reshape(remaining.shape), float("nan")
    values = flat[candidates].nan_to_num(nan=-torch.inf)
    # stable descending sort: equal scores are taken in index order
    order = torch.sort(values, descending=True, stable=True).indices[:k]
    selection[candidates[order]] = True
    return selection.reshape(remaining.shape), float(values[order[-1]])
