"""Edge pruning (Bhaskar, Wettig, Friedman and Chen 2024): hard-concrete masks over every edge.

Each edge gets a hard-concrete gate (:mod:`mi_core.pruning.hard_concrete`); a step samples
the gates, runs the model with those edge weights (removed edges fed the corrupted run's
activation, the mean or zero; :class:`~mi_core.interventions.edges.EdgeMask`), and descends on

    KL(full model || masked model) + lambda1 (t - s) + lambda2 (t - s)^2

(or another objective of :mod:`mi_core.pruning.objectives` that compares answer logits,
``EdgePruneSettings.objective``: ``logit_diff``) with ``t`` the sampled edge sparsity
(``1 - sum(z) / n_edges``, as the authors' code measures it), ``s`` the target ramped linearly
over ``sparsity_warmup_steps``, and the lambdas ascended (the Lagrangian controller of
:mod:`mi_core.pruning.lagrangian`). The defaults are the authors' IOI recipe
(``princeton-nlp/Edge-Pruning``, ``run_scripts/ioi_sweep.sh``): log_alpha from N(10, 0.01),
AdamW (weight decay 0.01) with learning rate 0.8 for the gates and the lambdas, warmed up over
200 steps and decayed linearly to 0, 3,000 steps of 32 with the target reached at step 2,500.
The circuit is then discretised *exactly*: the ``round((1 - s) * n_edges)`` edges of highest
log_alpha are kept.

**Node masks** (``node_sparsity``, the authors' node loss): every sender (the input
embedding, each head, each MLP) gets a gate of its own too; an edge carries its sender's
output with weight ``z_edge * z_node`` (the corrupted / mean / zero value otherwise), and a
second Lagrangian term with its own lambdas pulls the sampled node sparsity to its target
(ramped over the same steps). At discretisation the ``round((1 - node_sparsity) * n_senders)``
nodes of highest log_alpha are kept first, then the edges of highest log_alpha among those
leaving a kept node (all of them, if fewer than the edge target leaves). The authors' IOI runs
keep the node masks but switch their loss off; without ``node_sparsity`` there are none.

The run is the one mask-learning loop's (:mod:`mi_core.pruning.loop`) with the edge kind of
mask (:class:`Edges`): its schedules, clipping, checkpoint and resumption are every kind's.
With ``out`` it saves its state every ``checkpoint_every`` steps and resumes from there;
random draws and the data order are functions of (seed, step), so a resumed run takes the
same steps as one never stopped. A state of other settings, inputs or an older mi_core is
refused, not resumed.
"""

from __future__ import annotations

import os
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from jaxtyping import Float

from mi_core.buffers import reusing_buffers
from mi_core.circuits.attribution import EdgeScores
from mi_core.circuits.config import EdgePruneSettings
from mi_core.circuits.evaluate import mib_scores
from mi_core.circuits.metrics import answer_logits, metric_logits
from mi_core.data.circuit_pairs import PromptPairs
from mi_core.errors import ConfigError, InterventionError, TrainingError
from mi_core.interventions.edges import EdgeMask, Graph, graph_switches, top_k_order
from mi_core.interventions.edges._engine import masked_hooks, record_corrupted
from mi_core.models.fingerprint import tensor_fingerprint, weights_fingerprint
from mi_core.models.hook_context import hooked
from mi_core.pruning.checkpoint import checkpoint_log
from mi_core.pruning.hard_concrete import HardConcrete, hard_concrete_prob_nonzero
from mi_core.pruning.lagrangian import LagrangianController, lagrangian_penalty, sampled_sparsity
from mi_core.pruning.loop import start_run, train_group
from mi_core.pruning.mask_kinds import MaskKind
from mi_core.pruning.objectives import Objective, Targets, answer_objective
from mi_core.pruning.schedule import target_sparsity_at
from mi_core.pruning.step import StepMember
from mi_core.seeding import derive_seed

if TYPE_CHECKING:
    from collections.abc import Iterator

    from mi_core.models.types import HookedModel

__all__ = ["EdgePruneResult", "EdgePruneSettings", "Edges", "discretize_circuit", "prune_edges"]

#: The run's checkpoint in its folder (``log.csv`` beside it repeats its rows for reading).
STATE_FILE = "edge_prune_state.safetensors"


@dataclass
class EdgePruneResult:
    """The pruned circuit, its gates and the run's trace."""

    circuit: EdgeMask
    log_alpha: Float[torch.Tensor, " edge"]
    history: list[dict[str, float]]
    node_log_alpha: Float[torch.Tensor, " sender"] | None = None
    """The node gates' log_alpha (with node masks)."""
    nodes: list[str] | None = None
    """The nodes kept (with node masks): sender names, ``input``, ``L0.H3``, ``L1.MLP``."""

    @property
    def sparsity(self) -> float:
        return self.circuit.sparsity


def _batch_indices(n: int, batch_size: int, seed: int, step: int) -> torch.Tensor:
    """The examples of ``step``: consecutive slices of a per-epoch permutation."""
    per_epoch = max(1, n // batch_size)
    epoch, offset = divmod(step, per_epoch)
    order = torch.randperm(
        n, generator=torch.Generator().manual_seed(derive_seed("circuit", "order", seed, epoch))
    )
    if batch_size >= n:
        return order
    return order[offset * batch_size : (offset + 1) * batch_size]


def discretize_circuit(
    graph: Graph,
    log_alpha: Float[torch.Tensor, " edge"],
    sparsity: float,
    node_log_alpha: Float[torch.Tensor, " sender"] | None = None,
    node_sparsity: float | None = None,
) -> tuple[Float[torch.Tensor, " edge"], list[str] | None]:
    """0/1 edge weights keeping ``round((1 - sparsity) * n_edges)`` edges of highest log_alpha;
    with node gates, only among the edges leaving the ``round((1 - node_sparsity) *
    n_senders)`` nodes of highest node log_alpha (which are returned by name)."""
    keep = round((1.0 - sparsity) * graph.n_edges)
    candidates = torch.ones(graph.n_edges, dtype=torch.bool)
    nodes = None
    if node_log_alpha is not None and node_sparsity is not None:
        n_nodes = round((1.0 - node_sparsity) * graph.n_senders)
        order = torch.argsort(node_log_alpha.detach().cpu().float(), descending=True, stable=True)
        kept_nodes = torch.zeros(graph.n_senders, dtype=torch.bool)
        kept_nodes[order[:n_nodes]] = True
        candidates = kept_nodes[graph.edges[:, 0]]
        nodes = [graph.senders[i] for i in sorted(order[:n_nodes].tolist())]
    key = log_alpha.detach().cpu().float().masked_fill(~candidates, float("-inf"))
    keep = min(keep, int(candidates.sum()))
    weights = torch.zeros(graph.n_edges)
    weights[torch.argsort(key, descending=True, stable=True)[:keep]] = 1.0
    return weights, nodes


def _inputs_key(
    model: HookedModel, pairs: PromptPairs, means: torch.Tensor | None
) -> dict[str, str | None]:
    """What a run learns from besides its settings: the model's weights, the pairs and the mean
    fill's means."""
    ids = torch.stack([pairs.clean_ids, pairs.corrupted_ids])
    return {"model": weights_fingerprint(model), "pairs": tensor_fingerprint(ids),
            "means": None if means is None else tensor_fingerprint(means)}  # fmt: skip


class _PairOrder:
    """The edge run's data order: micro-batch ``k``'s examples (:func:`_batch_indices`)."""

    def __init__(self, n: int, batch_size: int, seed: int) -> None:
        self.n, self.batch_size, self.seed = n, batch_size, seed

    def indices(self, k: int) -> list[int]:
        return _batch_indices(self.n, self.batch_size, self.seed, k).tolist()


class EdgeController(LagrangianController):
    """The edge sparsity's lambdas, and (with node masks) the node sparsity's
    (``node_lambda_1``, ``node_lambda_2``: the authors' second Lagrangian term)."""

    def __init__(self, nodes: bool) -> None:
        super().__init__()
        self.nodes = nodes
        if nodes:
            self.node_lambda_1 = torch.nn.Parameter(torch.zeros(()))
            self.node_lambda_2 = torch.nn.Parameter(torch.zeros(()))

    def node_penalty(
        self, sparsity: Float[torch.Tensor, ""], target: float
    ) -> Float[torch.Tensor, ""]:
        """The node term: ``node_lambda_1 (t - s) + node_lambda_2 (t - s)^2``."""
        return lagrangian_penalty(self.node_lambda_1, self.node_lambda_2, sparsity, target)


class Edges(MaskKind):
    """One gate per edge of ``graph`` and, with ``settings.node_sparsity``, one per sender after
    them (flat: ``[n_edges + n_senders]``); an edge carries its sender's output with weight
    ``z_edge * z_node``, a removed one ``settings.fill``'s value (the counterfactual prompt's
    activation, the mean or zero). Its step records the batch's counterfactual run first and
    compares answer logits with the full model's (:meth:`Objective.compare`), so it takes
    its own step in the one loop; its runs go one at a time."""

    name = "edges"
    own_step = True
    checkpoint_file = STATE_FILE

    def __init__(
        self, graph: Graph, settings: EdgePruneSettings, means: torch.Tensor | None = None
    ) -> None:
        self.graph, self.settings = graph, settings
        self.means = means if settings.fill == "mean" else None
        self.warm = None
        if settings.warm_start is not None:  # a missing or foreign file: its one line
            warm = EdgeScores.load(settings.warm_start)
            if warm.graph != graph:
                raise ConfigError(
                    f"the warm start {settings.warm_start} scores the edges of {warm.graph}; "
                    f"the model has {graph}"
                )
            self.warm = warm
        self.nodes = settings.node_sparsity is not None
        self._senders = graph.edges[:, 0]

    def n_gates(self, model: HookedModel) -> int:
        return self.graph.n_edges + (self.graph.n_senders if self.nodes else 0)

    def gates(self, cfg: Any, model: HookedModel) -> HardConcrete:
        """log_alpha from N(init_mean, init_std): the edges' drawn first, then the nodes', so
        the edge gates start the same with node masks or without; with a warm start the edges'
        mean is :func:`warm_start_log_alpha` of its scores instead."""
        generator = torch.Generator().manual_seed(derive_seed("circuit", "init", cfg.seed))
        gates = HardConcrete(self.n_gates(model), init_mean=cfg.init_mean)
        sizes = [self.graph.n_edges] + ([self.graph.n_senders] if self.nodes else [])
        noise = torch.cat([torch.randn(n, generator=generator) for n in sizes])
        mean = torch.full_like(noise, cfg.init_mean)
        if self.warm is not None:
            mean[: self.graph.n_edges] = warm_start_log_alpha(
                self.warm, cfg.sparsity, cfg.init_mean
            )
        with torch.no_grad():
            gates.log_alpha.copy_(noise * cfg.init_std + mean)
        return gates

    def controller(self) -> EdgeController:
        return EdgeController(self.nodes)

    def objective(self, name: str, data: Any) -> Objective:
        return answer_objective(name)

    def schedule(self, data: Any, batch_size: int, seed: int) -> _PairOrder:
        return _PairOrder(len(data), batch_size, seed)

    def targets(
        self, model: HookedModel, objective: Objective, data: Any, reference: torch.Tensor | None
    ) -> Targets:
        """The full model's answer logits on every pair, computed once."""
        with torch.no_grad():
            logits = [answer_logits(metric_logits(model, b), b).float() for b in data.batches(64)]
        return Targets(torch.cat(logits))

    def blank(self, model: HookedModel, device: torch.device, fills: Any = None) -> EdgeMask:
        return EdgeMask(
            self.graph, torch.ones(self.graph.n_edges, device=device), self.settings.fill,
            None if self.means is None else self.means.to(device),
        )  # fmt: skip

    def assign(self, mask: EdgeMask, z: Float[torch.Tensor, " gates"]) -> None:
        n = self.graph.n_edges
        weights = z[:n]
        if self.nodes:
            weights = weights * z[n:][self._senders.to(z.device)]
        mask.weights = weights

    @contextmanager
    def applied(self, model: HookedModel, mask: Any, means: Any, fill: str) -> Iterator[EdgeMask]:
        """The graph's switches on; the step's large buffers (corrupted outputs, deltas, their
        gradients) reused from step to step."""
        with ExitStack() as stack:
            stack.enter_context(graph_switches(model))
            stack.enter_context(reusing_buffers(fixed_weights=True))
            yield mask

    def step(self, model, mask, member: StepMember, data, indices, targets, objective, precision):
        """Sample the gates, record the batch's counterfactual run, run the masked model and
        take the backward pass of the objective plus the Lagrangian terms."""
        (index,) = indices  # one micro-batch a step
        index = torch.as_tensor(index)
        batch: PromptPairs = data.select(index)
        z = member.gates.sample(member.noise)
        self.assign(mask, z)
        run = None
        if self.settings.fill == "corrupted":
            run = record_corrupted(model, self.graph, **batch.corrupted)
        with hooked(model, masked_hooks(model, mask, hard_concrete=True, corrupted=run)):
            logits = answer_logits(metric_logits(model, batch), batch)
        assert targets.logits is not None
        full = targets.logits[index.to(targets.logits.device)]
        value = objective.compare(logits.float(), full, batch.answer, batch.distractor).mean()
        n = self.graph.n_edges
        sparsity = sampled_sparsity(z[:n])
        controller = member.controller
        assert isinstance(controller, EdgeController)
        penalty = controller.penalty(sparsity, member.target_sparsity)
        node_sparsity, node_target = [], 0.0
        if self.nodes:
            assert self.settings.node_sparsity is not None
            node_target = target_sparsity_at(
                member.step, self.settings.node_sparsity, self.settings.warmup_steps
            )
            node_sparsity = [sampled_sparsity(z[n:])]
            penalty = penalty + controller.node_penalty(node_sparsity[0], node_target)
        loss = value + penalty
        loss.backward()
        expected = 1.0 - hard_concrete_prob_nonzero(member.gates.log_alpha[:n]).mean()
        keys = ("loss", "objective", "penalty", "sampled_sparsity", "expected_sparsity",
                "lambda_1", "lambda_2")  # fmt: skip
        read = torch.stack(  # the step's one read from the device
            [loss, value, penalty, sparsity, expected, controller.lambda_1, controller.lambda_2,
             *node_sparsity]
        ).detach().tolist()  # fmt: skip
        row: dict[str, float] = dict(zip(keys, read[: len(keys)], strict=True))
        row["target_sparsity"] = member.target_sparsity
        if self.nodes:
            row |= {"node_sparsity": read[-1], "node_target": node_target}
        return row


def warm_start_log_alpha(
    scores: EdgeScores, sparsity: float, scale: float
) -> Float[torch.Tensor, " edge"]:
    """Initial log_alpha from an attribution's ``scores``: ranked by ``|score|`` (MIB's
    absolute ranking), the top ``(1 - sparsity)`` share from ``+scale`` (the first) down to 0
    and the rest from 0 down to ``-scale`` (the last), linearly in rank."""
    order = top_k_order(mib_scores(scores.scores, scores.method), absolute=True)
    n = scores.graph.n_edges
    n_open = max(1, round((1.0 - sparsity) * n))
    rank = torch.empty(n, dtype=torch.float64)
    rank[order] = torch.arange(n, dtype=torch.float64)
    opened = scale * (1.0 - rank / n_open)
    closed = -scale * (rank - n_open + 1) / max(1, n - n_open)
    return torch.where(rank < n_open, opened, closed).float()


def prune_edges(
    model: HookedModel,
    pairs: PromptPairs,
    config: EdgePruneSettings | None = None,
    out: str | os.PathLike[str] | None = None,
    means: torch.Tensor | None = None,
    progress: bool = True,
) -> EdgePruneResult:
    """Learn an edge circuit of ``model`` on ``pairs`` (see the module docstring)."""
    config = config or EdgePruneSettings()
    graph = Graph.from_model(model)
    if config.fill == "mean" and means is None:
        raise InterventionError("fill='mean' needs means (sender_means)")
    kind = Edges(graph, config, means)
    folder = Path(out) if out is not None else None
    if folder is not None:
        folder.mkdir(parents=True, exist_ok=True)
    identity = {"config": config.to_dict(), "inputs": _inputs_key(model, pairs, kind.means)}
    state = start_run(model, pairs, config, folder, None, kind=kind, identity=identity,
                      what="edge-pruning")  # fmt: skip
    train_group(model, None, pairs, None, [state], progress)
    if state.error is not None:
        raise state.error
    log_alpha = state.gates.log_alpha.detach().cpu()
    edges, nodes = log_alpha[: graph.n_edges], log_alpha[graph.n_edges :] if kind.nodes else None
    weights, kept = discretize_circuit(graph, edges, config.sparsity, nodes, config.node_sparsity)
    circuit = EdgeMask(graph, weights, config.fill, kind.means)
    return EdgePruneResult(circuit, edges.clone(), state.rows, nodes, kept)


def load_edge_prune_history(folder: str | os.PathLike[str]) -> list[dict[str, float]]:
    """The rows of a checkpointed run (the loop's ``log.csv`` columns, the objective's under
    its name; ``node_sparsity`` and ``node_target`` with node masks)."""
    path = Path(folder) / STATE_FILE
    try:
        return list(checkpoint_log(path))
    except TrainingError:
        raise ConfigError(
            f"{path} is an edge-pruning state of an older mi_core (it records no progress): "
            f"delete {folder} and run the edge-pruning again"
        ) from None
