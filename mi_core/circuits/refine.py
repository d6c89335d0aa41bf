"""Circuits refined by gradient-guided edge swaps at the circuit (MIB's sizes, fixed budgets).

An attribution (EAP, EAP-IG) ranks edges by their effect linearised at the *full* model; a
circuit at 1 % of the edges is far from it, and the effect of an edge there differs. The
refinement linearises at the circuit instead: an objective of circuit ``C`` (its other edges
patched) and its gradient ``g`` with respect to every edge's weight in the masked forward, one
forward and backward (:func:`circuit_gradient`). Flipping edge ``e`` changes the objective by
about ``g_e`` if ``e`` is out and ``-g_e`` if it is in. Each round makes the flips of largest
estimated gain within the size's budget, prunes what is left unconnected, and keeps the result
only if the exact objective of the new circuit is better; a rejected round halves the number
of flips. Targets (:func:`refine_circuit`):

- ``cpr``: the mean metric, moved from the empty circuit's side past the full model's (a
  higher faithfulness: MIB's CPR rewards faithfulness above 1);
- ``cmd``: the mean squared difference between each pair's metric in the circuit and in the
  full model, lowered (MIB's CMD is the area of ``|1 - f|``). Matching the mean alone fits the
  finding pairs' noise: such circuits reach ``f = 1.00`` on the pairs they were made on and
  stray on others (docs/circuits.md); matching each pair asks the circuit to
  compute what the model computes.

Everything is chosen on the pairs given (the *finding* pairs); judge the circuits on others
with :func:`~mi_core.circuits.mib.mib_score`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from jaxtyping import Bool, Float
from tqdm.auto import tqdm

from mi_core.buffers import reusing_buffers
from mi_core.circuits.evaluate import masked_metrics
from mi_core.circuits.metrics import Metric, logit_difference, metric_logits
from mi_core.circuits.mib import MIB_PERCENTAGES
from mi_core.data.circuit_pairs import PromptPairs
from mi_core.errors import ConfigError
from mi_core.interventions.edges import EdgeMask, Graph, graph_switches
from mi_core.interventions.edges._engine import masked_hooks, record_corrupted
from mi_core.models.frozen import frozen
from mi_core.models.hook_context import hooked

if TYPE_CHECKING:
    from mi_core.models.types import HookedModel

__all__ = ["REFINE_TARGETS", "circuit_gradient", "refine_circuit", "refine_mib_circuits"]

#: What a refinement aims at: the highest faithfulness (MIB's CPR) or each pair's metric in
#: the full model (its CMD).
REFINE_TARGETS = ("cpr", "cmd")


def circuit_gradient(
    model: HookedModel,
    graph: Graph,
    kept: Bool[torch.Tensor, " edge"],
    pairs: PromptPairs,
    metric: Metric = logit_difference,
    batch_size: int = 16,
    against: Float[torch.Tensor, " pair"] | None = None,
) -> tuple[float, Float[torch.Tensor, " edge"]]:
    """The mean ``metric`` on ``pairs`` of the circuit ``kept`` (every other edge patched from
    the counterfactual prompt), or with ``against`` (each pair's metric in the full model) the
    mean of ``(metric - against) ** 2``; and its gradient with respect to every edge's weight in
    the masked forward (a kept edge has weight 1, a removed one 0)."""
    if len(pairs) == 0 or kept.shape != (graph.n_edges,):
        raise ConfigError(
            f"a circuit gradient needs pairs and {graph.n_edges} kept flags; got "
            f"{len(pairs)} pairs, kept of shape {tuple(kept.shape)}"
        )
    if against is not None and len(against) != len(pairs):
        raise ConfigError(f"{len(against)} full-model values for {len(pairs)} pairs")
    device = next(model.parameters()).device
    weights = kept.to(device, torch.float32).requires_grad_(True)
    mask = EdgeMask(graph, weights, "corrupted")
    total, start = 0.0, 0
    with frozen(model), graph_switches(model), reusing_buffers(fixed_weights=True):
        for batch in pairs.batches(batch_size):
            with torch.no_grad():
                run = record_corrupted(model, graph, **batch.corrupted)
            with hooked(model, masked_hooks(model, mask, corrupted=run)):
                values = metric(metric_logits(model, batch, metric), batch).float()
            if against is not None:
                full = against[start : start + len(values)].to(values.device, values.dtype)
                values = (values - full) ** 2
            start += len(values)
            (values.sum() / len(pairs)).backward()
            total += float(values.detach().double().sum())
    assert weights.grad is not None
    return total / len(pairs), weights.grad.detach().cpu()


def _flips(kept: torch.Tensor, gain: torch.Tensor, budget: int, n_flips: int) -> torch.Tensor:
    """The circuit after the flips of positive estimated gain (``gain``: the objective's
    estimated improvement if each edge is flipped): the ``n_flips`` best removals and the
    ``n_flips`` best additions, never more than ``budget`` edges."""
    gain_in = torch.where(kept, gain, torch.zeros_like(gain))
    gain_out = torch.where(~kept, gain, torch.zeros_like(gain))
    removals = torch.argsort(gain_in, descending=True)[:n_flips]
    removals = removals[gain_in[removals] > 0]
    additions = torch.argsort(gain_out, descending=True)[:n_flips]
    additions = additions[gain_out[additions] > 0]
    room = budget - int(kept.sum()) + len(removals)
    chosen = torch.cat([removals, additions[: max(room, 0)]])
    new = kept.clone()
    new[chosen] = ~new[chosen]
    return new


def refine_circuit(
    model: HookedModel,
    graph: Graph,
    kept: Bool[torch.Tensor, " edge"],
    pairs: PromptPairs,
    budget: int,
    target: str = "cpr",
    *,
    full: Float[torch.Tensor, " pair"],
    empty: float,
    rounds: int = 8,
    flips: float = 0.1,
    metric: Metric = logit_difference,
    batch_size: int = 16,
) -> tuple[Bool[torch.Tensor, " edge"], list[float]]:
    """``kept`` refined by gradient-guided swaps on ``pairs`` (module docstring), at most
    ``budget`` edges; the refined circuit and its objective after each round (``cpr``: the
    mean metric; ``cmd``: the mean squared difference from the full model).

    ``full``: each pair's metric in the full model; ``empty``: the empty circuit's mean
    metric on ``pairs`` (both from :func:`~mi_core.circuits.evaluate.masked_metrics`).
    ``rounds``: proposals at most (a forward and backward each, after the one at ``kept``);
    ``flips``: the share of ``budget`` a round may add (and remove) at first, halved by each
    round that does not improve."""
    if target not in REFINE_TARGETS:
        raise ConfigError(f"target must be one of {', '.join(REFINE_TARGETS)}, not {target!r}")
    if budget < 1 or rounds < 0 or not 0 < flips <= 1:
        raise ConfigError(
            f"budget must be positive, rounds non-negative and flips in (0, 1]; "
            f"got {budget}, {rounds}, {flips}"
        )
    if len(full) != len(pairs) or kept.shape != (graph.n_edges,):
        raise ConfigError(
            f"{len(full)} full-model values for {len(pairs)} pairs, kept of shape "
            f"{tuple(kept.shape)} for {graph.n_edges} edges"
        )
    mean_full = float(full.double().mean())
    if mean_full == empty:
        raise ConfigError("the full model and the empty circuit score the same: no faithfulness")
    kept = graph.connected(kept)
    if int(kept.sum()) > budget:
        raise ConfigError(f"the circuit keeps {int(kept.sum())} edges, over its budget {budget}")
    # the objective is raised: the metric towards the full model's side of the empty circuit
    # (cpr), or minus the squared difference from the full model (cmd)
    sign = (1.0 if mean_full > empty else -1.0) if target == "cpr" else -1.0
    against = full if target == "cmd" else None

    def evaluate(circuit: torch.Tensor) -> tuple[float, torch.Tensor]:
        return circuit_gradient(model, graph, circuit, pairs, metric, batch_size, against)

    value, grad = evaluate(kept)
    history = [value]
    n_flips = max(1, int(flips * budget))
    for _ in range(rounds):
        gain = sign * torch.where(kept, -grad, grad)  # the objective's estimated gain per flip
        proposal = graph.connected(_flips(kept, gain, budget, n_flips))
        if not torch.equal(proposal, kept):
            new_value, new_grad = evaluate(proposal)
            better = sign * new_value > sign * value
            if better:
                kept, value, grad = proposal, new_value, new_grad
            history.append(value)
            if better:
                continue
        if n_flips == 1:
            break
        n_flips = max(1, n_flips // 2)
    return kept, history


def refine_mib_circuits(
    model: HookedModel,
    circuits: Sequence[EdgeMask],
    pairs: PromptPairs,
    target: str = "cpr",
    *,
    rounds: int = 8,
    flips: float = 0.1,
    metric: Metric = logit_difference,
    batch_size: int = 16,
    progress: bool = False,
) -> list[EdgeMask]:
    """One circuit per MIB size (``circuits``, e.g. from
    :func:`~mi_core.circuits.mib.select_mib_circuits`), each refined on ``pairs`` towards
    ``target`` within its size's budget (``int(pct * n_edges)`` edges, MIB's); the 100 %
    circuit stays the whole graph. Corrupted fill, MIB's patching."""
    if len(circuits) != len(MIB_PERCENTAGES):
        raise ConfigError(f"one circuit per MIB size ({len(MIB_PERCENTAGES)}); got {len(circuits)}")
    graph = circuits[0].graph
    if any(c.fill != "corrupted" or c.graph != graph for c in circuits):
        raise ConfigError("refine_mib_circuits refines corrupted-fill circuits of one graph")
    [(empty, _)], full = masked_metrics(model, [EdgeMask.empty(graph)], pairs, metric, batch_size)
    refined = []
    sizes = list(zip(MIB_PERCENTAGES[:-1], circuits[:-1], strict=True))
    for pct, circuit in tqdm(sizes, desc=f"refining ({target})", disable=not progress):
        budget = int(pct * graph.n_edges)
        if budget == 0:  # a graph too small for this size: MIB's circuit is empty
            refined.append(EdgeMask.empty(graph))
            continue
        kept, _ = refine_circuit(
            model, graph, circuit.weights > 0.5, pairs, budget, target,
            full=full, empty=float(empty.mean()), rounds=rounds, flips=flips, metric=metric,
            batch_size=batch_size,
        )  # fmt: skip
        refined.append(EdgeMask(graph, kept.float()))
    return [*refined, EdgeMask.full(graph)]
