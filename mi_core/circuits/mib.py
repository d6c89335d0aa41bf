"""Circuits scored as the Mechanistic Interpretability Benchmark scores them (MIB's
circuit-localisation track, Mueller et al. 2025).

MIB's evaluator (hannamw/MIB-circuit-track, ``evaluation.evaluate_area_under_curve``) takes a
method's edge scores and, at each of :data:`MIB_PERCENTAGES` of the graph's edges, keeps the
``int(pct * n_edges)`` edges ranked highest (by ``|score|`` with ``absolute``, else by the signed
score, MIB's sign: against the loss), prunes what is left unconnected (a node kept only with a
kept edge in and out, repeatedly: :meth:`~mi_core.interventions.edges.Graph.connected`), patches
every other edge from the counterfactual prompt, and measures the mean logit difference ``m``.
The faithfulness of a circuit ``C`` is ``f = (m(C) - m(empty)) / (m(full) - m(empty))``; the
scores are two trapezoid areas over the nominal percentages (as fractions, 0.001 to 1):

- **CPR**, the area under ``f`` (higher is better; a circuit that exceeds the model counts);
- **CMD**, the area under ``|1 - f|`` (lower is better).

MIB ranks by the signed score for CPR and by ``|score|`` for CMD (each method's circuits may be
chosen for each metric). :func:`mib_score` computes both, and every faithfulness, on mi_core's
fused masked forward; the tests hold it to MIB's own evaluator on the same graph and pairs.
:func:`select_mib_circuits` chooses a method's own circuit for each size and metric on the
finding pairs (measured against plain top-n: docs/circuits.md).

Node and neuron levels (``level``): MIB ranks nodes, or the dimensions of each node's output,
and patches what is outside (:mod:`mi_core.circuits.nodes`). The means are over the pairs; MIB's
evaluator averages its batches' means (its metric's ``mean=True``), which is the same when the
batches are of one size and weights a smaller last batch's examples more otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from jaxtyping import Float, Int

from mi_core.circuits.attribution import EdgeScores
from mi_core.circuits.evaluate import masked_metrics, mib_scores
from mi_core.circuits.metrics import Metric, logit_difference
from mi_core.circuits.nodes import (
    NodeScores,
    mib_neuron_circuits,
    mib_node_circuits,
    scores_at_level,
)
from mi_core.data.circuit_pairs import PromptPairs
from mi_core.errors import ConfigError
from mi_core.interventions.edges import EdgeMask, Graph, OutputMask
from mi_core.interventions.edges.graph import top_k_order

if TYPE_CHECKING:
    from mi_core.models.types import HookedModel

__all__ = ["MIB_PERCENTAGES", "MIBScore", "mib_areas", "mib_circuit_files", "mib_circuits",
           "mib_difference", "mib_score", "select_mib_circuits"]  # fmt: skip

#: The circuit sizes MIB scores, as fractions of the graph's edges.
MIB_PERCENTAGES = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)


def mib_circuit_files(suffix: str) -> list[str]:
    """The file names of a method's nine circuits, one per MIB size below 100 %
    (``0.001<suffix>`` ... ``0.5<suffix>``), as MIB's submissions and mi_core's made circuits
    name them."""
    return [f"{pct:g}{suffix}" for pct in MIB_PERCENTAGES if pct < 1]


@dataclass(frozen=True)
class MIBScore:
    """MIB's scores of one method's circuits on one set of pairs."""

    cpr: float
    """The area under the faithfulness curve (higher is better)."""
    cmd: float
    """The area under ``|1 - faithfulness|`` (lower is better)."""
    faithfulness: list[float]
    """The faithfulness at each of :attr:`percentages`."""
    n_edges: list[int]
    """The edges each circuit keeps once pruned to what is connected (at the neuron level: the
    output dimensions it keeps). MIB's evaluator reports
    up to a few more: its prune stops a pass early when its top-n already marked the nodes,
    leaving edges out of nodes with no kept input, which under patching carry what a removed
    edge would (the faithfulness is the same)."""
    kl: list[float]
    """Each circuit's mean KL to the full model at the answer (what CPR does not show)."""
    percentages: tuple[float, ...]
    full: float
    """The full model's mean logit difference."""
    empty: float
    """The empty circuit's (every edge patched)."""
    absolute: bool
    """Whether the circuits were ranked by ``|score|`` (else by the signed score)."""
    level: str = "edge"
    """What was ranked: ``edge``, ``node`` or ``neuron`` (the percentages are of the scored
    nodes, or output dimensions; :attr:`n_edges` then counts the kept dimensions)."""
    pair_values: list[list[float]] = field(default_factory=list)
    """Each circuit's metric on each pair (``[size][pair]``), what :meth:`interval` resamples."""
    full_values: list[float] = field(default_factory=list)
    """The full model's metric on each pair."""
    empty_values: list[float] = field(default_factory=list)
    """The empty circuit's metric on each pair."""
    log_scale: bool = False
    """Whether the areas are over the percentages' logarithms."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def interval(
        self, confidence: float = 0.95, resamples: int = 1000, seed: int = 0
    ) -> dict[str, tuple[float, float]]:
        """Percentile bootstrap intervals of CPR and CMD over the judged pairs: each resample
        draws the pairs with replacement and recomputes the full model's, the empty circuit's
        and every circuit's mean, the faithfulness and the two areas (no forward pass). How far
        another set of as many pairs could move the scores."""
        return _intervals(_resampled_areas(self, _resample(self, resamples, seed)), confidence)


def mib_difference(
    a: MIBScore, b: MIBScore, confidence: float = 0.95, resamples: int = 1000, seed: int = 0
) -> dict[str, tuple[float, float]]:
    """Paired percentile bootstrap intervals of ``a.cpr - b.cpr`` and ``a.cmd - b.cmd``: two
    methods judged on the same pairs, the same pairs drawn for both in each resample (a
    difference whose interval excludes 0 is not one set of pairs' luck). Raises
    :class:`ConfigError` when the scores were not computed on the same pairs, or their areas
    on different axes."""
    if a.full_values != b.full_values or a.empty_values != b.empty_values:
        raise ConfigError(
            "the two scores were judged on different pairs (their full model's or empty "
            "circuit's per-pair metrics differ); a paired difference needs the same pairs"
        )
    if a.log_scale != b.log_scale or a.percentages != b.percentages:
        raise ConfigError("the two scores' areas are over different axes (log_scale differs)")
    index = _resample(a, resamples, seed)
    cpr_a, cmd_a = _resampled_areas(a, index)
    cpr_b, cmd_b = _resampled_areas(b, index)
    return _intervals((cpr_a - cpr_b, cmd_a - cmd_b), confidence)


def _resample(score: MIBScore, resamples: int, seed: int) -> torch.Tensor:
    """``[resamples, n_pairs]`` indices of pairs drawn with replacement."""
    n = len(score.full_values)
    if not n or len(score.pair_values) != len(score.percentages):
        raise ConfigError("this MIBScore has no per-pair values to resample (mib_score makes them)")
    if resamples < 1:
        raise ConfigError(f"resamples must be at least 1, not {resamples}")
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(n, (resamples, n), generator=generator)


def _resampled_areas(
    score: MIBScore, index: Int[torch.Tensor, "resample pair"]
) -> tuple[Float[torch.Tensor, " resample"], Float[torch.Tensor, " resample"]]:
    """CPR and CMD of ``score`` on each row of ``index``'s pairs (the areas of
    :func:`mib_areas`, vectorised over the resamples)."""
    values = torch.tensor(score.pair_values, dtype=torch.float64)[:, index].mean(-1)
    full = torch.tensor(score.full_values, dtype=torch.float64)[index].mean(-1)
    empty = torch.tensor(score.empty_values, dtype=torch.float64)[index].mean(-1)
    faithfulness = (values - empty) / (full - empty)  # [size, resample]
    return _trapezoids(faithfulness, score.percentages, score.log_scale)


def _trapezoids(
    faithfulness: Float[torch.Tensor, "size ..."], percentages: Sequence[float], log_scale: bool
) -> tuple[Float[torch.Tensor, "..."], Float[torch.Tensor, "..."]]:
    """The trapezoid areas of ``f`` and of ``|1 - f|`` over ``percentages`` (their logarithms
    with ``log_scale``), for every column of ``faithfulness``: MIB's evaluator's sums."""
    xs = [math.log(p) for p in percentages] if log_scale else list(percentages)
    widths = torch.tensor(xs, dtype=torch.float64).diff()
    widths = widths.reshape(-1, *[1] * (faithfulness.ndim - 1))
    gap = (1 - faithfulness).abs()
    cpr = (widths * (faithfulness[1:] + faithfulness[:-1]) / 2).sum(0)
    cmd = (widths * (gap[1:] + gap[:-1]) / 2).sum(0)
    return cpr, cmd


def _intervals(
    areas: tuple[torch.Tensor, torch.Tensor], confidence: float
) -> dict[str, tuple[float, float]]:
    """The central ``confidence`` percentile interval of each of (CPR, CMD)'s resamples."""
    if not 0 < confidence < 1:
        raise ConfigError(f"confidence must be between 0 and 1, not {confidence}")
    tails = torch.tensor([(1 - confidence) / 2, (1 + confidence) / 2], dtype=torch.float64)
    bounds = [torch.quantile(values, tails).tolist() for values in areas]
    return {name: (lo, hi) for name, (lo, hi) in zip(("cpr", "cmd"), bounds, strict=True)}


def mib_areas(
    faithfulness: Sequence[float],
    percentages: Sequence[float] = MIB_PERCENTAGES,
    log_scale: bool = False,
) -> tuple[float, float]:
    """MIB's (CPR, CMD): trapezoid areas of ``f`` and of ``|1 - f|`` over ``percentages``
    (``log_scale``: over their logarithms), as its evaluator sums them."""
    if len(faithfulness) != len(percentages):
        raise ConfigError(f"{len(faithfulness)} faithfulness values for {len(percentages)} sizes")
    values = torch.tensor(list(faithfulness), dtype=torch.float64)
    cpr, cmd = _trapezoids(values, percentages, log_scale)
    return float(cpr), float(cmd)


def mib_circuits(
    scores: EdgeScores | NodeScores,
    absolute: bool = True,
    percentages: Sequence[float] = MIB_PERCENTAGES,
    level: str = "edge",
) -> list[torch.Tensor]:
    """The kept edges (``[n_edges]`` booleans) of MIB's circuit at each percentage. ``edge``:
    the top ``int(pct * n_edges)`` by MIB's ranking of ``scores`` (:func:`mib_scores`: mi_core's
    sign turned to MIB's), then what is left unconnected pruned. ``node``: the edges among the
    top nodes (:func:`~mi_core.circuits.nodes.mib_node_circuits`; edge or neuron scores summed
    per node). ``neuron``: the kept output dimensions instead (``[sender, d_model]``, from
    neuron scores: :func:`~mi_core.circuits.nodes.mib_neuron_circuits`)."""
    scores = scores_at_level(scores, level, f"the {scores.method} scores")
    if isinstance(scores, NodeScores):
        circuits_of = mib_neuron_circuits if level == "neuron" else mib_node_circuits
        return circuits_of(scores, absolute, percentages)
    graph = scores.graph
    order = top_k_order(mib_scores(scores.scores, scores.method), absolute=absolute)
    circuits = []
    for pct in percentages:
        kept = torch.zeros(graph.n_edges, dtype=torch.bool)
        kept[order[: int(pct * graph.n_edges)]] = True
        circuits.append(graph.connected(kept))
    return circuits


def mib_score(
    model: HookedModel,
    scores_or_circuits: EdgeScores | NodeScores | Sequence[EdgeMask],
    pairs: PromptPairs,
    *,
    level: str = "edge",
    absolute: bool = True,
    fill: str = "corrupted",
    means: Float[torch.Tensor, "sender d_model"] | None = None,
    metric: Metric = logit_difference,
    batch_size: int = 16,
    log_scale: bool = False,
    progress: bool = False,
) -> MIBScore:
    """MIB's CPR and CMD of a method's circuits on ``pairs`` (module docstring).

    ``scores_or_circuits``: edge or node scores (the circuits chosen as MIB chooses them at
    ``level``, ranked by ``|score|`` with ``absolute``, else signed; edge scores at level
    ``node`` are summed per node), or one binary circuit per percentage (a method that gives
    circuits, not scores: edge pruning at each size). ``fill``: what a removed edge carries,
    ``corrupted`` (MIB's patching), ``mean`` or ``zero``."""
    if isinstance(scores_or_circuits, (EdgeScores, NodeScores)):
        graph = scores_or_circuits.graph
        kept = mib_circuits(scores_or_circuits, absolute, level=level)
    else:
        if level != "edge":
            raise ConfigError(
                f"circuits given are edge masks (level edge); the {level} level ranks scores"
            )
        circuits = list(scores_or_circuits)
        if len(circuits) != len(MIB_PERCENTAGES):
            raise ConfigError(
                f"MIB scores {len(MIB_PERCENTAGES)} circuits, one per size "
                f"{', '.join(f'{p:g}' for p in MIB_PERCENTAGES)}; got {len(circuits)}"
            )
        graph = circuits[0].graph
        kept = [graph.connected(c.weights > 0.5) for c in circuits]
    masks = _masks(graph, kept, fill, means)
    results, full_values = masked_metrics(model, masks, pairs, metric, batch_size, progress)
    full, empty, faithfulness = _means(results, full_values)
    sizes = [int(circuit.sum()) for circuit in kept]
    cpr, cmd = mib_areas(faithfulness, MIB_PERCENTAGES, log_scale)
    return MIBScore(cpr, cmd, faithfulness, sizes, [kl for _, kl in results[1:]],
                    MIB_PERCENTAGES, full, empty, absolute, level,
                    pair_values=[v.tolist() for v, _ in results[1:]],
                    full_values=full_values.tolist(), empty_values=results[0][0].tolist(),
                    log_scale=log_scale)  # fmt: skip


def _masks(
    graph: Graph, kept: Sequence[torch.Tensor], fill: str, means: torch.Tensor | None
) -> list[Any]:
    """The empty circuit's mask, then each kept set's (edges, or output dimensions: MIB's
    neuron level), as :func:`masked_metrics` takes them."""
    if kept and kept[0].ndim == 2:
        empty = torch.zeros(graph.n_senders, graph.d_model)
        masks: list[Any] = [OutputMask(graph, empty, fill, means=means)]
        return masks + [OutputMask(graph, circuit.float(), fill, means=means) for circuit in kept]
    masks = [EdgeMask.empty(graph, fill, means=means)]
    return masks + [EdgeMask(graph, circuit.float(), fill, means=means) for circuit in kept]


def _means(
    results: list[tuple[torch.Tensor, float]], full_values: torch.Tensor
) -> tuple[float, float, list[float]]:
    """The full model's and the empty circuit's (``results[0]``) mean metric, and each other
    mask's faithfulness."""
    full, empty = float(full_values.mean()), float(results[0][0].mean())
    span = full - empty
    faithfulness = [(float(v.mean()) - empty) / span if span else math.nan for v, _ in results[1:]]
    return full, empty, faithfulness


#: Shares of a selected circuit's budget filled by ``|score|`` (the rest by signed score):
#: the mixed candidates of :func:`select_mib_circuits`.
SELECTION_MIXES = (0.25, 0.5, 0.75)


def select_mib_circuits(
    model: HookedModel,
    scores: EdgeScores,
    pairs: PromptPairs,
    for_metric: str = "cpr",
    *,
    mixes: Sequence[float] = SELECTION_MIXES,
    fill: str = "corrupted",
    means: Float[torch.Tensor, "sender d_model"] | None = None,
    metric: Metric = logit_difference,
    batch_size: int = 16,
    progress: bool = False,
) -> list[EdgeMask]:
    """One circuit per MIB size, each chosen on the *finding* ``pairs`` among readings of
    ``scores``: MIB's absolute and signed top-n, and, for each share ``a`` of ``mixes``, the
    union of the top ``a`` of the budget by ``|score|`` with the top ``1 - a`` by signed score
    (every candidate pruned to what is connected, within the size's budget). ``for_metric``
    ``cpr``: the candidate of highest finding faithfulness; ``cmd``: the one closest to 1. The
    circuit at 100 % is the whole graph, as MIB's. Judge the result on other pairs with
    :func:`mib_score` (MIB lets a method hand in its own circuit for each size and metric)."""
    if for_metric not in ("cpr", "cmd"):
        raise ConfigError(f"for_metric must be cpr or cmd, not {for_metric!r}")
    graph = scores.graph
    sizes = [p for p in MIB_PERCENTAGES if p < 1]
    by_abs, by_sign = mib_circuits(scores, True, sizes), mib_circuits(scores, False, sizes)
    candidates = [[a, s] for a, s in zip(by_abs, by_sign, strict=True)]
    for share in mixes:
        by_abs = mib_circuits(scores, True, [p * share for p in sizes])
        by_sign = mib_circuits(scores, False, [p * (1 - share) for p in sizes])
        for options, a, s in zip(candidates, by_abs, by_sign, strict=True):
            options.append(graph.connected(a | s))
    flat = [kept for options in candidates for kept in options]
    masks = _masks(graph, flat, fill, means)
    results, full_values = masked_metrics(model, masks, pairs, metric, batch_size, progress)
    _, _, values_of_all = _means(results, full_values)
    faithfulness = iter(values_of_all)
    chosen = []
    for options in candidates:
        values = [next(faithfulness) for _ in options]
        losses = [abs(1 - v) if for_metric == "cmd" else -v for v in values]
        best = options[losses.index(min(losses))]
        chosen.append(EdgeMask(graph, best.float(), fill, means=means))
    return [*chosen, EdgeMask.full(graph, fill, means=means)]
