"""The computational graph of a hooked model, and edge masks as an intervention.

**The graph** (:class:`Graph`). Nodes that write to the residual stream (*senders*): the input
embedding (``input``), every head (``L2.H5``) and every MLP (``L3.MLP``). Inputs that read from
it (*receivers*): each head's query, key and value input (``L2.H5.q``, ``.k``, ``.v``), each
MLP's input (``L3.MLP``) and the output (``output``: the unembedding or the classifier head).
An edge joins a sender to every receiver after it (``L0.H1->L2.H5.q``, ``input->L0.MLP``,
``L5.MLP->output``); a layer's heads feed its own MLP.

*Pre-LayerNorm decoders* (GPT-2, OPT and Llama families, GPT-2 classifiers): the residual
stream at a receiver is the sum of the outputs of the senders before it plus constant biases
(attention's ``b_O``), so an edge is exact. Grouped-query models are ungrouped while a graph
acts: each query head gets its own key and value input (``L2.H5.k``).

*Post-LayerNorm encoders* (BERT, RoBERTa, MiniLM): LayerNorm acts on the residual stream after
every sublayer, ``LN(x) = (x - mean x) / sigma(x) * w + b``. With each token's scale ``sigma``
frozen at its value in the run, LayerNorm is affine, so the stream at a receiver is again a
sum: each sender's output carried through the LayerNorms between them (centred, divided by
that run's scale, times ``w``), plus constants. Edges are defined through that linear map, with
the scale taken from the run that is being computed (the clean run for attribution scores, the
masked run for a masked forward). With every edge kept this is the model exactly; with every
edge removed it differs from the corrupted run only through the scales
(:func:`graph_error` measures both). The MLP receiver of an encoder acts on the MLP's own
input (at ``mlp.hook_pre``), not on the residual stream the MLP's output is added to.

**Edge masks** (:class:`EdgeMask`): a weight per edge (1 kept, 0 removed, anything between for
pruning), and the fill of a removed edge: the corrupted run's output of its sender
(``corrupted``, activation patching), the sender's mean output over a data set (``mean``), or
zero. A receiver gets ``its input - sum over removed edges (sender output - fill)``: the
activations flow as in the model except along removed edges. Masks save, load and apply like
every intervention::

    graph = Graph.from_model(model)
    mask = EdgeMask.from_edges(graph, ["input->L0.H1.v", "L0.H1->output"], fill="corrupted")
    with apply(model, mask.patching(model, corrupted_ids)):
        logits = model(clean_ids)
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

import torch
from jaxtyping import Bool, Float
from transformer_lens.components import BertBlock, TransformerBlock

from mi_core.buffers import scratch, workspace_memo
from mi_core.errors import InterventionError
from mi_core.interventions.components import Component
from mi_core.interventions.config import FILLS
from mi_core.io import read_json, read_safetensors, write_safetensors
from mi_core.models.classifier import batch_inputs
from mi_core.models.hook_context import hooked
from mi_core.models.hooks import act_name

__all__ = [
    "EDGE_MASK_KIND",
    "FILLS",
    "SUPPORTED_GRAPHS",
    "EdgeMask",
    "Graph",
    "NodeOutputs",
    "graph_error",
    "graph_switches",
    "node_outputs",
    "sender_means",
    "to_mib_name",
]

EDGE_MASK_KIND = "mi_core.EdgeMask"
_FORMAT_VERSION = "1"
SUPPORTED_GRAPHS = (
    "pre-LayerNorm decoders (GPT-2, OPT and Llama families; GPT-2 classifiers) and "
    "post-LayerNorm encoders (BERT, RoBERTa, MiniLM classifiers)"
)


def _component(text: str) -> Component | None:
    """The head or MLP named ``text`` (``L2.H5``, ``L3.MLP``), or None for another name."""
    try:
        return Component.parse(text)
    except InterventionError:
        return None


#: Outputs of every sender in one run, in graph order: ``[sender, batch, pos, d_model]``.
NodeOutputs = Float[torch.Tensor, "sender batch pos d_model"]


def _family(model: Any) -> str:
    """``"decoder"`` or ``"encoder"``, or a clear error for a model with no graph."""
    blocks = getattr(model, "blocks", None)
    cfg = getattr(model, "cfg", None)
    if blocks is None or cfg is None or len(blocks) == 0:
        raise InterventionError(
            f"no circuit graph for {type(model).__name__}: supported are {SUPPORTED_GRAPHS}"
        )
    name = cfg.original_architecture or type(model).__name__
    if all(type(b) is BertBlock for b in blocks):
        return "encoder"
    plain_decoder = (
        all(type(b) is TransformerBlock for b in blocks)
        and cfg.normalization_type in ("LN", "LNPre", "RMS", "RMSPre")
        and not cfg.parallel_attn_mlp
        and not cfg.attn_only
        and not cfg.use_normalization_before_and_after
        and "Olmo2" not in name
        and "Olmo3" not in name
    )
    if plain_decoder:
        return "decoder"
    raise InterventionError(f"no circuit graph for {name}: supported are {SUPPORTED_GRAPHS}")


@dataclass(frozen=True)
class Graph:
    """Senders, receivers and edges of a hooked model (see the module docstring).

    Senders in order: ``input``, then per layer its heads and its MLP. Receivers in order: per
    layer every head's ``q``, then ``k``, then ``v``, then the MLP; finally ``output``.
    """

    n_layers: int
    n_heads: int
    d_model: int
    post_ln: bool = False

    @classmethod
    def from_model(cls, model: Any) -> Graph:
        """The graph of ``model`` (an error names the supported families for any other)."""
        family = _family(model)
        cfg = model.cfg
        return cls(cfg.n_layers, cfg.n_heads, cfg.d_model, post_ln=family == "encoder")

    def check_model(self, model: Any) -> None:
        """Refuse a model whose graph is not this one."""
        other = Graph.from_model(model)
        if other != self:
            raise InterventionError(f"this graph is {self}, the model's is {other}")

    # ---------------------------------------------------------------- indices and names
    @property
    def n_senders(self) -> int:
        return 1 + self.n_layers * (self.n_heads + 1)

    @property
    def n_receivers(self) -> int:
        return self.n_layers * (3 * self.n_heads + 1) + 1

    def head_sender(self, layer: int, head: int) -> int:
        return 1 + layer * (self.n_heads + 1) + head

    def mlp_sender(self, layer: int) -> int:
        return 1 + layer * (self.n_heads + 1) + self.n_heads

    def qkv_receivers(self, layer: int) -> slice:
        """Receivers ``L{layer}.H*.q``, then ``.k``, then ``.v`` (``3 * n_heads`` of them)."""
        start = layer * (3 * self.n_heads + 1)
        return slice(start, start + 3 * self.n_heads)

    def mlp_receiver(self, layer: int) -> int:
        return layer * (3 * self.n_heads + 1) + 3 * self.n_heads

    @property
    def output_receiver(self) -> int:
        return self.n_receivers - 1

    @cached_property
    def senders(self) -> list[str]:
        names = ["input"]
        for layer in range(self.n_layers):
            names += [str(Component(layer, h)) for h in range(self.n_heads)]
            names.append(str(Component(layer)))
        return names

    @cached_property
    def receivers(self) -> list[str]:
        names = []
        for layer in range(self.n_layers):
            for kind in "qkv":
                names += [f"{Component(layer, h)}.{kind}" for h in range(self.n_heads)]
            names.append(str(Component(layer)))
        return [*names, "output"]

    @cached_property
    def _sender_depth(self) -> torch.Tensor:
        depth = [-1]
        for layer in range(self.n_layers):
            depth += [2 * layer] * self.n_heads + [2 * layer + 1]
        return torch.tensor(depth)

    @cached_property
    def _receiver_depth(self) -> torch.Tensor:
        depth = []
        for layer in range(self.n_layers):
            depth += [2 * layer] * (3 * self.n_heads) + [2 * layer + 1]
        return torch.tensor([*depth, 2 * self.n_layers])

    @cached_property
    def exists(self) -> Bool[torch.Tensor, "sender receiver"]:
        """Which (sender, receiver) pairs are edges: the sender comes before the receiver."""
        return self._sender_depth[:, None] < self._receiver_depth[None, :]

    @cached_property
    def edges(self) -> torch.Tensor:
        """``[n_edges, 2]``: (sender, receiver) of every edge, sender-major."""
        return self.exists.nonzero()

    @property
    def n_edges(self) -> int:
        return int(self.edges.shape[0])

    @cached_property
    def edge_names(self) -> list[str]:
        """``"L0.H1->L2.H5.q"`` for every edge, in :attr:`edges` order."""
        return [f"{self.senders[s]}->{self.receivers[r]}" for s, r in self.edges.tolist()]

    @cached_property
    def incoming_edges(self) -> dict[str, list[int]]:
        """Edge ids into each node (a head's q, k and v inputs all count as the head's)."""
        into: dict[str, list[int]] = {}
        for edge, (_, receiver) in enumerate(self.edges.tolist()):
            name = self.receivers[receiver]
            node = name[:-2] if name.endswith((".q", ".k", ".v")) else name
            into.setdefault(node, []).append(edge)
        return into

    @cached_property
    def _receiver_owner(self) -> torch.Tensor:
        """The sender of the node each receiver feeds (a head's q / k / v: the head; an MLP's
        input: the MLP); -1 for the output."""
        owner = []
        for layer in range(self.n_layers):
            heads = [self.head_sender(layer, h) for h in range(self.n_heads)]
            owner += heads * 3 + [self.mlp_sender(layer)]
        return torch.tensor([*owner, -1])

    def connected(self, kept: Bool[torch.Tensor, " edge"]) -> Bool[torch.Tensor, " edge"]:
        """The kept edges that lie on a path of kept edges from the input to the output.

        In a pre-LN decoder run with the corrupted fill an edge off every such path changes
        nothing: a sender none of whose inputs is kept computes its corrupted output, which is
        what its removed edges carry, and a receiver whose node reaches no output is read by
        nothing kept (tested; the pruning of Hanna et al.'s EAP-IG code). Elsewhere dropping
        such an edge is a choice, not a no-op: with the mean or zero fill a sender cut off
        from the input computes f(fill), not the fill, and in a post-LN encoder the
        LayerNorms between sender and receiver make the equality inexact (a tiny BERT's
        logits moved by up to 0.07)."""
        kept = kept.detach().to("cpu", torch.bool).clone()
        senders, receivers = self.edges[:, 0], self.edges[:, 1]
        owner = self._receiver_owner[receivers]
        into_node = owner >= 0
        while True:
            has_in = torch.zeros(self.n_senders, dtype=torch.bool)
            has_in[0] = True
            has_in[owner[kept & into_node]] = True
            has_out = torch.zeros(self.n_senders, dtype=torch.bool)
            has_out[senders[kept]] = True
            alive = has_in & has_out
            pruned = kept & alive[senders] & (~into_node | alive[owner.clamp(min=0)])
            if torch.equal(pruned, kept):
                return kept
            kept = pruned

    @cached_property
    def _edge_id(self) -> torch.Tensor:
        ids = torch.full(self.exists.shape, -1, dtype=torch.long)
        ids[self.exists] = torch.arange(self.n_edges)
        return ids

    def edge_index(self, name: str) -> int:
        """The position of edge ``name`` in :attr:`edges` (a clear error if there is none)."""
        sender, arrow, receiver = name.replace(" ", "").partition("->")
        s, r = self._parse_sender(sender, name), self._parse_receiver(receiver, name)
        if not arrow or s is None or r is None:
            raise InterventionError(
                f"no edge {name!r} in this graph ({self.n_layers} layers x {self.n_heads} heads); "
                "edges are named like 'L0.H3->L1.H2.q', 'input->L0.MLP', 'L2.MLP->output'"
            )
        index = int(self._edge_id[s, r])
        if index < 0:
            raise InterventionError(
                f"no edge {name!r}: {sender} does not come before {receiver} in the model"
            )
        return index

    def _parse_sender(self, text: str, name: str) -> int | None:
        if text == "input":
            return 0
        node = _component(text)
        if node is None:
            return None
        self._check_range(node, name)
        return (
            self.mlp_sender(node.layer)
            if node.is_mlp
            else self.head_sender(node.layer, int(node.head or 0))
        )

    def _parse_receiver(self, text: str, name: str) -> int | None:
        if text == "output":
            return self.output_receiver
        base, _, kind = text.rpartition(".")
        if kind in ("q", "k", "v"):  # a head's query / key / value input
            node = _component(base)
            if node is None or node.is_mlp:
                return None
            self._check_range(node, name)
            start = self.qkv_receivers(node.layer).start
            return start + "qkv".index(kind) * self.n_heads + int(node.head or 0)
        node = _component(text)
        if node is None or not node.is_mlp:
            return None
        self._check_range(node, name)
        return self.mlp_receiver(node.layer)

    def _check_range(self, node: Component, name: str) -> None:
        if node.layer >= self.n_layers or (node.head is not None and node.head >= self.n_heads):
            raise InterventionError(
                f"no edge {name!r}: the model has {self.n_layers} layers of {self.n_heads} heads"
            )

    # --------------------------------------------------------------------- conversion
    def to_dense(
        self, values: Float[torch.Tensor, " edge"], fill: float = 0.0
    ) -> Float[torch.Tensor, "sender receiver"]:
        """Per-edge values as a ``[sender, receiver]`` matrix (``fill`` where no edge is)."""
        if values.shape != (self.n_edges,):
            raise InterventionError(
                f"expected {self.n_edges} edge values, got {tuple(values.shape)}"
            )
        dense = torch.full(self.exists.shape, fill, dtype=values.dtype, device=values.device)
        return dense.masked_scatter(self.exists.to(values.device), values)

    def from_dense(
        self, dense: Float[torch.Tensor, "sender receiver"]
    ) -> Float[torch.Tensor, " edge"]:
        """The edge entries of a ``[sender, receiver]`` matrix, in :attr:`edges` order."""
        return dense[self.exists.to(dense.device)]

    def to_dict(self) -> dict[str, Any]:
        return {
            "n_layers": self.n_layers,
            "n_heads": self.n_heads,
            "d_model": self.d_model,
            "post_ln": self.post_ln,
        }

    def __str__(self) -> str:
        kind = "post-LN encoder" if self.post_ln else "pre-LN decoder"
        return (
            f"Graph({kind}, {self.n_layers} layers x {self.n_heads} heads: {self.n_senders} "
            f"senders, {self.n_receivers} receivers, {self.n_edges} edges)"
        )


# ------------------------------------------------------------------------ the model's switches
@contextlib.contextmanager
def _config_flags(model: Any, **values: bool) -> Iterator[Any]:
    """Set ``model.cfg`` flags for the span of a block; the old values come back on leaving."""
    cfg = model.cfg
    before = {name: getattr(cfg, name) for name in values}
    try:
        for name, value in values.items():
            setattr(cfg, name, value)
        yield model
    finally:
        for name, value in before.items():
            setattr(cfg, name, value)


_EDGE_MASK_APPLIED = "_mi_core_edge_mask_applied"


@contextlib.contextmanager
def _one_edge_mask(model: Any) -> Iterator[None]:
    """The graph's switches for an edge mask applied by :func:`apply`, refusing a second."""
    if model.__dict__.get(_EDGE_MASK_APPLIED):
        raise InterventionError(
            "an edge mask is already applied to this model; two at once would subtract an edge "
            "both remove twice: apply one mask, a & b (every edge either removes is removed)"
        )
    model.__dict__[_EDGE_MASK_APPLIED] = True
    try:
        with graph_switches(model):
            yield
    finally:
        model.__dict__.pop(_EDGE_MASK_APPLIED, None)


def graph_switches(model: Any, split_inputs: bool = True) -> contextlib.AbstractContextManager:
    """Switch on what a graph needs for the span of a block: per-head query / key / value
    inputs (``split_inputs``; methods that take per-head gradients by hand run without them)
    with ``use_attn_in`` off, the MLP-input hook (decoders) and ungrouped key / value heads
    (grouped-query models). The switches are restored on leaving."""
    flags = {"use_split_qkv_input": split_inputs, "use_attn_in": False, "use_hook_mlp_in": True}
    if model.cfg.n_key_value_heads is not None:
        flags["ungroup_grouped_query_attention"] = True
    return _config_flags(model, **flags)


def _head_results(
    model: Any,
    layer: int,
    z: torch.Tensor,
    into: torch.Tensor | None = None,
    subtract: bool = False,
) -> torch.Tensor:
    """``[n_heads, batch, pos, d_model]``: each head's output in the residual stream.

    ``into`` (contiguous, of that shape and ``z``'s dtype): the product is written there (or,
    with ``subtract``, taken from it) by one batched product, with no result of the stream's
    size to allocate and then copy; returns ``into``."""
    w_o = model.blocks[layer].attn.W_O  # [head, d_head, d_model]
    if into is None:
        return torch.einsum("bphe,hem->hbpm", z, w_o.to(z.dtype))
    with torch.no_grad():  # a recording: ``into`` holds no graph
        if into.dtype != z.dtype or into.device != z.device or not into.is_contiguous():
            out = torch.einsum("bphe,hem->hbpm", z, w_o.to(z.dtype)).to(into)
            return into.sub_(out) if subtract else into.copy_(out)
        heads = w_o.shape[0]
        per_head = z.permute(2, 0, 1, 3).reshape(heads, -1, z.shape[-1])  # [head, b*p, d_head]
        target = into.view(heads, -1, into.shape[-1])
        if subtract:
            target.baddbmm_(per_head, w_o.to(z), alpha=-1.0)
        else:
            torch.bmm(per_head, w_o.to(z), out=target)
    return into


def _recorder_hooks(
    model: Any, graph: Graph, store: dict[str, Any], head_z: dict[int, torch.Tensor] | None = None
) -> list[tuple[str, Callable]]:
    """Hooks that write each sender's output into one buffer, ``store["out"]``, allocated at
    the first hook (``[sender, batch, pos, d_model]``; no per-block copies to concatenate).

    ``head_z``: each layer's ``hook_z`` (``[batch, pos, head, d_head]``) is kept there instead,
    and the heads' rows of the buffer are left unwritten: a caller that only needs
    differences of head outputs forms them from differences of ``z`` (one product, not two)."""

    def start(x: torch.Tensor, hook: Any) -> None:
        store["out"] = scratch("senders", (graph.n_senders, *x.shape), x)
        store["out"][0] = x
        store["written"] += 1

    def heads(layer: int) -> Callable:
        first = graph.head_sender(layer, 0)

        def hook(z: torch.Tensor, hook: Any) -> None:
            if head_z is not None:
                head_z[layer] = z.detach()
            else:
                _head_results(model, layer, z, into=store["out"][first : first + graph.n_heads])
            store["written"] += graph.n_heads

        return hook

    def mlp(layer: int) -> Callable:
        index = graph.mlp_sender(layer)

        def hook(x: torch.Tensor, hook: Any) -> None:
            store["out"][index] = x
            store["written"] += 1
            if layer == graph.n_layers - 1:
                raise _Recorded  # the last sender: the final norm and unembedding are not run

        return hook

    store["written"] = 0  # senders written so far
    hooks = [(act_name("resid_pre", 0), start)]
    for layer in range(graph.n_layers):
        hooks.append((act_name("z", layer), heads(layer)))
        hooks.append((act_name("mlp_out", layer), mlp(layer)))
    return hooks


class _Recorded(Exception):
    """Raised by the recording's last hook: the rest of the forward is not needed."""


def node_outputs(model: Any, graph: Graph, *args: Any, **kwargs: Any) -> NodeOutputs:
    """Run ``model(*args, **kwargs)`` without gradients and return every sender's output.

    Outputs are in each sender's own space (before any later LayerNorm). The forward stops at
    the last sender: the final norm, the unembedding or the classifier head never run (for
    SmolLM2 at 8 x 64 tokens on a CPU, a fifth of a forward: the unembedding and its 100 MB
    of logits).
    """
    return _record_senders(model, graph, args, kwargs)


def _record_senders(
    model: Any,
    graph: Graph,
    args: Sequence[Any],
    kwargs: dict[str, Any],
    head_z: dict[int, torch.Tensor] | None = None,
) -> NodeOutputs:
    """:func:`node_outputs`; with ``head_z``, the heads' ``z`` per layer are kept there and the
    heads' rows are left unwritten (see :func:`_recorder_hooks`)."""
    graph.check_model(model)
    store: dict[str, Any] = {}
    # the recording needs no per-head copies of the stream, nor grouped-query heads ungrouped
    # (the same values, faster: inside an edge-pruning run, whose graph switches ungroup them,
    # the corrupted run would project and rotate 9 key heads of SmolLM2 where it has 3)
    flags: dict[str, bool] = {"use_split_qkv_input": False}
    if getattr(model.cfg, "n_key_value_heads", None) is not None:
        flags["ungroup_grouped_query_attention"] = False
    with (
        _config_flags(model, **flags),
        torch.no_grad(),
        hooked(model, _recorder_hooks(model, graph, store, head_z)),
    ):
        try:
            model(*args, **kwargs)
        except _Recorded:
            pass
    if store["written"] != graph.n_senders:
        raise InterventionError(
            f"the forward wrote {store['written']} of the graph's "
            f"{graph.n_senders} sender outputs (a hook point was not reached)"
        )
    return store["out"]


def sender_means(
    model: Any,
    graph: Graph,
    batches: Iterator[dict[str, torch.Tensor]] | Sequence[dict[str, Any]],
    masks: Sequence[torch.Tensor] | None = None,
) -> Float[torch.Tensor, "sender d_model"]:
    """Each sender's mean output over the real tokens of ``batches`` (the ``mean`` fill).

    A batch is the keyword arguments of a forward. The tokens that count are marked by
    ``masks`` (one ``[batch, pos]`` mask per batch: a language model's right-padded prompts run
    without an attention mask), else by the batch's own ``attention_mask``, else all of them.
    """
    if isinstance(batches, torch.Tensor | Mapping):
        raise InterventionError(
            "sender_means takes a list (or iterator) of batches, each the keyword arguments of a "
            'forward: [{"input": ids}] for a language model, [tokens] for a classifier'
        )
    total = torch.zeros(graph.n_senders, graph.d_model, dtype=torch.float64)
    count = 0
    for i, batch in enumerate(batches):
        if not isinstance(batch, Mapping):
            raise InterventionError(
                f"sender_means: batch {i} is a {type(batch).__name__}, not the keyword "
                'arguments of a forward (e.g. {"input": ids})'
            )
        outputs = node_outputs(model, graph, **batch).double().cpu()
        mask = masks[i] if masks is not None else batch.get("attention_mask")
        if mask is None and "input_ids" in batch and hasattr(model, "infer_inputs"):
            mask = batch_inputs(model, batch)[1]  # what model(ids) infers: pads left out
        if mask is None:
            weights = torch.ones(outputs.shape[1:3], dtype=torch.float64)
        else:
            weights = mask.double().cpu()
        total += torch.einsum("sbpd,bp->sd", outputs, weights)
        count += float(weights.sum())
    if count == 0:
        raise InterventionError("sender_means got no tokens")
    return (total / count).float()


def _check_k(graph: Graph, k: int) -> None:
    if not 0 <= k <= graph.n_edges:
        raise InterventionError(f"k must be between 0 and {graph.n_edges}, not {k}")


def top_k_order(scores: Float[torch.Tensor, " edge"], absolute: bool = True) -> torch.Tensor:
    """Edge ids from the highest score down (``|score|`` if ``absolute``; ties by id)."""
    key = scores.detach().cpu().float()
    return torch.argsort(key.abs() if absolute else key, descending=True, stable=True)


def greedy_order(
    graph: Graph, scores: Float[torch.Tensor, " edge"], absolute: bool = True,
    k: int | None = None,
) -> list[int]:  # fmt: skip
    """The first ``k`` edges (all: None) in the order :meth:`EdgeMask.greedy` keeps them: the
    highest-scoring edge into a node already reached from the output, then its sender joins."""
    import heapq

    key = (scores.abs() if absolute else scores).detach().cpu().double().tolist()
    incoming = graph.incoming_edges
    heap: list[tuple[float, int]] = []
    active: set[str] = set()
    order: list[int] = []
    limit = graph.n_edges if k is None else k

    def activate(node: str) -> None:
        if node not in active:
            active.add(node)
            for edge in incoming.get(node, ()):
                heapq.heappush(heap, (-key[edge], edge))

    activate("output")
    while heap and len(order) < limit:
        _, edge = heapq.heappop(heap)
        order.append(edge)
        activate(graph.senders[int(graph.edges[edge, 0])])
    return order


# ------------------------------------------------------------------------------ edge masks
@dataclass(eq=False)
class EdgeMask:
    """A weight per edge of ``graph`` (1 kept, 0 removed) and the fill of removed edges.

    ``fill``: ``corrupted`` (the sender's output in a corrupted run, bound per batch with
    :meth:`patching` or :meth:`with_corrupted`), ``mean`` (``means``: each sender's mean
    output, ``[sender, d_model]``) or ``zero``.
    """

    graph: Graph
    weights: Float[torch.Tensor, " edge"]
    fill: str = "corrupted"
    means: Float[torch.Tensor, "sender d_model"] | None = None
    corrupted: NodeOutputs | None = field(default=None, repr=False)
    hard_concrete: bool = field(default=False, repr=False)
    """The weights are clamped hard-concrete samples (edge pruning): a weight of exactly 0 or
    1 gets no gradient (the clamp gives it none anyway), so with gradients the masked forward
    and its backward read only the senders with an edge that is removed or undecided, as
    without them (at the start of a run nearly every gate is exactly 1, at the end nearly
    every one exactly 0). The values and the gradients of ``log_alpha`` are unchanged."""
    _corrupted_z: tuple[NodeOutputs, dict[int, torch.Tensor]] | None = field(
        default=None, repr=False, compare=False, kw_only=True
    )
    """Set by :meth:`_patched_by_z` only: the corrupted run's ``hook_z`` per layer, with the
    ``corrupted`` outputs whose heads' rows were therefore not written; used only while
    ``corrupted`` is that same tensor and the fill is ``corrupted``."""

    def __post_init__(self) -> None:
        if self.fill not in FILLS:
            raise InterventionError(f"unknown edge fill {self.fill!r}; expected one of {FILLS}")
        if self.weights.shape != (self.graph.n_edges,):
            raise InterventionError(
                f"an edge mask of {self.graph} needs {self.graph.n_edges} weights, got "
                f"{tuple(self.weights.shape)}"
            )
        if self.fill == "mean":
            expected = (self.graph.n_senders, self.graph.d_model)
            if self.means is None or tuple(self.means.shape) != expected:
                raise InterventionError(
                    f"a mean-filled edge mask needs means of shape {expected} (sender_means)"
                )

    # ------------------------------------------------------------------- constructors
    @classmethod
    def full(cls, graph: Graph, fill: str = "corrupted", **kwargs: Any) -> EdgeMask:
        """Every edge kept."""
        return cls(graph, torch.ones(graph.n_edges), fill, **kwargs)

    @classmethod
    def empty(cls, graph: Graph, fill: str = "corrupted", **kwargs: Any) -> EdgeMask:
        """Every edge removed."""
        return cls(graph, torch.zeros(graph.n_edges), fill, **kwargs)

    @classmethod
    def from_edges(
        cls, graph: Graph, kept: Sequence[str], fill: str = "corrupted", **kwargs: Any
    ) -> EdgeMask:
        """Keep the named edges (``"L0.H1->L2.H5.q"``), remove every other."""
        weights = torch.zeros(graph.n_edges)
        weights[[graph.edge_index(name) for name in kept]] = 1.0
        return cls(graph, weights, fill, **kwargs)

    @classmethod
    def top_k(
        cls,
        graph: Graph,
        scores: Float[torch.Tensor, " edge"],
        k: int,
        fill: str = "corrupted",
        absolute: bool = True,
        **kwargs: Any,
    ) -> EdgeMask:
        """Keep the ``k`` edges of highest score (of highest ``|score|`` if ``absolute``)."""
        _check_k(graph, k)
        return cls.from_order(graph, top_k_order(scores, absolute)[:k], fill, **kwargs)

    @classmethod
    def greedy(
        cls,
        graph: Graph,
        scores: Float[torch.Tensor, " edge"],
        k: int,
        fill: str = "corrupted",
        absolute: bool = True,
        **kwargs: Any,
    ) -> EdgeMask:
        """Grow a connected circuit of ``k`` edges backwards from the output.

        Start with the output node; repeatedly keep the highest-scoring edge (``|score|`` if
        ``absolute``) into a node already in the circuit, and add its sender. Every kept edge
        then lies on a path to the output, which top-k does not promise (the greedy selection
        of Hanna et al.'s EAP-IG code).
        """
        _check_k(graph, k)
        return cls.from_order(graph, greedy_order(graph, scores, absolute, k), fill, **kwargs)

    @classmethod
    def from_order(
        cls, graph: Graph, edges: Sequence[int] | torch.Tensor, fill: str = "corrupted",
        **kwargs: Any,
    ) -> EdgeMask:  # fmt: skip
        """Keep the edges whose ids are given, remove every other."""
        ids = torch.as_tensor(edges).cpu()
        if ids.dtype == torch.bool or ids.is_floating_point():
            raise InterventionError(
                f"from_order takes edge ids (integers), not a {ids.dtype} tensor; a boolean "
                "mask is EdgeMask(graph, mask.float())"
            )
        ids = ids.long().flatten()
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= graph.n_edges):
            raise InterventionError(f"edge ids must lie in [0, {graph.n_edges}), got "
                                    f"{int(ids.min())} to {int(ids.max())}")  # fmt: skip
        weights = torch.zeros(graph.n_edges)
        weights[ids] = 1.0
        return cls(graph, weights, fill, **kwargs)

    # ---------------------------------------------------------------------- views
    @property
    def kept(self) -> list[str]:
        """Names of the kept edges (weight above 0.5)."""
        return [self.graph.edge_names[i] for i in (self.weights > 0.5).nonzero().flatten().tolist()]

    @property
    def n_kept(self) -> int:
        return int((self.weights > 0.5).sum())

    @property
    def sparsity(self) -> float:
        """Fraction of edges removed."""
        return 1.0 - self.n_kept / self.graph.n_edges

    def with_corrupted(self, outputs: NodeOutputs) -> EdgeMask:
        """This mask with its fill bound to a corrupted run's sender outputs."""
        if outputs.shape[0] != self.graph.n_senders or outputs.shape[-1] != self.graph.d_model:
            raise InterventionError(
                f"corrupted outputs of shape {tuple(outputs.shape)} do not fit {self.graph}"
            )
        return replace(self, corrupted=outputs, _corrupted_z=None)

    def patching(self, model: Any, *args: Any, **kwargs: Any) -> EdgeMask:
        """This mask bound to the corrupted run ``model(*args, **kwargs)``."""
        return self.with_corrupted(node_outputs(model, self.graph, *args, **kwargs))

    def _patched_by_z(self, model: Any, *args: Any, **kwargs: Any) -> EdgeMask:
        """:meth:`patching` for mi_core's own masked forwards (edge-pruning steps, circuit
        evaluation): the corrupted run's heads are kept as their ``hook_z``, so the masked
        forward forms each head's difference as ``(z - z') W_O``, one product, instead of the
        head's output and the corrupted one, two products and a subtraction (0.1-0.15 s of a
        4.2 s edge-pruning step of SmolLM2 on a CPU, measured in one A / B). ``corrupted``'s
        heads' rows are not written: a mask meant for users binds with :meth:`patching`."""
        head_z: dict[int, torch.Tensor] = {}
        outputs = _record_senders(model, self.graph, args, kwargs, head_z)
        return replace(self.with_corrupted(outputs), _corrupted_z=(outputs, head_z))

    def __or__(self, other: EdgeMask) -> EdgeMask:
        """The edges either keeps (the same graph and fill; this mask's binding)."""
        self._check_combinable(other, "|")
        return replace(self, weights=torch.maximum(self.weights, other.weights))

    def __and__(self, other: EdgeMask) -> EdgeMask:
        """The edges both keep: every edge either removes is removed (the same graph and fill;
        this mask's binding). How to apply two masks at once."""
        self._check_combinable(other, "&")
        return replace(self, weights=torch.minimum(self.weights, other.weights))

    def _check_combinable(self, other: EdgeMask, op: str) -> None:
        if not isinstance(other, EdgeMask):
            raise InterventionError(f"an edge mask {op} {type(other).__name__}: give an EdgeMask")
        if other.graph is not self.graph and other.graph.edge_names != self.graph.edge_names:
            raise InterventionError(f"edge masks of two different graphs cannot be combined ({op})")
        if other.fill != self.fill:
            raise InterventionError(
                f"an edge mask with {self.fill} fill {op} one with {other.fill} fill: a removed "
                "edge would carry one or the other; give both the same fill"
            )

    def __invert__(self) -> EdgeMask:
        return replace(self, weights=1.0 - self.weights)

    def __str__(self) -> str:
        return (
            f"EdgeMask({self.n_kept} of {self.graph.n_edges} edges kept, removed edges filled "
            f"with {self.fill})"
        )

    # ------------------------------------------------------------------ intervention
    def prepare(self, model: Any) -> contextlib.AbstractContextManager[Any]:
        """The switches the graph needs (:func:`graph_switches`), for :func:`apply`; one edge
        mask at a time: a second one, in the same ``apply`` or nested, is refused (each feeds
        receivers their input minus its removed edges' differences, so an edge both remove
        would be subtracted twice): apply ``a & b``."""
        return _one_edge_mask(model)

    def hooks(self, model: Any) -> list[tuple[str, Callable]]:
        """Hooks that feed every receiver its input minus the removed edges' differences.

        The model must have the graph's switches on (:func:`apply` does it).
        """
        self.graph.check_model(model)
        cfg = model.cfg
        if not (cfg.use_split_qkv_input and (self.graph.post_ln or cfg.use_hook_mlp_in)):
            raise InterventionError(
                "an edge mask needs per-head query / key / value inputs and the MLP-input hook: "
                "use apply(model, mask), or wrap the run in graph_switches(model)"
            )
        if self.fill == "corrupted" and self.corrupted is None:
            raise InterventionError(
                "a corrupted-fill edge mask needs the corrupted run: "
                "mask.patching(model, corrupted_input) binds it"
            )
        removed = self.graph.to_dense(1.0 - self.weights.float(), fill=0.0)
        head_z = None
        if self._corrupted_z is not None and self.fill == "corrupted":
            outputs, z = self._corrupted_z
            head_z = z if outputs is self.corrupted else None  # not if replace() swapped it
        return _EdgeRun(
            model, self.graph, removed, self._fill_value, self.hard_concrete, head_z
        ).hooks()

    def _fill_value(self, senders: slice, like: torch.Tensor) -> torch.Tensor | None:
        """The fill of senders ``senders``, broadcastable to ``like`` ``[n, batch, pos, d]``."""
        if self.fill == "zero":
            return None
        if self.fill == "mean":
            assert self.means is not None
            return self.means[senders, None, None, :].to(like)
        assert self.corrupted is not None
        value = self.corrupted[senders]
        if value.shape[1:3] != like.shape[1:3]:
            raise InterventionError(
                f"the corrupted run has {value.shape[1]} x {value.shape[2]} (examples x tokens) "
                f"but the clean run {like.shape[1]} x {like.shape[2]}; pad both to one shape"
            )
        return value.to(like)

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write weights, fill and (for ``mean``) means as one safetensors file.

        A corrupted run is data, not part of the mask, and is not saved.
        """
        if Path(path).suffix.lower() != ".safetensors":
            raise InterventionError(f"cannot save an edge mask as {path}: use .safetensors")
        import json

        tensors = {"weights": self.weights.detach().float()}
        if self.means is not None:
            tensors["means"] = self.means.detach().float()
        metadata = {
            "kind": EDGE_MASK_KIND,
            "format_version": _FORMAT_VERSION,
            "fill": self.fill,
            "graph": json.dumps(self.graph.to_dict()),
        }
        return write_safetensors(path, tensors, metadata)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> EdgeMask:
        """Read an edge mask written by :meth:`save`."""
        import json

        try:
            tensors, metadata = read_safetensors(path)
        except FileNotFoundError:
            raise InterventionError(f"no edge mask file at {path}") from None
        if metadata.get("kind") != EDGE_MASK_KIND:
            raise InterventionError(f"{path} is not an edge mask (kind {metadata.get('kind')!r})")
        if metadata.get("format_version") != _FORMAT_VERSION:
            raise InterventionError(
                f"{path}: edge-mask format {metadata.get('format_version')!r} is not "
                f"{_FORMAT_VERSION!r}; upgrade mi_core"
            )
        graph = Graph(**json.loads(metadata["graph"]))
        return cls(graph, tensors["weights"], metadata["fill"], tensors.get("means"))

    @classmethod
    def from_json(
        cls, graph: Graph, path: str | os.PathLike[str], fill: str = "corrupted", **kwargs: Any
    ) -> EdgeMask:
        """Keep the edges listed in a JSON file: a list of names, or ``{"edges": {name: ...}}``
        with an ``in_graph`` flag per edge (the MIB format :func:`~mi_core.circuits.to_mib`
        writes)."""
        data = read_json(path)
        if isinstance(data, dict) and isinstance(data.get("edges"), dict):
            names = [name for name, edge in data["edges"].items() if edge.get("in_graph")]
            from_mib = True
        elif isinstance(data, list):
            names, from_mib = [str(n) for n in data], False
        else:
            raise InterventionError(f"{path}: expected a list of edge names or an MIB circuit")
        if from_mib:
            names = [_from_mib_name(name) for name in names]
        return cls.from_edges(graph, names, fill, **kwargs)


# --------------------------------------------------------------------- the masked forward
#: What reading one sender row by a gather costs, in rows read in place: a point with
#: gradients reads the whole block of senders side by side once it needs a sixth of them
#: (a gather of a quarter of 290 senders took 50 ms, the whole block 22 ms, measured).
_GATHER_COST = 6


def _senders_to_read(
    columns: Float[torch.Tensor, "sender receiver"],
) -> tuple[torch.Tensor, bool]:
    """The senders a receiver point must read (sorted indices) given its removed weights:
    those with a removed edge into it, or, when fewer, those with a kept one (then ``True``:
    the point's input is the total less the kept part)."""
    removed = columns.any(1).nonzero().flatten()
    kept = (1.0 - columns).any(1).nonzero().flatten()
    return (kept, True) if len(kept) < len(removed) else (removed, False)


class _EdgeRun:
    """Per-forward state of a masked run: each sender's ``output - fill`` so far (its *delta*),
    carried through every LayerNorm since (encoders). A receiver's input loses
    ``sum over senders of removed[sender, receiver] * delta[sender]``.

    Each receiver point costs one matrix product over only the senders it needs: those with a
    removed edge into it, or, when fewer, those with a kept edge (``total - kept . delta``,
    ``total`` the sum of all deltas), so a circuit of few edges and a patch of one edge are
    both cheap. Without gradients the deltas live in one preallocated buffer. With gradients
    (edge pruning) the deltas are a list and :class:`_Correction` keeps autograd from copying
    them at every receiver point: memory linear in depth for decoders; every sender is read
    unless the weights are hard-concrete samples (``sparse``), whose exact 0s and 1s need no
    gradient. For decoders the deltas' gradients from all receiver points are summed in place
    in one buffer (:class:`_SideBySide`), and the heads' inputs are projected by hand
    (:class:`_HeadInputs`), never as TransformerLens's copies of the stream per head. For
    post-LN encoders every LayerNorm makes new (transformed) deltas that later points keep,
    so memory grows with depth squared: fine for MiniLM, heavy for BERT-large.
    """

    def __init__(
        self,
        model: Any,
        graph: Graph,
        removed: Float[torch.Tensor, "sender receiver"],
        fill: Callable[[slice, torch.Tensor], torch.Tensor | None],
        sparse: bool = False,
        head_z: dict[int, torch.Tensor] | None = None,
    ) -> None:
        self.model, self.graph, self.fill = model, graph, fill
        self.head_z = head_z  # the fill's heads as z per layer (EdgeMask._patched_by_z)
        self.removed = removed
        self.sparse = sparse
        self.deltas: list[torch.Tensor] = []  # with gradients: one tensor per sender block
        self.buffer: torch.Tensor | None = None  # without: [sender, batch, pos, d_model]
        self.side: _SideBySide | None = None  # with, decoders: detached copies, gradients
        self.total: torch.Tensor | None = None
        self.folded = 0  # with gradients: the delta blocks summed into ``total`` so far
        self.n = 0  # senders so far
        self.pending: tuple[torch.Tensor, ...] | None = None  # encoders: q / k / v corrections
        self.heads: _HeadInputs | None = None  # decoders: the layer's heads' q / k / v
        self.stream: torch.Tensor | None = None  # decoders: the layer's shared input
        self.group: _LayerGroup | None = None  # decoders, with gradients: see _grouped
        self.product: torch.Tensor | None = None  # the group's product, while in the group
        # ``removed`` as the receiver points read it, made once a forward: on the stream's
        # device and dtype (a mask's weights live on the CPU; 61 copies of SmolLM2's 1 MB
        # matrix a forward otherwise), and on the host for the groups' choices (one wait for
        # the device a forward instead of one a group)
        self.removed_here: torch.Tensor | None = None
        self.removed_host: torch.Tensor | None = None

    def _reset(self, x: torch.Tensor) -> None:
        self.deltas, self.n, self.pending, self.heads = [], 0, None, None
        self.group, self.product = None, None
        self.removed_here = self.removed_host = None
        differentiable = self.removed.requires_grad or x.requires_grad
        self.side = None
        if torch.is_grad_enabled() and differentiable:
            self.buffer = None
            self.total = torch.zeros_like(x) if self.sparse else None
            self.folded = 0
            if not self.graph.post_ln:  # rows never change after writing: no concatenation
                self.side = _SideBySide(self.graph.n_senders, x)
        else:
            self.buffer = scratch("edge deltas", (self.graph.n_senders, *x.shape), x)
            self.total = torch.zeros_like(x)

    def _append(
        self, start: int, outputs: torch.Tensor, is_delta: bool = False, tapped: bool = False
    ) -> None:
        """Senders from ``start`` on: their ``outputs`` (or, ``is_delta``, output - fill);
        ``tapped``: the delta is already in the side-by-side rows and hands on their gradient
        (:class:`_HeadsInto`)."""
        if is_delta:
            delta = outputs
        else:
            fill = self.fill(slice(start, start + outputs.shape[0]), outputs)
            delta = outputs if fill is None else outputs - fill
        self.n = start + delta.shape[0]
        if self.buffer is None:
            if self.side is not None:
                if not tapped:
                    self.side.values[start : self.n] = delta.detach()
                    delta = _Tap.apply(delta, self.side, start)
            self.deltas.append(delta)  # summed into ``total`` only if a point needs it
        else:
            assert self.total is not None
            self.buffer[start : self.n] = delta
            self.total += delta.sum(0)

    def _through_layer_norm(self, scale: torch.Tensor, weight: torch.Tensor) -> None:
        if self.total is not None:
            self.total = _through_layer_norm(self.total[None], scale, weight)[0]
        if self.buffer is None:
            self.deltas = [_through_layer_norm(d, scale, weight) for d in self.deltas]
        else:
            self.buffer[: self.n] = _through_layer_norm(self.buffer[: self.n], scale, weight)

    def _correction(self, receivers: slice | int) -> torch.Tensor | None:
        """``[n_receivers, batch, pos, d_model]`` to subtract at ``receivers`` (None: no edge
        into them is removed)."""
        ref = self.deltas[0] if self.buffer is None else self.buffer
        removed = self.removed_here
        if removed is None or removed.device != ref.device or removed.dtype != ref.dtype:
            removed = self.removed_here = self.removed.to(device=ref.device, dtype=ref.dtype)
        if self.side is not None:
            grouped = self._grouped(receivers, removed)
            if grouped is not None:
                return grouped
        columns = removed[:, receivers] if isinstance(receivers, slice) else removed[:, [receivers]]
        columns = columns[: self.n]
        if self.buffer is None and not self.sparse:
            return _Correction.apply(columns, None, self.side, *self.deltas)
        kept = 1.0 - columns
        rows, use_kept = _senders_to_read(columns.detach())
        weights = kept if use_kept else columns
        shape = (columns.shape[1], *ref.shape[1:])
        if len(rows) == 0:
            if not use_kept:
                return None  # nothing removed: the input stays as it is
            part = ref.new_zeros(shape)
        elif self.buffer is None:  # with gradients, hard-concrete weights
            # the whole block side by side is read in place, so it beats a gather of a sixth
            # or more of it (measured); a list of blocks would be concatenated: half. Read
            # whole, the removed weights give the correction itself (no total - kept part).
            if (_GATHER_COST if self.side is not None else 2) * len(rows) > self.n:
                return _Correction.apply(columns, None, self.side, *self.deltas)
            part = _Correction.apply(weights[rows], rows, self.side, *self.deltas)
        elif _GATHER_COST * len(rows) > self.n:  # the whole block beats a copy
            flat = self.buffer[: self.n].reshape(self.n, -1)
            return (columns.T @ flat).reshape(shape)
        else:
            flat = self.buffer.index_select(0, rows).reshape(len(rows), -1)
            part = (weights[rows].T @ flat).reshape(shape)
        return self._total()[None] - part if use_kept else part

    def _total(self) -> torch.Tensor:
        """The sum of every delta so far. With gradients the blocks are added when a point
        first needs the sum (in the middle and at the end of an edge-pruning run, the layer
        groups read the senders whole and none does: no sum per block, no autograd node)."""
        assert self.total is not None
        if self.buffer is None:
            for delta in self.deltas[self.folded :]:
                self.total = self.total + delta.sum(0)
            self.folded = len(self.deltas)
        return self.total

    def _grouped(self, receivers: slice | int, removed: torch.Tensor) -> torch.Tensor | None:
        """The correction at ``receivers`` from their layer group's product (decoders, with
        gradients), or None where the group reads senders point by point.

        The receivers of a few layers form a group (:func:`_layers_per_group`). At its first
        point, one matrix product over every sender before it serves all the group's receivers
        (:class:`_GroupProduct`), and each point adds only the senders that came since
        (:class:`_GroupPart`); in the backward pass the group's receivers' gradients meet in
        one buffer for one product of each kind. On a CPU these products are memory-bound: one
        read of the senders' block (and one write of its gradients) serves all the group's
        points (eight for SmolLM2's four layers) instead of one each. A group reads its
        senders whole, so under hard-concrete weights (whose exact 0s and 1s let a point read
        few senders, or none) it is formed only where that reads fewer rows than its points
        would one by one (:meth:`_group_pays`)."""
        first = receivers.start if isinstance(receivers, slice) else receivers
        stop = receivers.stop if isinstance(receivers, slice) else receivers + 1
        group = self.group
        if group is None or not group.start <= first < stop <= group.stop:
            self.product = None
            per_layer = 3 * self.graph.n_heads + 1
            layers = _layers_per_group(per_layer)
            end = min((first // per_layer + layers) * per_layer, removed.shape[1])
            group = self.group = _LayerGroup(first, end, self.n, len(self.deltas))
            if self.removed_host is None:
                self.removed_host = removed.detach().cpu()
            if self.sparse and not self._group_pays(first, end, self.removed_host):
                return None  # few senders to read: point by point
            columns = removed[: self.n, first:end]
            self.product = _GroupProduct.apply(columns, group, self.side, *self.deltas)
            group.active = True
        if self.product is None:
            return None
        extra = removed[group.n : self.n, first:stop] if self.n > group.n else None
        product = self.product
        if stop == group.stop:  # the group's last point: let the product go
            self.product = None
        return _GroupPart.apply(
            product, extra, group, first - group.start, stop - group.start, self.side,
            *self.deltas[group.blocks :],
        )  # fmt: skip

    def _gradient_rows(
        self, receivers: slice
    ) -> Callable[[torch.Tensor], torch.Tensor | None] | None:
        """Where the gradient of the correction at ``receivers`` can be formed in place: its
        rows in the group's buffer (shaped and typed as the inputs it is the gradient of), so
        the group need not copy it; None outside a group."""
        group = self.group
        if group is None or not group.start <= receivers.start < group.stop or not group.active:
            return None
        assert self.side is not None  # groups are formed only with the deltas side by side
        first, size = receivers.start - group.start, receivers.stop - receivers.start
        dtype = self.side.values.dtype

        def rows(like: torch.Tensor) -> torch.Tensor | None:
            return None if like.dtype != dtype else group.rows(first, size, like)

        return rows

    def _group_pays(self, first: int, end: int, removed: torch.Tensor) -> bool:
        """Whether a group of receivers ``first:end`` reads fewer sender rows than its points
        would one by one under hard-concrete weights (:meth:`_correction`'s choices: none
        where nothing is to be read, a gather of the rows needed, or the whole block once a
        sixth of it is). A row gathered counts six, and the group's product, which serves
        all the group's points, two reads of its senders (measured on SmolLM2's shapes: four
        layers' receivers in one product cost about two products of one layer's)."""
        graph, before = self.graph, self.n
        grouped, apart = 2 * before, 0
        per_layer = 3 * graph.n_heads + 1
        for layer in range(first // per_layer, -(-end // per_layer)):
            points = [(graph.qkv_receivers(layer), graph.head_sender(layer, 0)),
                      (graph.mlp_receiver(layer), graph.mlp_sender(layer))]  # fmt: skip
            if layer == graph.n_layers:
                points = [(graph.output_receiver, graph.n_senders)]
            for receivers, n in points:
                columns = removed[:n, receivers]
                columns = columns[:, None] if columns.dim() == 1 else columns
                rows = len(_senders_to_read(columns)[0])
                apart += 0 if rows == 0 else min(n, _GATHER_COST * rows)
                grouped += n - before
        return grouped < apart

    def hooks(self) -> list[tuple[str, Callable]]:
        graph, model = self.graph, self.model
        hooks: list[tuple[str, Callable]] = []

        def start(x: torch.Tensor, hook: Any) -> None:
            self._reset(x)
            self._append(0, x[None])

        hooks.append((act_name("resid_pre", 0), start))
        if self.sparse and graph.post_ln:
            hooks += self._unsplit_hooks(model, graph)
        for layer in range(graph.n_layers):
            hooks += self._layer_hooks(model, graph, layer)
        last = graph.n_layers - 1
        out_point = "normalized_resid_post" if graph.post_ln else "resid_post"

        def output(x: torch.Tensor, hook: Any) -> torch.Tensor:
            correction = self._correction(graph.output_receiver)
            return x if correction is None else x - correction[0]

        hooks.append((act_name(out_point, last), output))
        return hooks

    def _unsplit_hooks(self, model: Any, graph: Graph) -> list[tuple[str, Callable]]:
        """Encoders under hard-concrete masks (edge pruning; decoders never build per-head
        copies, see :meth:`_decoder_head_hooks`): a layer none of whose query / key / value inputs
        has a removed edge runs with one shared input, TransformerLens's unsplit path, instead
        of a copy of the stream per head (at the start of a run that is most layers; their
        weights are exactly 1 and need no gradient). A block reads the switch after its
        ``hook_resid_pre`` and its attention picks its projection before ``hook_q``, where the
        switch is set back on."""
        removed = self.removed.detach().reshape(-1, graph.n_receivers)
        n_layers = graph.n_layers
        split = [bool(removed[:, graph.qkv_receivers(layer)].any()) for layer in range(n_layers)]

        def switch_off(x: torch.Tensor, hook: Any) -> None:
            model.cfg.use_split_qkv_input = False

        def switch_back(x: torch.Tensor, hook: Any) -> None:
            model.cfg.use_split_qkv_input = True

        hooks: list[tuple[str, Callable]] = []
        for layer in range(n_layers):
            if not split[layer]:
                hooks += [(act_name("resid_pre", layer), switch_off),
                          (act_name("q", layer), switch_back)]  # fmt: skip
        return hooks

    def _decoder_head_hooks(
        self, model: Any, graph: Graph, layer: int
    ) -> list[tuple[str, Callable]]:
        """Pre-LN decoders: the block runs TransformerLens's shared-input path (one ``ln1``,
        one projection), and where an edge into the layer's heads is removed, ``hook_q`` /
        ``hook_k`` / ``hook_v`` return each head's projection of its own input instead
        (:class:`_HeadInputs`: the inputs head-major, normalised and projected without a copy
        of the stream per head in ``[batch, pos, head, d_model]`` order). The values are
        TransformerLens's per-head (split) inputs' (tested); the switch is on again after
        ``hook_q``, so the model's configuration is as it was once the forward is done."""
        attn, ln = model.blocks[layer].attn, model.blocks[layer].ln1
        cfg = model.cfg

        def shared(x: torch.Tensor, hook: Any) -> None:
            self.stream = x
            cfg.use_split_qkv_input = False

        def query(q: torch.Tensor, hook: Any) -> torch.Tensor:
            cfg.use_split_qkv_input = True
            correction = self._correction(graph.qkv_receivers(layer))
            if correction is None:
                self.heads = None
                return q
            assert self.stream is not None
            self.heads = _HeadInputs(
                self.stream, correction, attn, ln, cfg.normalization_type, f"head inputs L{layer}",
                self._gradient_rows(graph.qkv_receivers(layer)),
            )  # fmt: skip
            return self.heads.get(0, q)

        def key_value(kind: int) -> Callable:
            def hook(x: torch.Tensor, hook: Any) -> torch.Tensor:
                return x if self.heads is None else self.heads.get(kind, x)

            return hook

        return [
            (act_name("resid_pre", layer), shared),
            (act_name("q", layer), query),
            (act_name("k", layer), key_value(1)),
            (act_name("v", layer), key_value(2)),
        ]

    def _layer_hooks(self, model: Any, graph: Graph, layer: int) -> list[tuple[str, Callable]]:
        n_heads = graph.n_heads
        block = model.blocks[layer]

        def q_input(x: torch.Tensor, hook: Any) -> torch.Tensor:
            correction = self._correction(graph.qkv_receivers(layer))
            if correction is None:
                self.pending = None
                return x
            # [batch, pos, heads, d_model] each for q, k and v (split: one concatenation in
            # the backward pass, where slices would each fill a zero tensor of all three)
            self.pending = torch.split(correction.permute(1, 2, 0, 3), n_heads, dim=2)
            return x - self.pending[0]

        def kv_input(offset: int) -> Callable:
            def hook(x: torch.Tensor, hook: Any) -> torch.Tensor:
                return x if self.pending is None else x - self.pending[offset]

            return hook

        def heads(z: torch.Tensor, hook: Any) -> None:
            first = graph.head_sender(layer, 0)
            if self.head_z is None:
                self._append(first, _head_results(model, layer, z))
                return
            # (the fill's shape was checked at the input embedding's row, appended first)
            filled = self.head_z[layer].to(z)
            w_o, side = block.attn.W_O, self.side
            if side is not None and not w_o.requires_grad and side.values.dtype == z.dtype:
                # straight into the side-by-side rows: no fresh [heads, batch, pos, d_model]
                # block per layer to write and then copy (fresh memory is paid for in page
                # faults on a CPU: 316 ms of a 5.4 s SmolLM2 step, profiled)
                delta = _HeadsInto.apply(z - filled, w_o.to(z), side, first)
                self._append(first, delta, is_delta=True, tapped=True)
                return
            self._append(first, _head_results(model, layer, z - filled), is_delta=True)

        def mlp_out(x: torch.Tensor, hook: Any) -> None:
            self._append(graph.mlp_sender(layer), x[None])

        if graph.post_ln:
            hooks = [
                (act_name("q_input", layer), q_input),
                (act_name("k_input", layer), kv_input(1)),
                (act_name("v_input", layer), kv_input(2)),
            ]
        else:
            hooks = self._decoder_head_hooks(model, graph, layer)
        hooks.append((act_name("z", layer), heads))
        if graph.post_ln:

            def layer_norm(ln: Any) -> Callable:
                def hook(scale: torch.Tensor, hook: Any) -> None:
                    self._through_layer_norm(scale, ln.w)

                return hook

            def mlp_pre(x: torch.Tensor, hook: Any) -> torch.Tensor:
                correction = self._correction(graph.mlp_receiver(layer))
                if correction is None:
                    return x
                return x - correction[0] @ block.mlp.W_in.to(correction)

            hooks += [
                (act_name("scale", layer, "ln1"), layer_norm(block.ln1)),
                (act_name("pre", layer), mlp_pre),
                (act_name("mlp_out", layer), mlp_out),
                (act_name("scale", layer, "ln2"), layer_norm(block.ln2)),
            ]
        else:

            def mlp_in(x: torch.Tensor, hook: Any) -> torch.Tensor:
                correction = self._correction(graph.mlp_receiver(layer))
                return x if correction is None else x - correction[0]

            hooks += [(act_name("mlp_in", layer), mlp_in), (act_name("mlp_out", layer), mlp_out)]
        return hooks


class _HeadInputs:
    """Each head's query, key and value of a pre-LN decoder layer from its own input.

    ``stream - correction[i]`` for every receiver ``i`` (``[3 * heads, batch, pos, d_model]``,
    head-major), normalised as ``ln1`` does (centred for LayerNorm; the scale per head and
    token) and projected by ``W_Q`` / ``W_K`` / ``W_V``, all in one matrix product; the gain is
    folded into the weights and the scale divides the product. The per-head inputs are never
    copied per head in ``[batch, pos, head, d_model]`` order nor sliced (TransformerLens's
    split inputs copy the stream per head and run ``ln1`` element-wise over every copy, and
    slicing would fill zero tensors of their size in the backward pass). With the weights
    frozen (edge pruning), :class:`_HeadProjection` also writes the backward pass by hand.
    """

    def __init__(
        self,
        stream: Float[torch.Tensor, "batch pos d_model"],
        correction: Float[torch.Tensor, "receiver batch pos d_model"],
        attn: Any,
        ln: Any,
        normalization: str,
        role: str | None = None,
        gradient_into: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> None:
        centred = normalization in ("LN", "LNPre")
        params = [*attn.parameters(), *ln.parameters()]
        if torch.is_grad_enabled() and any(p.requires_grad for p in params):
            folded, bias = _fold_weights(attn, ln, normalization, stream.dtype)
            out = _head_projection(stream, correction, folded, ln.eps, centred)[2]
        else:
            folded, bias = _folded_weights(attn, ln, normalization, stream.dtype, params)
            out = _HeadProjection.apply(
                stream, correction, folded, ln.eps, centred, role, gradient_into
            )
        self.out = out if bias is None else out + bias[:, None, None, :].to(out.dtype)
        self.n_heads = correction.shape[0] // 3
        # q, k and v as one split: in the backward pass their gradients are concatenated once,
        # where three slices would each fill a zero tensor of all 3 * heads and add them up
        # (90 fills of 3.5 MB a SmolLM2 step)
        self.parts = torch.split(self.out, self.n_heads)

    def get(
        self, kind: int, like: Float[torch.Tensor, "batch pos head d_head"]
    ) -> Float[torch.Tensor, "batch pos head d_head"]:
        """The query (``kind`` 0), key (1) or value (2) of every head, shaped as ``like``."""
        return self.parts[kind].permute(1, 2, 0, 3).to(like.dtype)


def _fold_weights(
    attn: Any, ln: Any, normalization: str, dtype: torch.dtype
) -> tuple[Float[torch.Tensor, "receiver d_model d_head"], torch.Tensor]:
    """``W_Q``, ``W_K``, ``W_V`` head-major with ``ln``'s gain folded in, and their biases with
    its shift folded in (``[3 * heads, d_head]``)."""
    weight = torch.cat([attn.W_Q, attn.W_K, attn.W_V])  # [3 * heads, d_model, d_head]
    bias = torch.cat([attn.b_Q, attn.b_K, attn.b_V])
    gain = getattr(ln, "w", None) if normalization in ("LN", "RMS") else None
    folded = weight if gain is None else gain[:, None] * weight
    if normalization == "LN":
        bias = bias + torch.einsum("d,hde->he", ln.b, weight)
    return folded.to(dtype), bias


def _folded_weights(
    attn: Any, ln: Any, normalization: str, dtype: torch.dtype, params: Sequence[torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`_fold_weights`, detached. Inside a :func:`~mi_core.buffers.reusing_buffers`
    block that holds the weights fixed (``fixed_weights=True``: an edge-pruning run, an
    attribution) they are kept while the layer's parameters stay the same tensors at the same
    version, and dropped with the block: a run folds each
    layer once, not at every step (the concatenation, a grouped-query model's repeated key /
    value weights and the gain's product, about 0.1 s of a 4 s SmolLM2 step on a CPU). The
    bias is None where it is zero (a model without biases: no addition per step)."""
    memo = workspace_memo()
    key = (
        normalization,
        dtype,
        tuple((id(p), p.data_ptr(), p._version, p.dtype, p.device) for p in params),
    )
    held = None if memo is None else memo.get(attn)
    if held is not None and held[0] == key:
        return held[1], held[2]
    with torch.no_grad():
        folded, bias = _fold_weights(attn, ln, normalization, dtype)
    kept = None if not bool(bias.any()) else bias  # once per fold (a GPU waits for it once)
    if memo is not None:
        memo[attn] = (key, folded, kept)
    return folded, kept


def _head_projection(
    stream: Float[torch.Tensor, "batch pos d_model"],
    correction: Float[torch.Tensor, "receiver batch pos d_model"],
    folded: Float[torch.Tensor, "receiver d_model d_head"],
    eps: float,
    centred: bool,
    role: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor, Float[torch.Tensor, "receiver batch pos d_head"]]:
    """``norm(stream - correction[i]) @ folded[i]`` (no bias), with the normalised inputs
    before their scale and the scale: ``(inputs, scale, out)``. Differentiable as it stands
    (autograd's backward); :class:`_HeadProjection` runs it with a backward written out, the
    inputs in a :func:`~mi_core.buffers.scratch` buffer of ``role``."""
    if role is None:
        inputs = stream[None] - correction
    else:
        inputs = torch.sub(stream[None], correction, out=scratch(role, correction.shape, stream))
    if centred:
        inputs -= inputs.mean(-1, keepdim=True)
    receivers, batch, pos, d_model = inputs.shape
    stats = inputs if inputs.dtype in (torch.float32, torch.float64) else inputs.float()
    norm = torch.linalg.vector_norm(stats, dim=-1, keepdim=True)
    scale = (norm.square() / d_model + eps).sqrt()
    out = torch.bmm(inputs.reshape(receivers, -1, d_model), folded).view(receivers, batch, pos, -1)
    if torch.is_grad_enabled() and (out.requires_grad or scale.requires_grad):
        return inputs, scale, out / scale.to(out.dtype)
    return inputs, scale, out.div_(scale.to(out.dtype))  # the product is fresh: no new block


class _HeadProjection(torch.autograd.Function):
    """:func:`_head_projection` with frozen weights and a backward pass written out: one new
    tensor of the inputs' size (the product's gradient), the rest in place, where autograd
    would allocate one for each of the norm's division, multiplication and masking, the sum
    of the two paths and the negation."""

    @staticmethod
    def forward(
        ctx: Any,
        stream: torch.Tensor,
        correction: torch.Tensor,
        folded: torch.Tensor,
        eps: float,
        centred: bool,
        role: str | None,
        gradient_into: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> torch.Tensor:
        inputs, scale, out = _head_projection(stream, correction, folded, eps, centred, role)
        ctx.save_for_backward(inputs, folded, scale, out)
        ctx.centred, ctx.gradient_into = centred, gradient_into
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        inputs, folded, scale, out = ctx.saved_tensors
        receivers, batch, pos, d_model = inputs.shape
        # out = inputs @ folded / scale, scale = sqrt(mean(inputs^2) + eps); in the inputs'
        # dtype (under autocast the product, and so ``grad``, may be in a lower one)
        dtype = inputs.dtype
        scaled = grad.to(dtype) / scale.to(dtype)
        # d out / d scale = -out / scale; d scale / d inputs = inputs / (d_model * scale)
        through_scale = -(scaled * out.to(dtype)).sum(-1, keepdim=True) / (d_model * scale)
        grad_inputs = None
        if ctx.gradient_into is not None and ctx.needs_input_grad[1]:
            grad_inputs = ctx.gradient_into(inputs)  # where the correction's gradient goes
        if grad_inputs is None:
            grad_inputs = scratch("head input gradients", inputs.shape, inputs)
        torch.bmm(
            scaled.reshape(receivers, -1, scaled.shape[-1]),
            folded.mT.to(dtype),
            out=grad_inputs.view(receivers, -1, d_model),
        )
        grad_inputs = grad_inputs.view(receivers, batch, pos, d_model)
        grad_inputs.addcmul_(inputs, through_scale.to(inputs.dtype))
        if ctx.centred:
            grad_inputs -= grad_inputs.mean(-1, keepdim=True)
        grad_stream = grad_inputs.sum(0) if ctx.needs_input_grad[0] else None
        grad_correction = grad_inputs.neg_() if ctx.needs_input_grad[1] else None
        return grad_stream, grad_correction, None, None, None, None, None


class _SideBySide:
    """The deltas of one masked forward side by side, and their gradients (decoders, with
    gradients).

    ``values`` (``[senders, batch, pos, d_model]``): each sender's delta, detached, written
    once as the forward reaches it and read in place by every receiver point after it, in
    the forward and the backward pass. ``gradients``: each receiver point's backward adds its
    product straight into the rows of the senders it read (``addmm_`` / ``index_add_``, no
    fresh block per point for autograd to sum), and :class:`_Tap` hands a sender block its
    rows once every point that read it is done: autograd runs a node's backward only after
    every node that used its output, and every point takes the tapped deltas as inputs.
    """

    def __init__(self, n_senders: int, like: torch.Tensor) -> None:
        self.values = scratch("side values", (n_senders, *like.shape), like)
        self.gradients: torch.Tensor | None = None  # allocated at the first gradient

    def flat_gradients(self) -> torch.Tensor:
        if self.gradients is None:
            self.gradients = scratch("side gradients", self.values.shape, self.values).zero_()
        return self.gradients.view(self.values.shape[0], -1)

    def take(self, start: int, size: int) -> torch.Tensor | None:
        return None if self.gradients is None else self.gradients[start : start + size]


#: Receivers that share one product over the senders before them (:class:`_LayerGroup`), in
#: whole layers. A SmolLM2 step (28 receivers a layer) in the middle of a run (8 x 64 tokens,
#: 2 CPU cores, two interleaved rounds) took 4.83 / 5.23 s with groups of 2 layers (56
#: receivers), 4.66 / 4.94 with 4 (112), 4.82 / 5.05 with 8 and 6.23 / 5.07 with 16: larger
#: groups read the senders' block less often, but each point adds more senders itself. A
#: model with many heads a layer already has products this wide (and a group's product and
#: gradients hold its receivers' inputs: memory), so it groups fewer layers, down to one.
_RECEIVERS_PER_PRODUCT = 112


def _layers_per_group(per_layer: int) -> int:
    """Layers of ``per_layer`` receivers each in a group: about :data:`_RECEIVERS_PER_PRODUCT`
    receivers, at least one layer."""
    return max(1, round(_RECEIVERS_PER_PRODUCT / per_layer))


class _LayerGroup:
    """Receivers ``start:stop`` of a few layers, corrected from one product over the first
    ``n`` senders (``blocks`` delta blocks) and, at each point, the senders since; it gathers
    the receivers' gradients as the backward pass reaches them. It holds no tensor that
    autograd made (the product is the run's), so the backward graph, whose nodes keep the
    group, has no reference cycle and its buffers go as soon as the pass is done."""

    def __init__(self, start: int, stop: int, n: int, blocks: int) -> None:
        self.start, self.stop, self.n, self.blocks = start, stop, n, blocks
        self.gradients: torch.Tensor | None = None
        self.written = [False] * (stop - start)
        self.active = False  # its points are corrected from its product

    def rows(self, first: int, size: int, like: torch.Tensor) -> torch.Tensor:
        """The gradient rows of receivers ``first:first + size`` (relative), ``[size, ...]``
        shaped as ``like``'s trailing dimensions (its dtype and device)."""
        width = like[0].numel()
        if self.gradients is None:
            self.gradients = scratch("group gradients", (len(self.written), width), like)
        return self.gradients[first : first + size].view(size, *like.shape[1:])

    def write(self, first: int, grad: torch.Tensor) -> None:
        """Keep the gradient of receivers ``first:first + len(grad)`` (relative): a copy,
        unless it was formed in its rows already (:meth:`rows`)."""
        rows = self.rows(first, grad.shape[0], grad)
        if rows.data_ptr() != grad.data_ptr():
            rows.copy_(grad)
        self.written[first : first + grad.shape[0]] = [True] * grad.shape[0]

    def take(self) -> torch.Tensor | None:
        """The receivers' gradients (zero where none came), let go by the group."""
        gradients, self.gradients = self.gradients, None
        if gradients is not None and not all(self.written):
            missing = [i for i, done in enumerate(self.written) if not done]
            gradients[missing] = 0.0
        return gradients


class _GroupPart(torch.autograd.Function):
    """A point's correction from its group's product (rows ``first:stop``) plus
    ``extra.T @ values[group.n:]``, the senders since the product; its backward hands the
    point's gradient to the group and does the extra senders' share itself."""

    @staticmethod
    def forward(
        ctx: Any,
        product: torch.Tensor,
        extra: torch.Tensor | None,
        group: _LayerGroup,
        first: int,
        stop: int,
        side: _SideBySide,
        *deltas: torch.Tensor,
    ) -> torch.Tensor:
        ctx.save_for_backward(extra)
        ctx.group, ctx.side, ctx.first = group, side, first
        if extra is None:  # the product's rows as they are (a view: no copy; read only)
            return product[first:stop]
        flat_product = product.view(product.shape[0], -1)[first:stop]
        out = scratch("correction", flat_product.shape, flat_product)
        values = _gather(side.values[group.n : group.n + extra.shape[0]], None, deltas)
        flat = values.reshape(extra.shape[0], -1)
        torch.addmm(flat_product, extra.T.to(flat.dtype), flat, out=out)
        return out.view(stop - first, *product.shape[1:])

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        (extra,) = ctx.saved_tensors
        group, side = ctx.group, ctx.side
        # under autocast the product, and so ``grad``, may be in a lower dtype than the values
        flat_grad = grad.reshape(grad.shape[0], -1).to(side.values.dtype)
        group.write(ctx.first, flat_grad)
        grad_extra = None
        if extra is not None:
            if ctx.needs_input_grad[1]:
                values = _gather(side.values[group.n : group.n + extra.shape[0]], None, ())
                grad_extra = values.reshape(extra.shape[0], -1) @ flat_grad.T
            if any(ctx.needs_input_grad[6:]):
                side.flat_gradients()[group.n : group.n + extra.shape[0]].addmm_(extra, flat_grad)
        return (None, grad_extra, *(None,) * (len(ctx.needs_input_grad) - 2))


class _HeadsInto(torch.autograd.Function):
    """A layer's heads' outputs in the residual stream, ``z W_O`` per head
    (``[heads, batch, pos, d_model]``), written into their side-by-side rows by one batched
    product, and tapped there as :class:`_Tap` taps a block: its backward adds what the side
    gathered for those rows to any gradient of the returned values, then takes the gradient
    to ``z`` (``W_O`` frozen). The returned values share the rows' memory without being a
    view of them for autograd: later rows of the same buffer are written in place, which a
    view of it would not survive."""

    @staticmethod
    def forward(
        ctx: Any, z: torch.Tensor, w_o: torch.Tensor, side: _SideBySide, start: int
    ) -> torch.Tensor:
        ctx.set_materialize_grads(False)
        heads = w_o.shape[0]
        rows = side.values[start : start + heads]
        per_head = z.permute(2, 0, 1, 3).reshape(heads, -1, z.shape[-1])  # [head, b*p, d_head]
        with torch.no_grad():
            torch.bmm(per_head, w_o, out=rows.view(heads, -1, rows.shape[-1]))
        ctx.save_for_backward(w_o)
        ctx.side, ctx.start, ctx.shape = side, start, z.shape
        return rows.detach()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
        (w_o,) = ctx.saved_tensors
        batch, pos, heads, d_head = ctx.shape
        gathered = ctx.side.take(ctx.start, heads)
        if gathered is not None:
            grad = gathered if grad is None else grad + gathered
        if grad is None:
            return None, None, None, None
        flat = grad.reshape(heads, -1, grad.shape[-1]).to(w_o.dtype)  # [head, b*p, d_model]
        grad_z = torch.bmm(flat, w_o.mT).view(heads, batch, pos, d_head)
        return grad_z.permute(1, 2, 0, 3), None, None, None


class _Tap(torch.autograd.Function):
    """Identity on a block of deltas; its backward adds what :class:`_SideBySide` gathered
    for them."""

    @staticmethod
    def forward(ctx: Any, delta: torch.Tensor, side: _SideBySide, start: int) -> torch.Tensor:
        ctx.set_materialize_grads(False)
        ctx.side, ctx.start, ctx.size = side, start, delta.shape[0]
        return delta.view_as(delta)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor | None) -> tuple[torch.Tensor | None, None, None]:
        gathered = ctx.side.take(ctx.start, ctx.size)
        if gathered is None:
            return grad, None, None
        return (gathered if grad is None else grad + gathered), None, None


class _Correction(torch.autograd.Function):
    """``columns.T @ cat(deltas)[rows]`` as one matrix product, keeping only references.

    Autograd would otherwise save a concatenated copy of every delta at every receiver point
    (memory quadratic in depth); this saves the delta blocks themselves, shared by all points,
    and gathers them again in the backward pass. ``rows`` (sorted sender indices, or None for
    all of them) picks the senders that are read; the others get no gradient. With ``side``
    (decoders) the deltas are read from its values, and their gradients go into it instead of
    being returned.
    """

    @staticmethod
    def forward(
        ctx: Any,
        columns: torch.Tensor,
        rows: torch.Tensor | None,
        side: _SideBySide | None,
        *deltas: torch.Tensor,
    ) -> torch.Tensor:
        # the deltas already side by side (decoders: rows never written again), or None to
        # gather them here and again in the backward pass
        ctx.sizes = [d.shape[0] for d in deltas]
        stacked = None if side is None else side.values[: sum(ctx.sizes)]
        ctx.save_for_backward(columns, *([] if side is not None else deltas))
        ctx.stacked, ctx.rows, ctx.side = stacked, rows, side
        read = _gather(stacked, rows, deltas)
        flat = read.reshape(read.shape[0], -1)
        # into a reused buffer: the receiver's input is formed from it before the next
        # point's correction, and nothing keeps it (a subclass may name another role)
        role = getattr(ctx, "role", "correction")
        out = scratch(role, (columns.shape[1], flat.shape[1]), flat)
        torch.mm(columns.T.to(flat.dtype), flat, out=out)
        return out.view(columns.shape[1], *read.shape[1:])

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        columns, *deltas = ctx.saved_tensors
        rows, sizes = ctx.rows, ctx.sizes
        # under autocast the product, and so ``grad``, may be in a lower dtype than the deltas
        flat_grad = grad.reshape(grad.shape[0], -1).to(columns.dtype)
        grad_columns = None
        if ctx.needs_input_grad[0]:
            read = _gather(ctx.stacked, rows, deltas)
            grad_columns = read.reshape(read.shape[0], -1) @ flat_grad.T
        grad_deltas: list[torch.Tensor | None] = [None] * len(sizes)
        if any(ctx.needs_input_grad[3:]):
            if ctx.side is not None:  # summed in place; the taps hand them on
                if rows is None:
                    ctx.side.flat_gradients()[: columns.shape[0]].addmm_(columns, flat_grad)
                else:
                    ctx.side.flat_gradients().index_add_(0, rows, columns @ flat_grad)
                return (grad_columns, None, None, *grad_deltas)
            flat = (columns @ flat_grad).reshape(columns.shape[0], *grad.shape[1:])
            if rows is None:
                grad_deltas = list(torch.split(flat, sizes))
            else:
                start = 0
                for i, size in enumerate(sizes):
                    inside = (rows >= start) & (rows < start + size)
                    if bool(inside.any()):
                        block = flat.new_zeros((size, *flat.shape[1:]))
                        grad_deltas[i] = block.index_copy_(0, rows[inside] - start, flat[inside])
                    start += size
        return (grad_columns, None, None, *grad_deltas)


class _GroupProduct(_Correction):
    """:class:`_Correction` over every sender so far, for every receiver of a
    :class:`_LayerGroup`. The points' parts take the product as input and hand their
    gradients to the group, not to autograd, so its backward runs once every part's has, and
    takes the group's gradients: one product for the columns' gradient and one ``addmm_``
    into the senders'."""

    @staticmethod
    def forward(
        ctx: Any,
        columns: torch.Tensor,
        group: _LayerGroup,
        side: _SideBySide,
        *deltas: torch.Tensor,
    ) -> torch.Tensor:
        ctx.set_materialize_grads(False)  # the parts pass None
        ctx.group, ctx.role = group, "group correction"
        return _Correction.forward(ctx, columns, None, side, *deltas)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
        gradients = ctx.group.take()
        if gradients is None:
            return (None,) * len(ctx.needs_input_grad)
        return _Correction.backward(ctx, gradients)


def _gather(
    stacked: torch.Tensor | None, rows: torch.Tensor | None, deltas: Sequence[torch.Tensor]
) -> torch.Tensor:
    """The deltas of senders ``rows`` (all if None) side by side, copying no more than those."""
    if stacked is not None:
        return stacked if rows is None else stacked.index_select(0, rows)
    if rows is None:
        return torch.cat(tuple(deltas)) if len(deltas) > 1 else deltas[0]
    parts, start = [], 0
    for delta in deltas:
        size = delta.shape[0]
        inside = rows[(rows >= start) & (rows < start + size)]
        if len(inside):
            parts.append(delta.index_select(0, inside - start))
        start += size
    return torch.cat(parts) if len(parts) > 1 else parts[0]


def _through_layer_norm(
    delta: Float[torch.Tensor, "n batch pos d_model"],
    scale: Float[torch.Tensor, "batch pos 1"],
    weight: Float[torch.Tensor, " d_model"],
) -> Float[torch.Tensor, "n batch pos d_model"]:
    """LayerNorm's linear part at the run's own scale: centre, divide by the scale, times ``w``.

    The scale is the masked run's, so it depends on the edge weights; its gradient flows (as it
    does through the model's own LayerNorms), so a masked forward's gradient is the derivative
    of that forward. Detaching it here had mixed a frozen-scale derivative into the true one
    (cosine 0.99 against finite differences on a tiny BERT mid-run, 52 % of the edges more than
    10 % off)."""
    return (delta - delta.mean(-1, keepdim=True)) * (weight / scale)


def graph_error(
    model: Any, graph: Graph, clean: dict[str, torch.Tensor], corrupted: dict[str, torch.Tensor]
) -> dict[str, float]:
    """How exactly the graph describes ``model`` on one batch (max absolute logit differences).

    ``full``: every edge kept vs the plain forward (0 up to float error, for every family).
    ``empty``: every edge removed (corrupted fill) vs the corrupted run's forward: 0 up to float
    error for decoders; for post-LN encoders, the error of taking LayerNorm scales from the
    masked run instead of the corrupted one.
    """
    with torch.no_grad():
        plain, corrupt = model(**clean), model(**corrupted)
        outputs = node_outputs(model, graph, **corrupted)
        errors = {}
        for name, mask, reference in (
            ("full", EdgeMask.full(graph), plain),
            ("empty", EdgeMask.empty(graph), corrupt),
        ):
            with (
                graph_switches(model),
                hooked(model, mask.with_corrupted(outputs).hooks(model)),
            ):
                errors[name] = float((model(**clean) - reference).abs().max())
    return errors


_MIB_NODE = re.compile(r"^(?:input|logits|a(\d+)\.h(\d+)|m(\d+))$")


def _from_mib_name(name: str) -> str:
    """``a0.h1->a2.h5<q>`` (MIB / EAP-IG) as ``L0.H1->L2.H5.q``."""
    match = re.match(r"^(.+)->(.+?)(?:<([qkv])>)?$", name)
    if match is None:
        raise InterventionError(f"{name!r} is not an MIB edge name (like 'a0.h1->a2.h5<q>')")

    def node(text: str) -> str:
        found = _MIB_NODE.match(text)
        if found is None:
            raise InterventionError(f"{name!r}: {text!r} is not an MIB node name")
        if text in ("input", "logits"):
            return "output" if text == "logits" else "input"
        if found[3] is not None:
            return str(Component(int(found[3])))
        return str(Component(int(found[1]), int(found[2])))

    receiver = node(match[2]) + (f".{match[3]}" if match[3] else "")
    return f"{node(match[1])}->{receiver}"


def to_mib_name(name: str) -> str:
    """``L0.H1->L2.H5.q`` as the MIB / EAP-IG name ``a0.h1->a2.h5<q>``."""
    sender, _, receiver = name.partition("->")

    def node(text: str) -> str:
        if text in ("input", "output"):
            return "logits" if text == "output" else "input"
        part = Component.parse(text)
        return f"m{part.layer}" if part.is_mlp else f"a{part.layer}.h{part.head}"

    suffix = ""
    if receiver.endswith((".q", ".k", ".v")):
        receiver, suffix = receiver[:-2], f"<{receiver[-1]}>"
    return f"{node(sender)}->{node(receiver)}{suffix}"
