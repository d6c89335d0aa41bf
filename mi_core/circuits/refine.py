"""Circuits refined by gradient-guided edge swaps at the circuit (MIB's sizes, fixed budgets).

An attribution (EAP, EAP-IG) ranks edges by their effect linearised at the *full* model; a
circuit at 1 % of the edges is far from it, and the effect of an edge there differs. The
refinement linearises at the circuit instead: the mean metric ``m(C)`` of circuit ``C`` (its
other edges patched) and its gradient ``g`` with respect to every edge's weight in the masked
forward, one forward and backward (:func:`circuit_gradient`). Flipping edge ``e`` changes
``m`` by about ``g_e`` if ``e`` is out and ``-g_e`` if it is in. Each round swaps the flips of
largest estimated gain within the size's budget, prunes what is left unconnected, and keeps
the result only if the exact ``m`` of the new circuit is better; a rejected round halves the
number of flips. Targets (:func:`refine_circuit`):

- ``cpr``: raise the faithfulness (MIB's CPR rewards faithfulness above 1);
- ``cmd``: bring ``m`` to the full model's (MIB's CMD is the area of ``|1 - f|``): flips move
  ``m`` towards it and stop where their estimated sum would pass it.

Everything is chosen on the pairs given (the *finding* pairs); judge the circuits on others
with :func:`~mi_core.circuits.mib.mib_score`. Measured against the circuits it starts from in
docs/circuits.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from jaxtyping import Bool, Float
from tqdm.auto import tqdm

from mi_core.buffers import reusing_buffers
from mi_core.circuits.evaluate import circuit_baselines
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

#: What a refinement aims at: the highest faithfulness (MIB's CPR) or the full model's
#: metric (its CMD).
REFINE_TARGETS = ("cpr", "cmd")


def circuit_gradient(
    model: HookedModel,
    graph: Graph,
    kept: Bool[torch.Tensor, " edge"],
    pairs: PromptPairs,
    metric: Metric = logit_difference,
    batch_size: int = 16,
) -> tuple[float, Float[torch.Tensor, " edge"]]:
    """The mean ``metric`` on ``pairs`` of the circuit ``kept`` (every other edge patched from
    the counterfactual prompt) and its gradient with respect to every edge's weight in the
    masked forward (a kept edge has weight 1, a removed one 0)."""
    device = next(model.parameters()).device
    weights = kept.to(device, torch.float32).requires_grad_(True)
    mask = EdgeMask(graph, weights, "corrupted")
    total = 0.0
    with frozen(model), graph_switches(model), reusing_buffers(fixed_weights=True):
        for batch in pairs.batches(batch_size):
            with torch.no_grad():
                run = record_corrupted(model, graph, **batch.corrupted)
            with hooked(model, masked_hooks(model, mask, corrupted=run)):
                values = metric(metric_logits(model, batch, metric), batch)
            (values.sum() / len(pairs)).backward()
            total += float(values.detach().double().sum())
    assert weights.grad is not None
    return total / len(pairs), weights.grad.detach().cpu()


def _flips(
    kept: torch.Tensor,
    gain: torch.Tensor,
    budget: int,
    n_flips: int,
    limit: float | None,
) -> torch.Tensor:
    """The circuit after the flips of largest estimated gain (``gain``: the estimated change of
    the objective if each edge is flipped), at most ``n_flips`` additions and as many removals,
    never more than ``budget`` edges; with ``limit``, each of those flips in order of gain
    taken only if the estimated sum stays within it (a flip too large passed over)."""
    gain_in = torch.where(kept, gain, torch.zeros_like(gain))
    gain_out = torch.where(~kept, gain, torch.zeros_like(gain))
    removals = torch.argsort(gain_in, descending=True)[:n_flips]
    removals = removals[gain_in[removals] > 0]
    additions = torch.argsort(gain_out, descending=True)[:n_flips]
    additions = additions[gain_out[additions] > 0]
    room = budget - int(kept.sum()) + len(removals)
    additions = additions[: max(room, 0)]
    chosen = torch.cat([removals, additions])
    if limit is not None:  # greedily, largest first: each flip taken if the sum stays within
        order = chosen[torch.argsort(gain[chosen], descending=True)].tolist()
        values, added = gain[order].tolist(), (~kept[order]).tolist()
        taken, total, size = [], 0.0, int(kept.sum())
        for edge, value, adds in zip(order, values, added, strict=True):
            if total + value <= limit and (not adds or size < budget):
                taken.append(edge)
                total += value
                size += 1 if adds else -1
        chosen = torch.tensor(taken, dtype=torch.long)
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
    full: float,
    empty: float,
    rounds: int = 8,
    flips: float = 0.1,
    metric: Metric = logit_difference,
    batch_size: int = 16,
) -> tuple[Bool[torch.Tensor, " edge"], list[float]]:
    """``kept`` refined by gradient-guided swaps on ``pairs`` (module docstring), at most
    ``budget`` edges; the refined circuit and its mean metric after each round.

    ``full`` and ``empty``: the full model's and the empty circuit's mean metric on ``pairs``
    (:func:`~mi_core.circuits.evaluate.circuit_baselines`). ``target`` ``cpr`` raises the
    faithfulness ``(m - empty) / (full - empty)``; ``cmd`` brings ``m`` to ``full``.
    ``rounds``: forward-and-backward passes at most; ``flips``: the share of ``budget`` a
    round may add (and remove) at first, halved by each round that does not improve."""
    if target not in REFINE_TARGETS:
        raise ConfigError(f"target must be one of {', '.join(REFINE_TARGETS)}, not {target!r}")
    if budget < 1 or rounds < 0 or not 0 < flips <= 1:
        raise ConfigError(
            f"budget must be positive, rounds non-negative and flips in (0, 1]; "
            f"got {budget}, {rounds}, {flips}"
        )
    if full == empty:
        raise ConfigError("the full model and the empty circuit score the same: no faithfulness")
    kept = graph.connected(kept)
    if int(kept.sum()) > budget:
        raise ConfigError(f"the circuit keeps {int(kept.sum())} edges, over its budget {budget}")
    towards_full = 1.0 if full > empty else -1.0

    def loss(value: float) -> float:
        return -towards_full * value if target == "cpr" else abs(value - full)

    value, grad = circuit_gradient(model, graph, kept, pairs, metric, batch_size)
    history = [value]
    n_flips = max(1, int(flips * budget))
    for _ in range(rounds):
        gain = torch.where(kept, -grad, grad)  # the metric's estimated change per flip
        limit = None
        if target == "cpr":
            gain = towards_full * gain
        else:
            gain, limit = (1.0 if value < full else -1.0) * gain, abs(full - value)
        proposal = graph.connected(_flips(kept, gain, budget, n_flips, limit))
        if torch.equal(proposal, kept):
            if n_flips == 1:
                break
            n_flips = max(1, n_flips // 2)
            continue
        new_value, new_grad = circuit_gradient(model, graph, proposal, pairs, metric, batch_size)
        if loss(new_value) < loss(value):
            kept, value, grad = proposal, new_value, new_grad
        elif n_flips == 1:
            break
        else:
            n_flips = max(1, n_flips // 2)
        history.append(value)
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
    full, empty, _ = circuit_baselines(model, graph, "corrupted", None, pairs, metric, batch_size)
    refined = []
    sizes = list(zip(MIB_PERCENTAGES[:-1], circuits[:-1], strict=True))
    for pct, circuit in tqdm(sizes, desc=f"refining ({target})", disable=not progress):
        budget = int(pct * graph.n_edges)
        if budget == 0:  # a graph too small for this size: MIB's circuit is empty
            refined.append(EdgeMask.empty(graph))
            continue
        kept, _ = refine_circuit(
            model, graph, circuit.weights > 0.5, pairs, budget, target,
            full=full, empty=empty, rounds=rounds, flips=flips, metric=metric,
            batch_size=batch_size,
        )  # fmt: skip
        refined.append(EdgeMask(graph, kept.float()))
    return [*refined, EdgeMask.full(graph)]
