"""Node-level circuits: a score per node (a graph's sender: the input, each head, each MLP).

MIB's node level ranks nodes, keeps the top ``int(pct * n_scored)`` (a node without a score,
NaN, is always kept), and patches every node outside from the counterfactual prompt; the
circuit is the edges among the kept nodes and into the output
(:meth:`~mi_core.interventions.edges.Graph.node_edges`). Node scores come from

- an attribution's edge scores (:meth:`NodeScores.from_edges`): a node's score is the sum of
  its outgoing edges' scores. For EAP and EAP-IG that *is* the node's attribution, the
  activation difference at its output times the metric's gradient there, because the
  gradient at a node's output is the sum of the gradients at every input it feeds (tested
  against a plain backward pass). MIB's own node attribution (``eap.attribute_node``) takes
  an MLP's gradient at the MLP's *input* instead (its hooks use the MLP's ``in_hook``), so its
  MLP scores differ from these; its heads' and input's are the same;
- the heuristic core's subnetworks (:meth:`NodeScores.from_subnetworks`): how many of a
  sweep's subnetworks keep each head and MLP, ties broken by the runs' gates; the input, which
  those subnetworks never prune, is left unscored (always kept).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from jaxtyping import Bool, Float

from mi_core.circuits.attribution import EdgeScores
from mi_core.circuits.evaluate import mib_scores
from mi_core.errors import InterventionError
from mi_core.interventions.edges import Graph
from mi_core.io import read_safetensors, write_safetensors

__all__ = ["NODE_SCORES_KIND", "NodeScores", "load_scores", "mib_node_circuits"]

#: The ``kind`` in the metadata of a saved :class:`NodeScores`.
NODE_SCORES_KIND = "mi_core.NodeScores"

#: Attribution methods whose edge scores sum to their node scores (linear in the gradient).
_SUMMABLE = ("eap", "eap-ig")


@dataclass(frozen=True)
class NodeScores:
    """A score per sender of ``graph`` (NaN: not scored, kept in every circuit): an
    attribution's in mi_core's sign (against the metric), or, when :attr:`mib_sign`, a score
    where higher means more important."""

    graph: Graph
    scores: Float[torch.Tensor, " sender"]
    method: str
    n_examples: int = 0

    def __post_init__(self) -> None:
        if self.scores.shape != (self.graph.n_senders,):
            raise InterventionError(
                f"{list(self.scores.shape)} node scores for {self.graph} "
                f"({self.graph.n_senders} nodes)"
            )

    @classmethod
    def from_edges(cls, edges: EdgeScores) -> NodeScores:
        """Each node's outgoing edges' scores summed (the node's own EAP / EAP-IG
        attribution: module docstring)."""
        if edges.method not in _SUMMABLE:
            raise InterventionError(
                f"{edges.method} scores are not additive over a node's edges; node scores come "
                f"from {' or '.join(_SUMMABLE)} attribution"
            )
        dense = edges.graph.to_dense(edges.scores.detach().double().cpu())
        return cls(edges.graph, dense.sum(dim=1), edges.method, edges.n_examples)

    @classmethod
    def from_subnetworks(cls, graph: Graph, sweep_dir: str | os.PathLike[str]) -> NodeScores:
        """The heuristic core's node ranking from the pruning runs under ``sweep_dir`` (``mi-core
        sweep`` / the experiment's ``sweep``): the share of the subnetworks that keep each head
        and MLP, ties broken by the mean ``sigmoid(log_alpha)`` of the runs' final gates
        (weighted below one subnetwork's share, so the count decides first). The input is
        unscored: those subnetworks never remove it."""
        from mi_core.pruning.discretize import unflatten_components
        from mi_core.pruning.sweeps import load_sweep

        sweep = load_sweep(sweep_dir)
        n_layers, n_heads = sweep.masks[0].n_layers, sweep.masks[0].n_heads
        if (n_layers, n_heads) != (graph.n_layers, graph.n_heads):
            raise InterventionError(
                f"the subnetworks in {sweep_dir} are of {n_layers} layers x {n_heads} heads; "
                f"the graph is {graph}"
            )
        kept = torch.stack([_flat(m.heads, m.mlps) for m in sweep.masks]).double()
        gates = []
        for run_dir in sweep.runs["run_dir"]:
            checkpoint = Path(run_dir) / "checkpoint.safetensors"
            if checkpoint.is_file():
                log_alpha = read_safetensors(checkpoint)[0]["log_alpha"].double()
                gates.append(_flat(*unflatten_components(log_alpha, n_layers, n_heads)))
        tie_break = torch.stack(gates).sigmoid().mean(0) if gates else torch.zeros(kept.shape[1])
        per_component = kept.mean(0) + tie_break / (len(sweep.masks) + 1)
        scores = torch.full((graph.n_senders,), math.nan, dtype=torch.float64)
        scores[1:] = per_component  # the senders after the input are each layer's heads, MLP
        return cls(graph, scores, "heuristic-core", len(sweep.masks))

    @property
    def mib_sign(self) -> bool:
        """Whether higher already means more important (the heuristic core's shares)."""
        return self.method == "heuristic-core"

    def ranked(self) -> Float[torch.Tensor, " sender"]:
        """The scores in MIB's sign (NaN stays NaN)."""
        scores = self.scores.detach().double().cpu()
        return scores if self.mib_sign else mib_scores(scores, self.method)

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the scores as safetensors, atomically; :func:`load_scores` reads them back."""
        metadata = {"kind": NODE_SCORES_KIND, "graph": json.dumps(self.graph.to_dict()),
                    "method": self.method, "n_examples": str(self.n_examples)}  # fmt: skip
        return write_safetensors(path, {"scores": self.scores.double().cpu()}, metadata)


def _flat(
    heads: Float[torch.Tensor, "n_layers n_heads"], mlps: Float[torch.Tensor, " n_layers"]
) -> Float[torch.Tensor, " component"]:
    """Per layer its heads then its MLP: the graph's sender order after the input."""
    return torch.cat([heads.double(), mlps.double()[:, None]], dim=1).reshape(-1)


def load_scores(path: str | os.PathLike[str]) -> EdgeScores | NodeScores:
    """Edge scores (:meth:`EdgeScores.save`) or node scores (:meth:`NodeScores.save`) from
    the file at ``path``."""
    if Path(path).is_file():
        tensors, metadata = read_safetensors(path)
        if metadata.get("kind") == NODE_SCORES_KIND:
            graph = Graph(**json.loads(metadata["graph"]))
            return NodeScores(graph, tensors["scores"].double(), metadata["method"],
                              int(metadata.get("n_examples", "0")))  # fmt: skip
    return EdgeScores.load(path)  # a missing or foreign file: its one line


def mib_node_circuits(
    scores: NodeScores,
    absolute: bool,
    percentages: Sequence[float],
) -> list[Bool[torch.Tensor, " edge"]]:
    """The kept edges of MIB's node-level circuit at each percentage: the top ``int(pct *
    n_scored)`` nodes by MIB's ranking (``|score|`` with ``absolute``), every unscored node,
    and the edges among them and into the output."""
    ranked = scores.ranked()
    scored = ~torch.isnan(ranked)
    key = ranked.abs() if absolute else ranked.clone()
    key[~scored] = -math.inf
    order = torch.argsort(key, descending=True, stable=True)
    circuits = []
    for pct in percentages:
        nodes = ~scored.clone()
        nodes[order[: int(pct * int(scored.sum()))]] = True
        circuits.append(scores.graph.node_edges(nodes))
    return circuits
