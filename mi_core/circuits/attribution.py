"""Edge scores: edge attribution patching (EAP), its integrated-gradients variant (EAP-IG), and
exact activation patching of single edges (the ground truth they approximate).

For an edge from sender ``s`` to receiver ``r``, removing the edge changes ``r``'s input by
``T(a_s' - a_s)`` (``a_s`` the sender's clean output, ``a_s'`` its fill: the corrupted run's
output, a mean or zero; ``T`` the identity in a pre-LN decoder, the frozen-scale LayerNorms
between them in a post-LN encoder, see :mod:`mi_core.interventions.edges`). The first-order
change of the metric ``m`` is::

    score(s -> r) = T(a_s' - a_s) . dm/d(input of r)

**EAP** (Syed, Rager and Conmy 2023) takes the gradient in the clean run: one corrupted
forward, one clean forward and one backward score every edge. **EAP-IG** (Hanna, Pezzelle and
Belinkov 2024) averages the gradient over ``steps`` runs whose input embedding moves from the
fill's to the clean one: ``alpha = k / steps`` for ``k = 0..steps-1`` (``ig_rule="left"``, their
code, hannamw/EAP-IG, which the MIB benchmark runs: the default) or ``k = 1..steps``
(``"right"``, the sum the paper writes, ending at the clean input). ``steps = 1`` is EAP under
either rule (the left rule's single point would be the corrupted input alone, which no method
uses).
Scores are averaged over examples; a negative score means corrupting the edge lowers the
metric. :func:`exact_patching` measures the same change by running the model with each edge
removed, one at a time.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from jaxtyping import Float
from tqdm.auto import tqdm

from mi_core.buffers import reusing_buffers, scratch
from mi_core.circuits.config import ATTRIBUTION_METHODS, IG_RULES, SELECTIONS
from mi_core.circuits.metrics import Metric, logit_difference, metric_logits
from mi_core.data.circuit_pairs import PromptPairs
from mi_core.errors import ConfigError, InterventionError
from mi_core.interventions.edges import (
    FILLS,
    EdgeMask,
    Graph,
    NodeOutputs,
    graph_switches,
    greedy_order,
    head_results,
    node_outputs,
    top_k_order,
)
from mi_core.interventions.edges._engine import record_corrupted
from mi_core.interventions.edges._kernels import folded_weights, through_layer_norm
from mi_core.interventions.edges.graph import reads_unnormed_stream
from mi_core.interventions.edges.recording import sender_zero_outputs
from mi_core.io import read_safetensors, write_safetensors
from mi_core.models.frozen import frozen
from mi_core.models.hook_context import hooked
from mi_core.models.hooks import act_name

if TYPE_CHECKING:
    from mi_core.models.types import HookedModel

__all__ = [
    "ATTRIBUTION_METHODS",
    "SELECTIONS",
    "EdgeScores",
    "attribute",
    "circuit_order",
    "edge_attribution",
    "exact_patching",
    "select_circuit",
]


logger = logging.getLogger(__name__)

#: The ``kind`` in the metadata of a file :meth:`EdgeScores.save` writes.
SCORES_KIND = "mi_core.EdgeScores"

#: How many edges past the longest fitting prefix a connected circuit tries to add while it
#: holds fewer than k (:func:`select_circuit`).
FILL_TRIES = 256


def circuit_order(
    graph: Graph, scores: Float[torch.Tensor, " edge"], selection: str = "greedy",
    signed: bool = False,
) -> torch.Tensor:  # fmt: skip
    """Every edge id in the order a circuit takes them: ``greedy`` (grown from the output,
    :meth:`EdgeMask.greedy`) or ``top-k`` (wherever they are); ranked by ``|score|``, or with
    ``signed`` by ``-score``: how much removing the edge lowers the metric, so edges that work
    against the metric come last."""
    key, absolute = (-scores, False) if signed else (scores, True)
    if selection == "greedy":
        return torch.tensor(greedy_order(graph, key, absolute), dtype=torch.long)
    if selection == "top-k":
        return top_k_order(key, absolute)
    raise ConfigError(f"unknown circuit selection {selection!r}; choose one of {SELECTIONS}")


def select_circuit(
    graph: Graph,
    scores: Float[torch.Tensor, " edge"],
    k: int,
    selection: str = "greedy",
    *,
    signed: bool = False,
    connected: bool = True,
    **kwargs: Any,
) -> EdgeMask:
    """A circuit of at most ``k`` edges from ``scores`` (see :func:`circuit_order`).

    ``connected``: every kept edge lies on a path of kept edges from the input to the output
    (:meth:`Graph.connected`), so the budget goes to edges on such paths (Hanna et al.'s
    EAP-IG code prunes the others after its top-n and keeps fewer). The circuit is the
    connected part of the longest prefix of the order whose connected part has at most ``k``
    edges; one more edge can complete a long chain at once, so while it holds fewer than
    ``k``, the next edges of the order (up to :data:`FILL_TRIES` of them) join wherever the
    connected part stays within ``k``. It may still hold fewer than ``k`` (exactly ``k`` at
    every level measured on SmolLM2's IOI scores): ``n_kept`` says how many. Off: exactly
    the first ``k``."""
    if "absolute" in kwargs:
        raise ConfigError(
            "select_circuit ranks by |score|, or by -score with signed=True (the edges whose "
            "removal lowers the metric most); absolute= belongs to EdgeMask.top_k / greedy"
        )
    if not 0 <= k <= graph.n_edges:
        raise InterventionError(f"k must be between 0 and {graph.n_edges}, not {k}")
    order = circuit_order(graph, scores, selection, signed)
    if not connected:
        return EdgeMask.from_order(graph, order[:k], **kwargs)

    def part(m: int) -> torch.Tensor:
        kept = torch.zeros(graph.n_edges, dtype=torch.bool)
        kept[order[:m]] = True
        return graph.connected(kept)

    low, high = k, graph.n_edges  # part(low) has at most k edges; find the largest such m
    while low < high:
        middle = (low + high + 1) // 2
        if int(part(middle).sum()) <= k:
            low = middle
        else:
            high = middle - 1
    best = part(low)
    count = int(best.sum())
    taken = torch.zeros(graph.n_edges, dtype=torch.bool)
    taken[order[:low]] = True
    for edge in order[low + 1 : low + 1 + FILL_TRIES].tolist():  # order[low] overshoots
        if count == k:
            break
        taken[edge] = True
        candidate = graph.connected(taken)
        if int(candidate.sum()) <= k:
            best, count = candidate, int(candidate.sum())
        else:
            taken[edge] = False
    if count == 0 and k > 0:
        low, high = k + 1, graph.n_edges  # the shortest prefix with a connected part
        while low < high:
            middle = (low + high) // 2
            low, high = (low, middle) if bool(part(middle).any()) else (middle + 1, high)
        logger.warning(
            "no connected circuit of at most %d edges exists in this order: the smallest holds "
            "%d edges (a path from the input to the output); the circuit is empty. Ask for more "
            "edges, or connected=False for the top %d wherever they lie",
            k, int(part(low).sum()), k,
        )  # fmt: skip
    return EdgeMask.from_order(graph, best.nonzero().flatten(), **kwargs)


@dataclass
class EdgeScores:
    """A score per edge of ``graph`` (the estimated change of the metric when it is removed)."""

    graph: Graph
    scores: Float[torch.Tensor, " edge"]
    method: str
    n_examples: int

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the scores as safetensors (the graph, method and example count in the
        metadata), atomically; :meth:`load` reads them back."""
        metadata = {"kind": SCORES_KIND, "graph": json.dumps(self.graph.to_dict()),
                    "graph_name": str(self.graph), "method": self.method,
                    "n_examples": str(self.n_examples)}  # fmt: skip
        return write_safetensors(path, {"scores": self.scores.detach().float().cpu()}, metadata)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> EdgeScores:
        """Read scores written by :meth:`save` (``mi-core circuit attribute``'s
        ``scores.safetensors``)."""
        try:
            tensors, metadata = read_safetensors(path)
        except FileNotFoundError:
            raise InterventionError(f"no edge scores at {path}") from None
        if metadata.get("method") == "edge-pruning":
            raise InterventionError(
                f"{path} holds edge-pruning gates (log_alpha), not attribution scores; the "
                "circuit of that run is circuit.safetensors beside it (load_intervention)"
            )
        if metadata.get("kind") != SCORES_KIND:
            raise InterventionError(
                f"{path} is not an edge-scores file written by EdgeScores.save (kind "
                f"{metadata.get('kind')!r})"
            )
        graph = Graph(**json.loads(metadata["graph"]))
        scores = tensors["scores"]
        if scores.shape != (graph.n_edges,):
            raise InterventionError(f"{path}: {tuple(scores.shape)} scores for {graph}")
        return cls(graph, scores, metadata["method"], int(metadata["n_examples"]))

    def top(self, k: int) -> list[tuple[str, float]]:
        """The ``k`` edges of largest ``|score|``, with their scores."""
        order = torch.argsort(self.scores.abs(), descending=True, stable=True)[:k]
        return [(self.graph.edge_names[i], float(self.scores[i])) for i in order.tolist()]

    def circuit(
        self, k: int, fill: str = "corrupted", selection: str = "greedy", *,
        signed: bool = False, connected: bool = True, **kwargs: Any,
    ) -> EdgeMask:  # fmt: skip
        """A circuit of at most ``k`` edges chosen by ``|score|`` (``signed``: by how much
        removing them lowers the metric): ``greedy`` (grown from the output;
        :meth:`EdgeMask.greedy`) or ``top-k`` (the largest, wherever they are); ``connected``:
        only edges on an input-to-output path count (:func:`select_circuit`)."""
        return select_circuit(self.graph, self.scores, k, selection, signed=signed,
                              connected=connected, fill=fill, **kwargs)  # fmt: skip


def fill_outputs(
    model: HookedModel,
    graph: Graph,
    pairs: PromptPairs,
    fill: str,
    means: torch.Tensor | None,
    like: NodeOutputs | None = None,
) -> NodeOutputs:
    """The senders' fill for this batch, ``[sender, batch, pos, d_model]``: the corrupted
    run's outputs, the means, or what each writes when it writes nothing."""
    if fill == "corrupted":
        return node_outputs(model, graph, **pairs.corrupted)
    shape = (graph.n_senders, *pairs.clean_ids.shape, graph.d_model)
    param = next(model.parameters())
    if fill == "mean":
        if means is None:
            raise InterventionError("fill='mean' needs means (sender_means)")
        return means.to(param)[:, None, None, :].expand(shape)
    zero = sender_zero_outputs(model, graph)  # a head with a folded value bias: -b_V W_O
    if zero is not None:
        return zero.to(param)[:, None, None, :].expand(shape)
    return torch.zeros(shape, device=param.device, dtype=param.dtype)


class _GradientRun:
    """Hooks of one attribution pass: interpolate the input, keep receiver inputs (for their
    gradients) and, on the clean pass, the senders' outputs and the LayerNorm scales."""

    def __init__(
        self,
        model: HookedModel,
        graph: Graph,
        reference_input: torch.Tensor,
        alpha: float,
        projected: bool = False,
    ):
        self.model, self.graph = model, graph
        self.reference_input, self.alpha = reference_input, alpha
        # projected: keep the heads' query / key / value projections (hook_q, ...; the model
        # runs unsplit) instead of their split inputs; see _sweep_attribution
        self.projected = projected
        self.receivers: list[torch.Tensor] = []  # in hook order
        self.outputs: list[torch.Tensor] = []  # clean sender outputs, per sender block
        self.scales: list[torch.Tensor] = []  # post-LN: ln1, ln2 scale of every layer

    def hooks(self) -> list[tuple[str, Callable]]:
        graph, model = self.graph, self.model

        def start(x: torch.Tensor, hook: Any) -> torch.Tensor:
            self.outputs.append(x.detach()[None])
            ref = self.reference_input.to(x)
            return (ref + self.alpha * (x.detach() - ref)).requires_grad_(True)

        def keep(x: torch.Tensor, hook: Any) -> None:
            self.receivers.append(x)

        def heads(layer: int) -> Callable:
            def hook(z: torch.Tensor, hook: Any) -> None:
                self.outputs.append(head_results(model, layer, z.detach()).detach())

            return hook

        def record(x: torch.Tensor, hook: Any) -> None:
            self.outputs.append(x.detach()[None])

        def scale(x: torch.Tensor, hook: Any) -> None:
            self.scales.append(x.detach())

        hooks: list[tuple[str, Callable]] = [(act_name("resid_pre", 0), start)]
        for layer in range(graph.n_layers):
            if self.projected:
                hooks += [(act_name(kind, layer), keep) for kind in "qkv"]
            else:
                hooks += [(act_name(f"{kind}_input", layer), keep) for kind in "qkv"]
            hooks.append((act_name("z", layer), heads(layer)))
            if graph.post_ln:
                hooks += [
                    (act_name("scale", layer, "ln1"), scale),
                    (act_name("pre", layer), keep),
                    (act_name("mlp_out", layer), record),
                    (act_name("scale", layer, "ln2"), scale),
                ]
            else:
                hooks += [(act_name("mlp_in", layer), keep), (act_name("mlp_out", layer), record)]
        out = "normalized_resid_post" if graph.post_ln else "resid_post"
        hooks.append((act_name(out, graph.n_layers - 1), keep))
        return hooks


def _receiver_gradients(
    model: HookedModel, graph: Graph, grads: Sequence[torch.Tensor]
) -> list[torch.Tensor]:
    """Per receiver point, ``[n_receivers, batch, pos, d_model]``: qkv of layer 0, MLP 0, ...,
    output. An encoder MLP's gradient comes back from its pre-activation through ``W_in``.
    Query / key / value gradients taken at the projections stay ``[3 * heads, batch, pos,
    d_head]`` (:func:`_sweep_scores` brings them back through the weights, one layer at a
    time)."""
    points: list[torch.Tensor] = []
    i = 0
    for layer in range(graph.n_layers):
        q, k, v = grads[i : i + 3]
        points.append(torch.cat([q, k, v], dim=2).permute(2, 0, 1, 3))
        mlp = grads[i + 3]
        if graph.post_ln:
            mlp = mlp @ model.blocks[layer].mlp.W_in.detach().T.to(mlp)
        points.append(mlp[None])
        i += 4
    points.append(grads[i][None])
    return points


def _sweep_scores(
    model: HookedModel,
    graph: Graph,
    deltas: list[torch.Tensor],
    scales: list[torch.Tensor],
    gradients: list[torch.Tensor],
    projected: bool = False,
) -> Float[torch.Tensor, "sender receiver"]:
    """``delta . gradient`` for every (sender, receiver) pair, carrying deltas through the
    frozen-scale LayerNorms of a post-LN model. ``projected``: the query / key / value
    gradients are at the projections, and each head's input gradient is ``grad @ W^T``."""
    # on the device until the end: a copy to the host per receiver point would wait for the GPU
    scores = torch.zeros(graph.n_senders, graph.n_receivers, device=deltas[0].device)
    buffer = scratch("sweep deltas", (graph.n_senders, *deltas[0].shape[1:]), deltas[0])
    filled = 0

    def add(start: int, delta: torch.Tensor) -> None:
        nonlocal filled
        buffer[start : start + delta.shape[0]] = delta
        filled = start + delta.shape[0]

    def score(columns: slice, grad: torch.Tensor) -> None:  # a slice: no sync on a GPU
        flat = buffer[:filled].reshape(filled, -1)  # one matrix product per receiver point
        block = flat @ grad.reshape(grad.shape[0], -1).T.to(flat)
        scores[:filled, columns] += block.float()

    def through(ln: Any, scale: torch.Tensor) -> None:
        buffer[:filled] = through_layer_norm(buffer[:filled], scale, ln.w.detach())

    def head_inputs(layer: int, grad: torch.Tensor) -> torch.Tensor:
        if not projected:
            return grad
        attn = model.blocks[layer].attn
        weights = torch.cat([attn.W_Q, attn.W_K, attn.W_V]).detach().to(grad)  # [3h, d, e]
        return torch.einsum("rbpe,rde->rbpd", grad, weights)

    add(0, deltas[0])
    for layer in range(graph.n_layers):
        block = model.blocks[layer]
        score(graph.qkv_receivers(layer), head_inputs(layer, gradients[2 * layer]))
        add(graph.head_sender(layer, 0), deltas[1 + 2 * layer])
        if graph.post_ln:
            through(block.ln1, scales[2 * layer])
        mlp = graph.mlp_receiver(layer)
        score(slice(mlp, mlp + 1), gradients[2 * layer + 1])
        add(graph.mlp_sender(layer), deltas[2 + 2 * layer])
        if graph.post_ln:
            through(block.ln2, scales[2 * layer + 1])
    score(slice(graph.output_receiver, graph.output_receiver + 1), gradients[-1])
    return scores


def ig_alphas(steps: int, rule: str = "left") -> list[float]:
    """The points EAP-IG takes the gradient at, as fractions of the way from the fill's input to
    the clean one: ``k / steps`` for ``k = 0..steps-1`` (``left``, the authors' code) or
    ``k = 1..steps`` (``right``, the paper's sum); ``[1.0]`` (EAP) for one step."""
    if rule not in IG_RULES:
        raise ConfigError(f"unknown EAP-IG rule {rule!r}; expected one of {IG_RULES}")
    if steps < 1:
        raise ConfigError(f"EAP-IG needs at least one step, not {steps}")
    if steps == 1:
        return [1.0]
    first = 0 if rule == "left" else 1
    return [k / steps for k in range(first, first + steps)]


def edge_attribution(
    model: HookedModel,
    graph: Graph,
    pairs: PromptPairs,
    metric: Metric = logit_difference,
    steps: int = 1,
    fill: str = "corrupted",
    means: torch.Tensor | None = None,
    ig_rule: str = "left",
) -> Float[torch.Tensor, " edge"]:
    """EAP (``steps=1``) or EAP-IG scores of every edge on one batch (mean over examples);
    ``ig_rule`` chooses EAP-IG's points (:func:`ig_alphas`)."""
    alphas = ig_alphas(steps, ig_rule)
    if fill not in FILLS:
        raise ConfigError(f"unknown fill {fill!r}; expected one of {FILLS}")
    graph.check_model(model)
    # no weight gradients: autograd then keeps no activations for them (restored afterwards);
    # the large buffers are reused within the call and across the calls of a reusing block
    with frozen(model, eval_mode=False), reusing_buffers(fixed_weights=True):
        if not graph.post_ln:
            head_z: dict[int, torch.Tensor] | None = None
            if fill == "corrupted":  # the heads' differences come from z's (one product)
                run = record_corrupted(model, graph, **pairs.corrupted)
                reference, head_z = run.outputs, run.head_z
            else:
                reference = fill_outputs(model, graph, pairs, fill, means)
            return _decoder_attribution(model, graph, pairs, metric, alphas, reference, head_z)
        reference = fill_outputs(model, graph, pairs, fill, means)
        return _sweep_attribution(model, graph, pairs, metric, alphas, reference, projected=True)


def _sweep_attribution(
    model: HookedModel,
    graph: Graph,
    pairs: PromptPairs,
    metric: Metric,
    alphas: Sequence[float],
    reference: NodeOutputs,
    projected: bool = False,
) -> Float[torch.Tensor, " edge"]:
    """EAP / EAP-IG by a sweep: every receiver's gradient first, then one pass over the
    senders' differences, carried through the frozen-scale LayerNorms of an encoder.

    ``projected`` (post-LN encoders, where a head's query / key / value input is the residual
    stream itself): the model runs unsplit and the gradients are kept at the heads'
    projections, ``[batch, pos, heads, d_head]``, a ``d_model / d_head``-th of the split
    inputs' (12 times less for MiniLM and BERT); each head's input gradient is ``grad @ W^T``,
    formed one layer at a time in the sweep. Without it, the split per-head inputs give the
    gradients directly (any family: the reference the decoder path is tested against)."""
    if projected and not graph.post_ln:
        raise InterventionError("projected gradients need a post-LN encoder (no ln1 before W_Q)")
    gradients: list[torch.Tensor] | None = None
    run = None
    steps = len(alphas)
    with graph_switches(model, split_inputs=not projected):
        for alpha in alphas:
            run = _GradientRun(model, graph, reference[0], alpha, projected)
            with torch.enable_grad(), hooked(model, run.hooks()):
                value = metric(metric_logits(model, pairs, metric), pairs).mean()
                grads = torch.autograd.grad(value, run.receivers, allow_unused=True)
            grads = [
                torch.zeros_like(r) if g is None else g
                for r, g in zip(run.receivers, grads, strict=True)
            ]
            points = _receiver_gradients(model, graph, grads)
            if gradients is None:
                gradients = points if steps == 1 else [p / steps for p in points]
            else:
                gradients = [a + p / steps for a, p in zip(gradients, points, strict=True)]
        if alphas[-1] != 1.0:  # the left rule never reaches the clean run: record it alone
            run = _GradientRun(model, graph, reference[0], 1.0, projected)
            with torch.no_grad(), hooked(model, run.hooks()):
                metric_logits(model, pairs, metric)
    assert run is not None and gradients is not None
    clean = run.outputs  # the last pass (alpha = 1) is the clean run
    deltas = []
    start = 0
    for block in clean:
        deltas.append(reference[start : start + block.shape[0]].to(block) - block)
        start += block.shape[0]
    scores = _sweep_scores(model, graph, deltas, run.scales, gradients, projected)
    return graph.from_dense(scores.cpu()).float().detach()


#: Receiver groups whose scores one matrix product forms (decoder EAP): the product reads the
#: senders' differences once for all of them, which on a CPU (memory-bound) costs much less a
#: group than a product each, for 3 more groups' gradients held (benchmarks/README.md).
_GROUPS_PER_PRODUCT = 4


def _decoder_attribution(
    model: HookedModel,
    graph: Graph,
    pairs: PromptPairs,
    metric: Metric,
    alphas: Sequence[float],
    reference: NodeOutputs,
    head_z: dict[int, torch.Tensor] | None = None,
) -> Float[torch.Tensor, " edge"]:
    """EAP / EAP-IG of a pre-LN decoder, scoring inside the backward pass.

    The senders' differences (fill - clean) fill one buffer (the fill's own tensor, updated in
    place); each receiver's gradient is turned into its scores the moment backward reaches it
    and then freed, so no receiver gradient is kept (841 of them for SmolLM2).

    The model runs its plain (unsplit) forward: no per-head copies of the stream are made or
    kept for backward. A head's query / key / value input gradient is taken by hand from the
    gradient of its projection (``hook_q`` etc.): back through ``W_Q`` to the normalised input,
    then through ``ln1`` (:func:`_norm_backward`, with that run's scale). This is the gradient
    TransformerLens's split inputs give (tested), at the cost of one forward and backward.

    ``head_z`` (the corrupted fill): the fill run's ``hook_z`` per layer, its heads' rows of
    ``reference`` unwritten. A head's difference is then ``(z' - z) W_O``, one product per layer
    where recording both runs' head outputs and subtracting takes two (the gain:
    benchmarks/README.md).
    """
    deltas = reference.clone() if reference.stride(1) == 0 else reference  # mean: a view
    start_input = reference[0].clone()
    # on the device until the end: a copy to the host per group would wait for the GPU
    scores = torch.zeros(graph.n_senders, graph.n_receivers, device=deltas.device)
    weight = 1.0 / len(alphas)

    def subtract(start: int) -> Callable:
        def hook(x: torch.Tensor, hook: Any) -> None:
            deltas[start : start + 1] -= x.detach()[None].to(deltas)

        return hook

    def record_clean() -> list[tuple[str, Callable]]:
        hooks: list[tuple[str, Callable]] = [(act_name("resid_pre", 0), subtract(0))]
        for layer in range(graph.n_layers):

            def heads(z: torch.Tensor, hook: Any, layer: int = layer) -> None:
                first = graph.head_sender(layer, 0)
                rows = deltas[first : first + graph.n_heads]
                if head_z is None:
                    head_results(model, layer, z.detach(), into=rows, subtract=True)
                else:
                    head_results(model, layer, head_z[layer].to(z) - z.detach(), into=rows)

            hooks += [
                (act_name("z", layer), heads),
                (act_name("mlp_out", layer), subtract(graph.mlp_sender(layer))),
            ]
        return hooks

    # Receivers are scored in groups that read the same senders, one matrix product each:
    # group l holds layer l's q, k, v inputs and layer l-1's MLP input (senders before layer l's
    # heads; the MLP's own row is not an edge and is dropped later); the last group holds the
    # last MLP and the output. Backward reaches a group's members one after another; the
    # product runs when the last one arrives.
    # A group's columns are one range of receivers (layer l-1's MLP comes right before layer
    # l's q, k, v): its scores are added by slicing, which a GPU does without waiting (a list
    # index is copied to the device and checked on the host, a sync per group). The layout is
    # tested (test_receiver_groups_are_ranges).
    groups: list[tuple[int, range]] = []  # (senders read, receiver columns)
    for layer in range(graph.n_layers):
        qkv = graph.qkv_receivers(layer)
        first = graph.mlp_receiver(layer - 1) if layer > 0 else qkv.start
        groups.append((graph.head_sender(layer, 0), range(first, qkv.stop)))
    last = graph.mlp_receiver(graph.n_layers - 1)
    groups.append((graph.n_senders, range(last, graph.output_receiver + 1)))
    # Each group's receiver gradients are written into one buffer [columns, batch, pos, d]
    # as backward reaches them: the MLP / output inputs' as they are, a layer's 27 head inputs
    # at once, head-major, from its three projection gradients (one product and the norm's
    # backward in place), so the group's product needs no gather. Groups are scored
    # _GROUPS_PER_PRODUCT at a time, side by side in one block: one product over the senders
    # reads their differences once for all of them (memory-bound on a CPU).
    sizes = [len(cols) for _, cols in groups]
    buffers: dict[int, torch.Tensor] = {}  # groups backward is filling
    filled: dict[int, set[int]] = {}  # positions written in each group's buffer
    offsets: dict[int, int] = {}  # each group's first row in the block (if it is in it)
    # groups in the block that backward has finished: in ``offsets``, no longer in ``buffers``
    projections: dict[int, dict[int, torch.Tensor]] = {}  # layer -> kind -> [b, p, h, e]
    block: dict[str, Any] = {"rows": None, "used": 0}
    block_rows = _GROUPS_PER_PRODUCT * max(sizes)

    def buffer(group: int, shape: torch.Size, like: torch.Tensor) -> torch.Tensor:
        if group not in buffers:  # [columns, batch, pos, d_model], like the first to arrive
            if block["rows"] is None:
                block["rows"] = scratch("receiver gradients", (block_rows, *shape), like)
            start = block["used"]
            if start + sizes[group] <= block_rows:
                buffers[group] = block["rows"][start : start + sizes[group]]
                offsets[group] = start
                block["used"] = start + sizes[group]
            else:  # groups overlapping in backward past the block's room: on their own
                buffers[group] = like.new_empty((sizes[group], *shape))
            filled[group] = set()
        return buffers[group]

    def product(upto: int, grads: torch.Tensor) -> torch.Tensor:
        flat = deltas[:upto].reshape(upto, -1)
        return flat @ grads.reshape(grads.shape[0], -1).T.to(flat)

    def score_waiting() -> None:
        waiting = [group for group in offsets if group not in buffers]
        if waiting:
            upto = max(groups[group][0] for group in waiting)
            products = product(upto, block["rows"][: block["used"]])
            for group in waiting:
                rows, columns = groups[group]
                part = products[:rows, offsets.pop(group) :][:, : sizes[group]]
                scores[:rows, columns.start : columns.stop] += weight * part.float()
        block.update(rows=None, used=0)

    def flush(group: int) -> None:
        if group not in buffers:
            return
        grads, written = buffers.pop(group), filled.pop(group)
        if len(written) < sizes[group]:  # receivers backward never reached: no gradient
            for position in set(range(sizes[group])) - written:
                grads[position].zero_()
        if group not in offsets:
            upto, columns = groups[group]
            scores[:upto, columns.start : columns.stop] += weight * product(upto, grads).float()
            return
        full = block_rows - block["used"] < max(sizes)
        if not any(g in offsets for g in buffers) and (full or len(offsets) == _GROUPS_PER_PRODUCT):
            score_waiting()

    def written(group: int, positions: range) -> None:
        filled[group].update(positions)
        if len(filled[group]) == sizes[group]:
            flush(group)

    def arrive(group: int, column: int) -> Callable:
        position = groups[group][1].index(column)

        def on_grad(grad: torch.Tensor) -> None:
            buffer(group, grad.shape, grad)[position].copy_(grad)
            written(group, range(position, position + 1))

        return on_grad

    def head_inputs(layer: int) -> None:
        """The layer's 27 head-input gradients from its q, k and v projection gradients."""
        parts = projections.pop(layer)
        like = next(iter(parts.values()))
        heads, e = graph.n_heads, like.shape[-1]
        first = groups[layer][1].index(graph.qkv_receivers(layer).start)
        target = buffer(layer, normalised[layer].shape, like)[first : first + 3 * heads]
        # [3 * heads, batch * pos, d_head], head-major; a kind backward never reached is zero
        stacked = target.new_empty((3, heads, *like.shape[:2], e))
        for kind in range(3):
            if kind in parts:
                stacked[kind].copy_(parts[kind].permute(2, 0, 1, 3))
            else:
                stacked[kind].zero_()
        stacked = stacked.view(3 * heads, -1, e)
        attn, ln = model.blocks[layer].attn, model.blocks[layer].ln1
        params = [*attn.parameters(), *ln.parameters()]
        if unnormed:  # the projections read the head inputs as they are (OLMo-2 / 3)
            norm = ""
        else:
            # the norm's backward is linear in the gradient at its output: its division by
            # the run's scale is done here on the d_head-wide projection gradients and its
            # gain is folded into the weights, not on the d_model-wide head inputs (a ninth of
            # the work)
            stacked.div_(scales[layer].reshape(1, -1, 1).to(target))
            norm = model.cfg.normalization_type or ""
        # [3h, e, d]: stacked with the gain folded in, once a run (the weights are frozen)
        w_t = folded_weights(attn, ln, norm, target.dtype, params)[0].mT
        out = target.view(3 * heads, -1, w_t.shape[-1])
        torch.bmm(stacked, w_t, out=out)
        if not unnormed:
            x_hat = normalised[layer].reshape(-1, w_t.shape[-1]).to(target)  # [batch * pos, d]
            _norm_backward(out, x_hat, centred)
        written(layer, range(first, first + 3 * heads))

    leaf: dict[str, torch.Tensor] = {}
    normalised: dict[int, torch.Tensor] = {}  # per layer: ln1's x_hat and scale of this run
    scales: dict[int, torch.Tensor] = {}
    centred = model.cfg.normalization_type in ("LN", "LNPre")
    unnormed = reads_unnormed_stream(model)

    def receiver_hooks(alpha: float, record: bool) -> list[tuple[str, Callable]]:
        def start(x: torch.Tensor, hook: Any) -> torch.Tensor:
            ref = start_input.to(x)
            leaf["x"] = (ref + alpha * (x.detach() - ref)).requires_grad_(True)
            return leaf["x"]

        def keep(group: int, column: int) -> Callable:
            def hook(x: torch.Tensor, hook: Any) -> None:
                x.register_hook(arrive(group, column))

            return hook

        def projection(layer: int, kind: int) -> Callable:
            def on_grad(grad: torch.Tensor) -> None:
                projections.setdefault(layer, {})[kind] = grad.detach()
                if len(projections[layer]) == 3:
                    head_inputs(layer)

            def hook(x: torch.Tensor, hook: Any) -> None:
                x.register_hook(on_grad)

            return hook

        def keep_stat(store: dict[int, torch.Tensor], layer: int) -> Callable:
            def hook(x: torch.Tensor, hook: Any) -> None:
                store[layer] = x.detach()

            return hook

        hooks: list[tuple[str, Callable]] = record_clean() if record else []
        hooks.append((act_name("resid_pre", 0), start))  # after the recording hook
        for layer in range(graph.n_layers):
            hooks += [(act_name("normalized", layer, "ln1"), keep_stat(normalised, layer)),
                      (act_name("scale", layer, "ln1"), keep_stat(scales, layer))]  # fmt: skip
            for i, kind in enumerate("qkv"):
                hooks.append((act_name(kind, layer), projection(layer, i)))
            hooks.append((act_name("mlp_in", layer), keep(layer + 1, graph.mlp_receiver(layer))))
        last = act_name("resid_post", graph.n_layers - 1)
        hooks.append((last, keep(graph.n_layers, graph.output_receiver)))
        return hooks

    with graph_switches(model, split_inputs=False):  # per-head gradients by hand (see above)
        eap = list(alphas) == [1.0]  # EAP: the one clean pass records as it goes
        if not eap:  # the clean outputs first: every step's backward needs the differences
            with torch.no_grad(), hooked(model, record_clean()):
                metric_logits(model, pairs)  # the blocks' hooks record; no full unembedding
        for alpha in alphas:
            with torch.enable_grad(), hooked(model, receiver_hooks(alpha, eap)):
                value = metric(metric_logits(model, pairs, metric), pairs).mean()
                # the receivers' hooks score as backward passes them; no parameter gradient
                torch.autograd.grad(value, leaf["x"])
            for layer in list(projections):  # some of q / k / v never reached by backward
                head_inputs(layer)
            for group in list(buffers):  # receivers backward never reached (no gradient)
                flush(group)
            score_waiting()
    return graph.from_dense(scores.cpu()).detach()


def _norm_backward(
    grad: Float[torch.Tensor, "head token d_model"],
    normalised: Float[torch.Tensor, "token d_model"],
    centred: bool,
) -> None:
    """The gradient at a LayerNorm's (``centred``) or RMSNorm's input, computed in place in
    ``grad`` (every head's at once, head-major) from ``g``, the gradient at its output already
    multiplied by the norm's gain and divided by the run's scale per token, and the normalised
    input ``x_hat``::

        d input = g - mean(g) - x_hat * mean(g * x_hat)      (LayerNorm)
        d input = g - x_hat * mean(g * x_hat)                (RMSNorm)
    """
    # every head's per-token dot products as one batched product (no [head, token, d] temporary:
    # vecdot's elementwise product would be one per layer, 32 MB for SmolLM2 at 8 x 64 tokens)
    dot = torch.einsum("htd,td->ht", grad, normalised).unsqueeze(-1) / grad.shape[-1]
    mean = grad.mean(-1, keepdim=True) if centred else None
    grad.addcmul_(normalised, dot, value=-1.0)
    if mean is not None:
        grad.sub_(mean)


def exact_patching(
    model: HookedModel,
    graph: Graph,
    pairs: PromptPairs,
    metric: Metric = logit_difference,
    edges: Sequence[int] | None = None,
    fill: str = "corrupted",
    means: torch.Tensor | None = None,
) -> Float[torch.Tensor, " edge"]:
    """The change of the mean metric when each edge alone is removed (NaN for edges not in
    ``edges``): one forward per edge, the ground truth of EAP on small models."""
    graph.check_model(model)
    chosen = range(graph.n_edges) if edges is None else edges
    reference = fill_outputs(model, graph, pairs, fill, means)
    mask = EdgeMask.full(graph, fill, means=means if fill == "mean" else None)
    if fill == "corrupted":
        mask = mask.with_corrupted(reference)
    result = torch.full((graph.n_edges,), float("nan"))
    with torch.no_grad():
        base = float(metric(metric_logits(model, pairs, metric), pairs).mean())
        with graph_switches(model):
            for edge in chosen:
                mask.weights = torch.ones(graph.n_edges)
                mask.weights[edge] = 0.0
                with hooked(model, mask.hooks(model)):
                    result[edge] = (
                        float(metric(metric_logits(model, pairs, metric), pairs).mean()) - base
                    )
    return result


def attribute(
    model: HookedModel,
    pairs: PromptPairs,
    method: str = "eap-ig",
    metric: Metric = logit_difference,
    steps: int = 5,
    batch_size: int = 16,
    fill: str = "corrupted",
    means: torch.Tensor | None = None,
    progress: bool = True,
    ig_rule: str = "left",
) -> EdgeScores:
    """Score every edge of ``model``'s graph on ``pairs`` with ``method`` (``eap``, ``eap-ig``
    or ``exact``), batch by batch (scores averaged over examples); ``ig_rule``: EAP-IG's
    points (:func:`ig_alphas`)."""
    if method not in ATTRIBUTION_METHODS:
        raise ConfigError(f"unknown attribution method {method!r}; choose {ATTRIBUTION_METHODS}")
    graph = Graph.from_model(model)
    total = torch.zeros(graph.n_edges, dtype=torch.float64)
    with reusing_buffers(fixed_weights=True):  # one set of large buffers for every batch
        for batch in tqdm(list(pairs.batches(batch_size)), desc=method, disable=not progress):
            if method == "exact":
                scores = exact_patching(model, graph, batch, metric, fill=fill, means=means)
            else:
                n_steps = 1 if method == "eap" else steps
                scores = edge_attribution(
                    model, graph, batch, metric, n_steps, fill, means, ig_rule
                )
            total += scores.double() * len(batch)
    return EdgeScores(graph, (total / len(pairs)).float(), method, len(pairs))
