"""Node- and neuron-level circuits: a score per node (a graph's sender: the input, each head,
each MLP), or per node and dimension of its output (MIB's neurons).

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

MIB's neuron level ranks the ``d_model`` dimensions of every node's output and patches those
outside the circuit, wherever the output goes (an
:class:`~mi_core.interventions.edges.OutputMask`). :func:`neuron_attribution` scores them with
EAP or EAP-IG: a dimension's activation difference times the metric's gradient at the node's
output (a head's: the gradient at its layer's attention output, which every head of the layer
writes into); summed over the dimensions it is the node score of the edges (tested).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from jaxtyping import Bool, Float
from tqdm.auto import tqdm

from mi_core.circuits.attribution import EdgeScores, fill_outputs, ig_alphas
from mi_core.circuits.config import MIB_LEVELS
from mi_core.circuits.evaluate import mib_scores
from mi_core.circuits.metrics import Metric, logit_difference, metric_logits
from mi_core.data.circuit_pairs import PromptPairs
from mi_core.errors import ConfigError, InterventionError
from mi_core.interventions.edges import Graph, node_outputs
from mi_core.io import read_safetensors, write_safetensors
from mi_core.models.hook_context import hooked
from mi_core.models.hooks import act_name
from mi_core.pruning.discretize import unflatten_components
from mi_core.pruning.sweeps import load_sweep

if TYPE_CHECKING:
    from mi_core.models.types import HookedModel

__all__ = ["NODE_SCORES_KIND", "NodeScores", "load_scores", "mib_neuron_circuits",
           "mib_node_circuits", "neuron_attribution", "scores_at_level"]  # fmt: skip

#: The ``kind`` in the metadata of a saved :class:`NodeScores`.
NODE_SCORES_KIND = "mi_core.NodeScores"

#: Attribution methods whose edge scores sum to their node scores (linear in the gradient).
_SUMMABLE = ("eap", "eap-ig")


@dataclass(frozen=True)
class NodeScores:
    """A score per sender of ``graph`` (``[sender]``), or per sender and output dimension
    (``[sender, d_model]``: MIB's neurons); NaN: not scored, kept in every circuit."""

    graph: Graph
    scores: Float[torch.Tensor, " sender *d_model"]
    method: str
    n_examples: int = 0
    """The pairs the scores were found on (:meth:`from_subnetworks`: the subnetworks)."""
    mib_sign: bool = False
    """Whether higher already means more important (the heuristic core's shares, a ranking of
    one's own); else the scores are an attribution's, in mi_core's sign."""

    def __post_init__(self) -> None:
        shapes = ((self.graph.n_senders,), (self.graph.n_senders, self.graph.d_model))
        if tuple(self.scores.shape) not in shapes:
            raise InterventionError(
                f"{list(self.scores.shape)} node scores for {self.graph}: expected "
                f"[{self.graph.n_senders}] (nodes) or [{self.graph.n_senders}, "
                f"{self.graph.d_model}] (neurons)"
            )

    @property
    def level(self) -> str:
        """``node`` or ``neuron`` (a score per output dimension)."""
        return "neuron" if self.scores.ndim == 2 else "node"

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
        return cls(graph, scores, "heuristic-core", len(sweep.masks), mib_sign=True)

    def per_node(self) -> NodeScores:
        """These scores per node: a neuron level's summed over each output's dimensions."""
        if self.level == "node":
            return self
        return replace(self, scores=self.scores.sum(-1))

    def ranked(self) -> Float[torch.Tensor, " sender *d_model"]:
        """The scores in MIB's sign (NaN stays NaN)."""
        scores = self.scores.detach().double().cpu()
        return scores if self.mib_sign else mib_scores(scores, self.method)

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the scores as safetensors, atomically; :func:`load_scores` reads them back."""
        metadata = {"kind": NODE_SCORES_KIND, "graph": json.dumps(self.graph.to_dict()),
                    "method": self.method, "n_examples": str(self.n_examples),
                    "mib_sign": json.dumps(self.mib_sign)}  # fmt: skip
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
            count, sign = int(metadata["n_examples"]), json.loads(metadata["mib_sign"])
            return NodeScores(graph, tensors["scores"].double(), metadata["method"], count, sign)
    return EdgeScores.load(path)  # a missing or foreign file: its one line


def scores_at_level(
    scores: EdgeScores | NodeScores, level: str, source: str
) -> EdgeScores | NodeScores:
    """``scores`` as MIB's ``level`` ranks them: edge scores at the edge level; edge or neuron
    scores summed per node at the node level; neuron scores at the neuron level. Anything else
    is refused in one line naming ``source`` (a file, or the scores' method)."""
    if level not in MIB_LEVELS:
        raise ConfigError(f"level must be one of {', '.join(MIB_LEVELS)}, not {level!r}")
    if level == "node":
        return (
            scores.per_node() if isinstance(scores, NodeScores) else NodeScores.from_edges(scores)
        )
    if level == "edge" and isinstance(scores, NodeScores):
        raise ConfigError(
            f"{source} holds {scores.level} scores, which rank nodes, not edges: use level "
            f"{scores.level}"
        )
    if level == "neuron" and not (isinstance(scores, NodeScores) and scores.level == "neuron"):
        raise ConfigError(
            f"{source} holds no score per output dimension: mi-core circuit attribute --neurons "
            "writes them (neuron_attribution)"
        )
    return scores


def mib_node_circuits(
    scores: NodeScores,
    absolute: bool,
    percentages: Sequence[float],
) -> list[Bool[torch.Tensor, " edge"]]:
    """The kept edges of MIB's node-level circuit at each percentage: the top ``int(pct *
    n_scored)`` nodes by MIB's ranking (``|score|`` with ``absolute``), every unscored node,
    and the edges among them and into the output."""
    if scores.level != "node":
        raise InterventionError("neuron scores make neuron-level circuits (mib_neuron_circuits)")
    return [scores.graph.node_edges(kept) for kept in _top(scores, absolute, percentages)]


def mib_neuron_circuits(
    scores: NodeScores,
    absolute: bool,
    percentages: Sequence[float],
) -> list[Bool[torch.Tensor, "sender d_model"]]:
    """The kept output dimensions of MIB's neuron-level circuit at each percentage: the top
    ``int(pct * n_scored)`` by MIB's ranking, and every unscored one."""
    if scores.level != "neuron":
        raise InterventionError("node scores make node-level circuits (mib_node_circuits)")
    return _top(scores, absolute, percentages)


def _top(scores: NodeScores, absolute: bool, percentages: Sequence[float]) -> list[torch.Tensor]:
    """For each percentage, the top ``int(pct * n_scored)`` entries of ``scores`` by MIB's
    ranking and every unscored one, as booleans of the scores' shape."""
    ranked = scores.ranked().reshape(-1)
    scored = ~torch.isnan(ranked)
    key = ranked.abs() if absolute else ranked.clone()
    key[~scored] = -math.inf
    order = torch.argsort(key, descending=True, stable=True)
    kept = []
    for pct in percentages:
        chosen = ~scored.clone()
        chosen[order[: int(pct * int(scored.sum()))]] = True
        kept.append(chosen.reshape(scores.scores.shape))
    return kept


def neuron_attribution(
    model: HookedModel, pairs: PromptPairs, method: str = "eap-ig", *, steps: int = 5,
    ig_rule: str = "left", metric: Metric = logit_difference, fill: str = "corrupted",
    means: Float[torch.Tensor, "sender d_model"] | None = None, batch_size: int = 16,
    progress: bool = True,
) -> NodeScores:  # fmt: skip
    """EAP or EAP-IG (``method``) scores of every output dimension of every node on ``pairs``
    (``[sender, d_model]``, averaged over the examples; module docstring): the fill's output
    minus the clean one, times the metric's gradient at the node's output, averaged over
    EAP-IG's points between the fill's input and the clean one (:func:`ig_alphas`)."""
    if method not in _SUMMABLE:
        raise InterventionError(f"neuron attribution is {' or '.join(_SUMMABLE)}, not {method!r}")
    graph = Graph.from_model(model)
    alphas = ig_alphas(steps if method == "eap-ig" else 1, ig_rule)
    param = next(model.parameters())
    total = torch.zeros(graph.n_senders, graph.d_model, dtype=torch.float64, device=param.device)
    for batch in tqdm(list(pairs.batches(batch_size)), desc=method, disable=not progress):
        clean = node_outputs(model, graph, **batch.clean)
        reference = fill_outputs(model, graph, batch, fill, means)
        diff = reference - clean
        for alpha in alphas:
            grads = _output_gradients(model, graph, batch, metric, clean[0], reference[0], alpha)
            total += torch.einsum("sbpd,sbpd->sd", diff.double(), grads.double()) / len(alphas)
    scores = (total / len(pairs)).cpu()
    return NodeScores(graph, scores, method, len(pairs))


def _output_gradients(
    model: HookedModel, graph: Graph, batch: PromptPairs, metric: Metric,
    clean_input: torch.Tensor, reference_input: torch.Tensor, alpha: float,
) -> Float[torch.Tensor, "sender batch pos d_model"]:  # fmt: skip
    """The summed metric's gradient at every sender's output, the input set to the point
    ``alpha`` of the way from ``reference_input`` to ``clean_input``."""
    seen: dict[str, torch.Tensor] = {}
    point = reference_input + alpha * (clean_input - reference_input)

    def start(x: torch.Tensor, hook: Any) -> torch.Tensor:
        seen[hook.name] = point.detach().to(x).requires_grad_(True)
        return seen[hook.name]

    def keep(x: torch.Tensor, hook: Any) -> None:
        seen[hook.name] = x

    names = [act_name(kind, layer) for layer in range(graph.n_layers)
             for kind in ("attn_out", "mlp_out")]  # fmt: skip
    hooks = [(act_name("resid_pre", 0), start), *[(name, keep) for name in names]]
    with torch.enable_grad(), hooked(model, hooks):
        value = metric(metric_logits(model, batch, metric), batch).sum()
        grads = torch.autograd.grad(
            value, [seen[act_name("resid_pre", 0)], *[seen[n] for n in names]]
        )
    out = [grads[0]]
    for layer in range(graph.n_layers):  # every head of a layer has its attention output's
        out += [grads[1 + 2 * layer]] * graph.n_heads + [grads[2 + 2 * layer]]
    return torch.stack(out)
