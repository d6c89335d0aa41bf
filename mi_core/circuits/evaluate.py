"""Judging a circuit: faithfulness against size, the area under that curve, MIB export.

Faithfulness of a circuit ``C`` (a set of kept edges) on held-out pairs is the fraction of the
full model's metric it recovers, measured from the empty circuit (every edge removed, i.e. the
corrupted / mean-ablated model)::

    faithfulness(C) = (m(C) - m(empty)) / (m(full) - m(empty))

with ``m`` the mean metric (IOI: logit difference). The KL divergence from the full model's
answer distribution to the circuit's is reported next to it. A faithfulness curve evaluates the
circuits of a score for growing ``k``; its area (trapezoid over the fraction of edges *actually*
kept, between the smallest and the largest evaluated: the levels are 0.001 to 1 by default, and
in a graph of fewer than 500 edges the first rounds to 0 edges) summarises it in one number, as
the MIB circuit-localisation benchmark does (MIB integrates over its nominal levels).
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from jaxtyping import Float
from tqdm.auto import tqdm

from mi_core.circuits.attribution import EdgeScores, select_circuit
from mi_core.circuits.config import CURVE_FRACTIONS
from mi_core.circuits.metrics import Metric, kl_divergence, logit_difference, metric_logits
from mi_core.data.circuit_pairs import PromptPairs
from mi_core.errors import ConfigError
from mi_core.interventions.edges import EdgeMask, Graph, graph_switches, node_outputs, to_mib_name
from mi_core.interventions.edges._engine import masked_hooks, record_corrupted
from mi_core.interventions.edges.output_mask import OutputMask
from mi_core.io import write_json
from mi_core.models.hook_context import hooked

if TYPE_CHECKING:
    from mi_core.models.types import HookedModel

__all__ = [
    "CURVE_FRACTIONS",
    "CircuitScore",
    "circuit_baselines",
    "curve_area",
    "curve_difference",
    "evaluate_circuit",
    "faithfulness_curve",
    "gap_is_small",
    "to_mib",
    "write_mib",
]


#: Below this fraction of the metric's magnitude, the full - empty gap is called small.
SMALL_GAP = 0.1


@dataclass(frozen=True)
class CircuitScore:
    """One circuit judged on held-out pairs."""

    n_edges: int
    fraction: float
    metric: float
    full: float
    empty: float
    faithfulness: float
    kl: float
    gap_se: float = float("nan")
    """The standard error of ``full - empty`` over the examples (per-example differences)."""
    faithfulness_se: float = float("nan")
    """The standard error of ``faithfulness`` over the examples: the circuit's per-example
    metric's standard error over ``|full - empty|`` (the baselines taken as known)."""
    n_connected: int | None = None
    """How many of the ``n_edges`` lie on a path of kept edges from the input to the output
    (:meth:`Graph.connected`): an edge-pruning circuit may keep edges off every such path,
    which in a decoder with the corrupted fill change nothing, so compare circuits' sizes by
    this count (an attribution circuit selected ``connected`` has ``n_connected == n_edges``)."""

    def as_dict(self) -> dict[str, float]:
        return {**asdict(self), "small_gap": self.gap_is_small}

    @property
    def gap_is_small(self) -> bool:
        """Whether faithfulness, which divides by ``full - empty``, is mostly noise
        (:func:`gap_is_small`)."""
        return gap_is_small(self.full, self.empty, self.gap_se)


def gap_is_small(full: float, empty: float, gap_se: float = float("nan")) -> bool:
    """Whether the gap between the full model's metric and the empty circuit's is too small
    to divide by: zero or not finite, under a tenth of the metric's larger magnitude
    (``|full - empty| <= 0.1 * max(|full|, |empty|)``), or within two standard errors
    ``gap_se`` of zero (the fill does not measurably move the metric; this also covers a
    chance-level model whose full and empty values straddle 0). A sanity bound on the data,
    not a result: say so next to the number."""
    gap = abs(full - empty)
    if not math.isfinite(gap) or gap == 0:
        return True
    if gap <= SMALL_GAP * max(abs(full), abs(empty)):
        return True
    return math.isfinite(gap_se) and gap <= 2 * gap_se


def _masked_metric(
    model: HookedModel, mask: EdgeMask, pairs: PromptPairs, metric: Metric, batch_size: int
) -> tuple[torch.Tensor, float]:
    """Per-example metric and mean KL to the full model of ``mask`` on ``pairs``."""
    return masked_metrics(model, [mask], pairs, metric, batch_size)[0][0]


def masked_metrics(
    model: HookedModel,
    masks: Sequence[EdgeMask] | Sequence[OutputMask],
    pairs: PromptPairs,
    metric: Metric,
    batch_size: int,
    progress: bool = False,
) -> tuple[list[tuple[torch.Tensor, float]], torch.Tensor]:
    """For each of ``masks`` (one graph and fill; edge masks, or output masks: MIB's neuron
    level), the per-example metric and mean KL to the full model on ``pairs``; and the full
    model's per-example metric. Each batch's full run and corrupted recording are made once,
    for every mask."""
    if len({(id(m.graph), m.fill, type(m)) for m in masks}) > 1:
        raise ConfigError("masked_metrics takes masks of one kind, graph and fill")
    values: list[list[torch.Tensor]] = [[] for _ in masks]
    kls = [0.0] * len(masks)
    full = []
    with torch.no_grad():
        batches = pairs.batches(batch_size)
        for batch in tqdm(batches, desc="circuits", disable=not progress, leave=False):
            reference = metric_logits(model, batch, metric)  # kl_divergence reads answer_logits
            full.append(metric(reference, batch).detach().double().cpu())
            for k, applied in enumerate(_batch_runs(model, masks, batch)):
                with applied:
                    logits = metric_logits(model, batch, metric)
                values[k].append(metric(logits, batch).detach().double().cpu())
                kls[k] += float(kl_divergence(logits, reference, batch).sum())
    results = [(torch.cat(v), kl / len(pairs)) for v, kl in zip(values, kls, strict=True)]
    return results, torch.cat(full)


def _batch_runs(
    model: HookedModel, masks: Sequence[EdgeMask] | Sequence[OutputMask], batch: PromptPairs
) -> Iterator[contextlib.AbstractContextManager[Any]]:
    """Each mask applied on ``batch`` (a ``with`` block each), the corrupted run recorded once:
    for edge masks as the fused forward reads it, for output masks every sender's output."""
    first = masks[0]
    if isinstance(first, OutputMask):
        outputs = node_outputs(model, first.graph, **batch.corrupted)
        for mask in masks:
            bound = mask.with_corrupted(outputs) if mask.fill == "corrupted" else mask
            yield hooked(model, bound.hooks(model))
        return
    run = (
        record_corrupted(model, first.graph, **batch.corrupted)
        if first.fill == "corrupted"
        else None
    )
    for mask in masks:
        assert isinstance(mask, EdgeMask)  # one kind: masked_metrics checked
        yield _edge_masked(model, mask, run)


@contextlib.contextmanager
def _edge_masked(model: HookedModel, mask: EdgeMask, run: Any) -> Iterator[None]:
    with graph_switches(model), hooked(model, masked_hooks(model, mask, corrupted=run)):
        yield


def circuit_baselines(
    model: HookedModel,
    graph: Graph,
    fill: str,
    means: Float[torch.Tensor, "sender d_model"] | None,
    pairs: PromptPairs,
    metric: Metric = logit_difference,
    batch_size: int = 16,
) -> tuple[float, float, float]:
    """Mean metric of the full model and of the empty circuit (every edge carries ``fill``)
    on ``pairs``, and the standard error of their per-example gap (see
    :func:`gap_is_small`)."""
    empty_mask = EdgeMask.empty(graph, fill, means=means)
    [(empty, _)], full = masked_metrics(model, [empty_mask], pairs, metric, batch_size)
    gap = full - empty
    se = float(gap.std() / math.sqrt(len(gap))) if len(gap) > 1 else float("nan")
    return float(full.mean()), float(empty.mean()), se


def evaluate_circuit(
    model: HookedModel,
    mask: EdgeMask,
    pairs: PromptPairs,
    metric: Metric = logit_difference,
    batch_size: int = 16,
    baselines: tuple[float, float] | tuple[float, float, float] | None = None,
) -> CircuitScore:
    """Faithfulness and KL of the circuit ``mask`` on ``pairs`` (held-out examples).

    ``baselines``: the full and empty circuits' metrics (and the standard error of their
    gap), when already known.
    """
    if baselines is None:
        baselines = circuit_baselines(model, mask.graph, mask.fill, mask.means, pairs, metric,
                                      batch_size)  # fmt: skip
    full, empty = baselines[0], baselines[1]
    gap_se = baselines[2] if len(baselines) > 2 else float("nan")
    values, kl = _masked_metric(model, mask, pairs, metric, batch_size)
    value = float(values.mean())
    span = full - empty
    spread = float(values.std() / math.sqrt(len(values))) if len(values) > 1 else math.nan
    return CircuitScore(
        n_edges=mask.n_kept,
        fraction=mask.n_kept / mask.graph.n_edges,
        metric=value,
        full=full,
        empty=empty,
        faithfulness=(value - empty) / span if span != 0 else float("nan"),
        kl=kl,
        gap_se=gap_se,
        faithfulness_se=spread / abs(span) if span != 0 else float("nan"),
        n_connected=int(mask.graph.connected(mask.weights > 0.5).sum()),
    )


def faithfulness_curve(
    model: HookedModel,
    scores: EdgeScores,
    pairs: PromptPairs,
    fractions: Sequence[float] = CURVE_FRACTIONS,
    metric: Metric = logit_difference,
    fill: str = "corrupted",
    means: Float[torch.Tensor, "sender d_model"] | None = None,
    batch_size: int = 16,
    progress: bool = True,
    selection: str = "greedy",
    *,
    signed: bool = False,
    connected: bool = True,
) -> list[CircuitScore]:
    """Circuits of ``scores`` judged for each fraction of edges (at most that fraction when
    ``connected``): ``selection`` ``greedy`` or ``top-k``, by ``|score|`` or ``signed``
    (:func:`~mi_core.circuits.attribution.select_circuit`)."""
    if not fractions or any(not 0.0 <= f <= 1.0 for f in fractions):
        raise ConfigError(f"curve fractions must lie in [0, 1], got {list(fractions)}")
    graph = scores.graph
    baselines = circuit_baselines(model, graph, fill, means, pairs, metric, batch_size)
    rows = []
    for fraction in tqdm(sorted(fractions), desc="faithfulness", disable=not progress):
        k = round(fraction * graph.n_edges)
        mask = select_circuit(graph, scores.scores, k, selection, signed=signed,
                              connected=connected, fill=fill, means=means)  # fmt: skip
        rows.append(evaluate_circuit(model, mask, pairs, metric, batch_size, baselines))
    return rows


def curve_area(rows: Sequence[CircuitScore], key: str = "faithfulness") -> float:
    """Trapezoid area under ``key`` against the fraction of edges kept, over the fractions
    evaluated (add 0 and 1 to the fractions for the whole range). Of faithfulness: the MIB
    benchmark's circuit performance ratio (CPR; higher is better, and a circuit that
    overshoots the model scores higher still)."""
    return _trapezoid(sorted((r.fraction, getattr(r, key)) for r in rows))


def curve_difference(rows: Sequence[CircuitScore]) -> float:
    """Trapezoid area under ``|1 - faithfulness|`` against the fraction of edges kept: the MIB
    benchmark's circuit-model difference (CMD; lower is better: a circuit that undershoots
    or overshoots the model is penalised alike)."""
    return _trapezoid(sorted((r.fraction, abs(1.0 - r.faithfulness)) for r in rows))


def _trapezoid(points: Sequence[tuple[float, float]]) -> float:
    """The trapezoid area; NaN for a curve of fewer than two distinct fractions (it has no area,
    and 0 read as a perfect CMD)."""
    if len({x for x, _ in points}) < 2:
        return float("nan")
    return sum(
        (x1 - x0) * (y0 + y1) / 2 for (x0, y0), (x1, y1) in zip(points, points[1:], strict=False)
    )


def to_mib(
    graph: Graph, scores: Float[torch.Tensor, " edge"], kept: EdgeMask | None = None,
    node_scores: Float[torch.Tensor, " sender"] | None = None, **info: Any,
) -> dict[str, Any]:  # fmt: skip
    """A circuit in the MIB circuit-localisation format: every edge by its MIB name
    (``a0.h1->a2.h5<q>``) with its score and whether it is in the circuit; every node with
    whether it is in it (a node is in when an edge of the circuit touches it) and, given
    ``node_scores`` (MIB's sign), its score (none for a NaN: MIB's unscored node)."""
    in_graph = kept.weights > 0.5 if kept is not None else torch.ones(graph.n_edges, dtype=bool)
    edges = {}
    nodes = {to_mib_name(f"{s}->output").split("->")[0]: False for s in graph.senders}
    nodes["logits"] = False
    for i, name in enumerate(graph.edge_names):
        mib = to_mib_name(name)
        edges[mib] = {"score": float(scores[i]), "in_graph": bool(in_graph[i])}
        if in_graph[i]:
            sender, receiver = mib.split("->")
            nodes[sender] = True
            nodes[receiver.split("<")[0]] = True
    # what EAP-IG's Graph.from_json rebuilds the graph from (MIB's loader); a parallel
    # family's graph has no edge from a layer's heads to its own MLP there either
    cfg = {"n_layers": graph.n_layers, "n_heads": graph.n_heads,
           "parallel_attn_mlp": graph.parallel, "d_model": graph.d_model, **info}  # fmt: skip
    node_dict: dict[str, dict[str, Any]] = {k: {"in_graph": v} for k, v in nodes.items()}
    if node_scores is not None and node_scores.ndim == 2:
        raise ConfigError(
            "neuron scores go in a .pt file (submit's mib_pt): MIB's Graph.from_json writes "
            "each head's neurons into every head of its layer"
        )
    elif node_scores is not None:
        for name, value in zip(list(node_dict)[: graph.n_senders], node_scores.tolist(),
                               strict=True):  # fmt: skip
            if not math.isnan(value):
                node_dict[name]["score"] = value
    return {"cfg": cfg, "nodes": node_dict, "edges": edges}


def mib_scores(scores: Float[torch.Tensor, " edge"], method: str) -> Float[torch.Tensor, " edge"]:
    """Scores as MIB ranks them: its evaluator re-ranks every level by ``score`` (by ``|score|``
    only with ``--absolute``), and its attribution scores are taken against the loss
    (``-metric``). mi_core's attribution scores are against the metric, so they are negated;
    edge-pruning gates (``method`` ``edge-pruning``: log_alpha) are shifted to be positive, so
    both rankings keep the gates' order."""
    scores = scores.detach().double().cpu()
    if method == "edge-pruning":
        return scores - scores.min() + 1e-3
    return -scores


def write_mib(path: str | os.PathLike[str], graph: Graph, scores: Float[torch.Tensor, " edge"],
              kept: EdgeMask | None = None, **info: Any) -> Path:  # fmt: skip
    """Write :func:`to_mib` as JSON, atomically."""
    return write_json(path, to_mib(graph, scores, kept, **info))
