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
- ``cmd``: the expected squared error of the circuit's mean metric on new pairs
  (:func:`held_out_error`), lowered (MIB's CMD is the area of ``|1 - f|``). Matching the
  finding pairs' mean alone fits their noise: such circuits reach ``f = 1.00`` there and
  stray on other pairs; matching each pair alone (the mean squared difference) leaves the mean
  off (docs/circuits.md). Its flips are estimated with the mean's shift squared, so that an
  edge carrying the answer is not taken for a gain.

Everything is chosen on the pairs given (the *finding* pairs); judge the circuits on others
with :func:`~mi_core.circuits.mib.mib_score`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

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

__all__ = ["REFINE_TARGETS", "circuit_gradient", "held_out_error", "refine_circuit",
           "refine_mib_circuits"]  # fmt: skip

#: What a refinement aims at: the highest faithfulness (MIB's CPR) or the full model's mean
#: metric on new pairs (its CMD).
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
    mean, mean_grad, squared, squared_grad = _gradients(
        model, graph, kept, pairs, metric, batch_size, against
    )
    if squared is None:
        return mean, mean_grad
    assert squared_grad is not None
    return squared, squared_grad


def _gradients(
    model: HookedModel,
    graph: Graph,
    kept: torch.Tensor,
    pairs: PromptPairs,
    metric: Metric,
    batch_size: int,
    against: torch.Tensor | None,
) -> tuple[float, torch.Tensor, float | None, torch.Tensor | None]:
    """The circuit's mean metric and its gradient, and with ``against`` the mean squared
    difference from it and that gradient too (a second forward and backward)."""
    device = next(model.parameters()).device
    weights = kept.to(device, torch.float32).requires_grad_(True)
    mask = EdgeMask(graph, weights, "corrupted")
    mean_grad = torch.zeros(graph.n_edges, device=device)
    squared_grad = None if against is None else torch.zeros(graph.n_edges, device=device)
    mean, squared, start, n = 0.0, 0.0, 0, len(pairs)
    with frozen(model), graph_switches(model), reusing_buffers(fixed_weights=True):
        for batch in pairs.batches(batch_size):
            with torch.no_grad():
                run = record_corrupted(model, graph, **batch.corrupted)

            def forward(batch: PromptPairs = batch, run: Any = run) -> torch.Tensor:
                with hooked(model, masked_hooks(model, mask, corrupted=run)):
                    return metric(metric_logits(model, batch, metric), batch).float()

            values = forward()
            mean += float(values.detach().double().sum()) / n
            (grad,) = torch.autograd.grad(values.sum() / n, weights)
            mean_grad += grad
            if against is None or squared_grad is None:
                continue
            # a second pass: the masked forward's backward reuses its buffers, so one graph
            # gives one gradient
            full = against[start : start + len(values)].to(values.device, values.dtype)
            start += len(values)
            errors = (forward() - full) ** 2
            squared += float(errors.detach().double().sum()) / n
            (grad,) = torch.autograd.grad(errors.sum() / n, weights)
            squared_grad += grad
    if squared_grad is None:
        return mean, mean_grad.cpu(), None, None
    return mean, mean_grad.cpu(), squared, squared_grad.cpu()


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


def held_out_error(bias: float, squared: float, n: int) -> float:
    """The expected squared error of a circuit's mean metric on ``n`` new pairs, from the
    finding pairs' (``n`` of them too): ``bias`` the mean difference from the full model there,
    ``squared`` the mean squared difference. Each pair's difference has variance ``squared -
    bias ** 2``; the new pairs' mean of it strays from the finding pairs' by that over ``n``
    twice over, so the error is about ``bias ** 2 + 2 / n * (squared - bias ** 2)``: matching
    the mean alone fits the finding pairs' noise, matching each pair alone leaves the mean
    off."""
    share = min(1.0, 2.0 / n)
    return (1 - share) * bias**2 + share * squared


def _matching_flips(
    kept: torch.Tensor,
    squared_grad: torch.Tensor,
    mean_grad: torch.Tensor,
    bias: float,
    n: int,
    budget: int,
    n_flips: int,
) -> torch.Tensor:
    """The circuit after the flips that lower :func:`held_out_error` by its estimate: a set
    of flips (``s = +1`` adding an edge, ``-1`` removing it) moves the mean by about
    ``shift = sum(s * mean_grad)`` and the mean squared difference by about ``sum(s *
    squared_grad) + shift ** 2`` (the mean's shift squared, the least the pairs' shifts add:
    without it one edge carrying the answer looks like a gain). Of the ``n_flips`` removals
    and the ``n_flips`` additions best alone, each in turn is taken if it lowers the estimate,
    within ``budget`` (an addition with no room, once more after the others)."""

    share = min(1.0, 2.0 / n)

    def change(linear: Any, shift: Any) -> Any:
        """The estimated change of :func:`held_out_error` (floats or one per edge)."""
        return (1 - share) * (2 * bias * shift + shift**2) + share * (linear + shift**2)

    step = torch.where(kept, -1.0, 1.0)
    lin, shift = step * squared_grad, step * mean_grad
    alone = change(lin, shift)
    best = []
    for side in (kept, ~kept):  # the best removals and the best additions
        on_side = torch.where(side, alone, torch.inf)
        picked = torch.argsort(on_side)[:n_flips]
        best.append(picked[on_side[picked] < 0])
    order = torch.cat(best)
    order = order[torch.argsort(alone[order])]
    candidates = list(zip(order.tolist(), step[order].tolist(), lin[order].tolist(),
                          shift[order].tolist(), strict=True))  # fmt: skip
    taken, linear, moved, size = [], 0.0, 0.0, int(kept.sum())
    for _ in range(2):  # an addition with no room yet is tried again once removals made some
        waiting = []
        for candidate in candidates:
            edge, s, h, g = candidate
            if s > 0 and size >= budget:
                waiting.append(candidate)
            elif change(linear + h, moved + g) < change(linear, moved):
                taken.append(edge)
                linear, moved, size = linear + h, moved + g, size + int(s)
        candidates = waiting
    new = kept.clone()
    new[taken] = ~new[taken]
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
    mean metric; ``cmd``: :func:`held_out_error`).

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

    def evaluate(circuit: torch.Tensor) -> tuple[float, Callable[[int], torch.Tensor]]:
        """The circuit's objective, and its proposal of ``n`` flips at most each way."""
        mean, mean_grad, squared, squared_grad = _gradients(
            model, graph, circuit, pairs, metric, batch_size, against
        )
        if squared is None:
            gain = sign * torch.where(circuit, -mean_grad, mean_grad)
            return mean, lambda k: _flips(circuit, gain, budget, k)
        assert squared_grad is not None
        bias = mean - mean_full
        return held_out_error(bias, squared, len(pairs)), lambda k: _matching_flips(
            circuit, squared_grad, mean_grad, bias, len(pairs), budget, k
        )

    value, propose = evaluate(kept)
    history = [value]
    n_flips = max(1, int(flips * budget))
    for _ in range(rounds):
        proposal = graph.connected(propose(n_flips))
        if not torch.equal(proposal, kept):
            new_value, new_propose = evaluate(proposal)
            better = sign * new_value > sign * value
            if better:
                kept, value, propose = proposal, new_value, new_propose
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
