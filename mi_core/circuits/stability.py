"""How stable a method's circuits are: the finding pairs resampled, the circuits compared.

Circuits found from different samples of one task disagree (EAP-IG's bootstrap Jaccard is
about 0.67 on GPT-2 IOI and 0.34-0.39 on Llama-3.2-1B in published work). :func:`circuit_stability`
draws ``n`` bootstrap resamples of the finding pairs (with replacement, seeded), scores the
edges on each with the same method, reads each resample's circuit at every MIB size (MIB's
top-n then prune, :func:`~mi_core.circuits.mib.mib_circuits`), and reports per size the mean
Jaccard index over every pair of resamples and the edges that are in every resample's circuit
(the heuristic core's question asked of edges). :func:`pruning_stability` asks it of edge
pruning: one run per resample, each run's circuit at every size read off its gates (MIB's
ranking of log_alpha; at the run's own target, its circuit). ``mi-core circuit attribute
--bootstrap N`` and ``mi-core circuit prune --bootstrap N`` write it as ``bootstrap.json`` and
``bootstrap.html``.
"""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from tqdm.auto import tqdm

from mi_core.circuits.attribution import EdgeScores, attribute
from mi_core.circuits.config import EdgePruneSettings
from mi_core.circuits.metrics import Metric, logit_difference
from mi_core.circuits.mib import MIB_PERCENTAGES, mib_circuits
from mi_core.circuits.prune import prune_edges
from mi_core.data.circuit_pairs import PromptPairs
from mi_core.errors import ConfigError
from mi_core.interventions.edges import Graph
from mi_core.seeding import derive_seed

if TYPE_CHECKING:
    from mi_core.models.types import HookedModel

__all__ = ["CircuitStability", "circuit_stability", "compare_circuits", "jaccard",
           "pruning_stability", "resample_pairs"]  # fmt: skip


@dataclass(frozen=True)
class CircuitStability:
    """The circuits of ``n_resamples`` bootstrap resamples compared at each size."""

    percentages: tuple[float, ...]
    jaccard: list[float]
    """The mean Jaccard index over the pairs of resamples' circuits, per size (pairs of two
    empty circuits left out; NaN where no circuit of that size holds an edge)."""
    n_edges: list[float]
    """The resamples' mean circuit size (edges kept once pruned), per size."""
    shared: list[list[str]]
    """The edges in every resample's circuit, per size (names as ``Graph.edge_names``)."""
    n_resamples: int
    method: str
    absolute: bool

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def jaccard(a: torch.Tensor, b: torch.Tensor) -> float:
    """``|a & b| / |a | b|`` of two boolean edge sets (NaN when both are empty: a size too
    small to hold an edge says nothing of agreement)."""
    union = int((a | b).sum())
    return math.nan if union == 0 else int((a & b).sum()) / union


def resample_pairs(pairs: PromptPairs, seed: int, k: int) -> PromptPairs:
    """Bootstrap resample ``k`` of ``pairs``: as many pairs drawn with replacement, seeded by
    ``(seed, k)``."""
    generator = torch.Generator().manual_seed(derive_seed("bootstrap", seed, k))
    return pairs.select(torch.randint(len(pairs), (len(pairs),), generator=generator))


def circuit_stability(
    model: HookedModel,
    pairs: PromptPairs,
    n_resamples: int,
    method: str = "eap-ig",
    *,
    seed: int = 0,
    absolute: bool = True,
    percentages: Sequence[float] = MIB_PERCENTAGES,
    metric: Metric = logit_difference,
    steps: int = 5,
    batch_size: int = 16,
    fill: str = "corrupted",
    means: torch.Tensor | None = None,
    ig_rule: str = "left",
    progress: bool = False,
) -> CircuitStability:
    """Score ``n_resamples`` bootstrap resamples of ``pairs`` with ``method`` and compare their
    circuits at each of ``percentages`` (see the module docstring)."""
    if n_resamples < 2:
        raise ConfigError(f"a bootstrap compares at least 2 resamples, not {n_resamples}")
    circuits = []  # per resample, per size
    for k in tqdm(range(n_resamples), desc="bootstrap", disable=not progress, leave=False):
        scores: EdgeScores = attribute(
            model, resample_pairs(pairs, seed, k), method, metric, steps, batch_size, fill,
            means, progress=False, ig_rule=ig_rule,
        )  # fmt: skip
        circuits.append(mib_circuits(scores, absolute, percentages))
    return compare_circuits(scores.graph, circuits, percentages, method, absolute)


def pruning_stability(
    model: HookedModel,
    pairs: PromptPairs,
    n_resamples: int,
    settings: EdgePruneSettings,
    *,
    seed: int = 0,
    percentages: Sequence[float] = MIB_PERCENTAGES,
    out: str | os.PathLike[str] | None = None,
    means: torch.Tensor | None = None,
    progress: bool = False,
) -> CircuitStability:
    """Edge-prune ``n_resamples`` bootstrap resamples of ``pairs`` with ``settings`` (each run
    resumable in ``out/resample<k>``) and compare the runs' circuits at each of
    ``percentages``, read off their gates (see the module docstring)."""
    if n_resamples < 2:
        raise ConfigError(f"a bootstrap compares at least 2 resamples, not {n_resamples}")
    circuits = []
    for k in tqdm(range(n_resamples), desc="bootstrap", disable=not progress, leave=False):
        folder = None if out is None else Path(out) / f"resample{k}"
        result = prune_edges(model, resample_pairs(pairs, seed, k), settings, folder, means,
                             progress=False)  # fmt: skip
        gates = EdgeScores(result.circuit.graph, result.log_alpha, "edge-pruning", len(pairs))
        circuits.append(mib_circuits(gates, True, percentages))
    return compare_circuits(Graph.from_model(model), circuits, percentages, "edge-pruning", True)


def compare_circuits(
    graph: Graph,
    circuits: Sequence[Sequence[torch.Tensor]],
    percentages: Sequence[float],
    method: str,
    absolute: bool,
) -> CircuitStability:
    """The resamples' circuits (per resample, per size: kept edges) compared at each size."""
    n_resamples = len(circuits)
    names = graph.edge_names
    index_pairs = list(itertools.combinations(range(n_resamples), 2))
    mean_jaccard, sizes, shared = [], [], []
    for size in range(len(percentages)):
        kept = [c[size] for c in circuits]
        defined = [v for i, j in index_pairs if not math.isnan(v := jaccard(kept[i], kept[j]))]
        mean_jaccard.append(sum(defined) / len(defined) if defined else math.nan)
        sizes.append(sum(int(k.sum()) for k in kept) / n_resamples)
        common = torch.stack(kept).all(dim=0)
        shared.append([names[i] for i in torch.nonzero(common).flatten().tolist()])
    return CircuitStability(tuple(percentages), mean_jaccard, sizes, shared, n_resamples, method,
                            absolute)  # fmt: skip
