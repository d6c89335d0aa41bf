"""The computational graph of a hooked model: senders, receivers and edges.

Nodes that write to the residual stream (*senders*): the input embedding (``input``), every
head (``L2.H5``) and every MLP (``L3.MLP``). Inputs that read from it (*receivers*): each
head's query, key and value input (``L2.H5.q``, ``.k``, ``.v``), each MLP's input (``L3.MLP``)
and the output (``output``: the unembedding or the classifier head). An edge joins a sender to
every receiver after it (``L0.H1->L2.H5.q``, ``input->L0.MLP``, ``L5.MLP->output``); a layer's
heads feed its own MLP, except in *parallel* blocks (GPT-NeoX / Pythia, GPT-J, Phi-1 / 2),
where attention and MLP both read the block's input: there a layer's heads reach the MLPs of
later layers only.

*Pre-LayerNorm decoders* (every causal-LM family whose sublayer outputs are added to the
residual stream as they are, :data:`mi_core.models.families.FAMILIES`): the residual
stream at a receiver is the sum of the outputs of the senders before it plus constant biases
(attention's ``b_O``), so an edge is exact. Grouped-query models are ungrouped while a graph
acts: each query head gets its own key and value input (``L2.H5.k``).

*Normed attention outputs* (Gemma 2 / 3): a layer's attention output passes an RMSNorm before
the residual add; with its scale frozen at the run's own value (:func:`frozen_output_norms`,
part of :func:`graph_switches`) each head's share of it is a sender as above.

*Post-LayerNorm encoders* (BERT, RoBERTa, MiniLM): LayerNorm acts on the residual stream after
every sublayer, ``LN(x) = (x - mean x) / sigma(x) * w + b``. With each token's scale ``sigma``
frozen at its value in the run, LayerNorm is affine, so the stream at a receiver is again a
sum: each sender's output carried through the LayerNorms between them (centred, divided by
that run's scale, times ``w``), plus constants. Edges are defined through that linear map, with
the scale taken from the run that is being computed (the clean run for attribution scores, the
masked run for a masked forward). With every edge kept this is the model exactly; with every
edge removed it differs from the corrupted run only through the scales
(:func:`~mi_core.interventions.edges.graph_error` measures both). The MLP receiver of an encoder
acts on the MLP's own input (at ``mlp.hook_pre``), not on the residual stream the MLP's output
is added to.

Also here: the model switches a graph needs (:func:`graph_switches`), edge orders for circuits
(:func:`top_k_order`, :func:`greedy_order`) and MIB / EAP-IG edge names (:func:`to_mib_name`).
"""

from __future__ import annotations

import contextlib
import re
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

import torch
from jaxtyping import Bool, Float
from transformer_lens.components import BertBlock, TransformerBlock
from transformer_lens.utilities.architectures import POST_NORM_ARCHITECTURES

from mi_core.errors import InterventionError
from mi_core.interventions.components import Component
from mi_core.models.families import family_of_model
from mi_core.models.hooks import act_name

if TYPE_CHECKING:
    from mi_core.models.types import HookedModel

__all__ = [
    "SUPPORTED_GRAPHS",
    "Graph",
    "NodeOutputs",
    "from_mib_name",
    "graph_switches",
    "greedy_order",
    "to_mib_name",
    "top_k_order",
]

#: The model families that have a computational graph, in words (error messages).
SUPPORTED_GRAPHS = (
    "decoders, sequential or parallel (GPT-2, OPT, Llama, Mistral, Mixtral, Qwen2 / 3, Phi, "
    "Phi-3, Gemma 1 / 2 / 3, GPT-NeoX, GPT-J, GPT-Neo, OLMo, OLMo-2 / 3, OLMoE, Apertus, "
    "GPT-OSS, BLOOM; their classifiers) and post-LayerNorm encoders (BERT, RoBERTa, MiniLM "
    "classifiers)"
)


def _component(text: str) -> Component | None:
    """The head or MLP named ``text`` (``L2.H5``, ``L3.MLP``), or None for another name."""
    try:
        return Component.parse(text)
    except InterventionError:
        return None


#: Outputs of every sender in one run, in graph order: ``[sender, batch, pos, d_model]``.
NodeOutputs = Float[torch.Tensor, "sender batch pos d_model"]


def reads_unnormed_stream(model: HookedModel) -> bool:
    """Whether ``model``'s heads read the residual stream as it is, with no norm before their
    projections (OLMo-2 / 3, which normalise each sublayer's output instead): a head's input
    is then its query / key / value input itself."""
    cfg = getattr(model, "cfg", None)
    return getattr(cfg, "original_architecture", None) in POST_NORM_ARCHITECTURES


#: Architectures whose query / key norms act on all heads at once (before the split by head).
_NORMED_ACROSS_HEADS = ("OlmoeForCausalLM", "Olmo2ForCausalLM", "Olmo3ForCausalLM")


def _family(model: HookedModel) -> str:
    """``"encoder"``, ``"parallel"`` or ``"sequential"``, or a clear error for a model with
    no graph (by its family's graph kind where mi_core loaded it, else by its blocks)."""
    blocks = getattr(model, "blocks", None)
    cfg = getattr(model, "cfg", None)
    if blocks is None or cfg is None or len(blocks) == 0:
        raise InterventionError(
            f"no circuit graph for {type(model).__name__}: supported are {SUPPORTED_GRAPHS}"
        )
    name = cfg.original_architecture or type(model).__name__
    if all(type(b) is BertBlock for b in blocks):
        return "encoder"
    family = family_of_model(model)
    if family is not None and family.graph not in ("sequential", "parallel", "post_norm_out"):
        raise InterventionError(
            f"no circuit graph for {name} ({family.exact}): supported are {SUPPORTED_GRAPHS}"
        )
    decoder = (
        all(type(b) is TransformerBlock for b in blocks)
        and cfg.normalization_type in ("LN", "LNPre", "RMS", "RMSPre")
        and not cfg.attn_only
    )
    grouped = cfg.n_key_value_heads is not None and cfg.n_key_value_heads != cfg.n_heads
    if grouped and name in _NORMED_ACROSS_HEADS:
        raise InterventionError(
            f"no circuit graph for {name} with grouped key / value heads: its key norm spans "
            "the grouped heads, so TransformerLens cannot give each query head its own key "
            "input; supported are " + SUPPORTED_GRAPHS
        )
    if decoder:
        return "parallel" if cfg.parallel_attn_mlp else "sequential"
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
    parallel: bool = False

    @classmethod
    def from_model(cls, model: HookedModel) -> Graph:
        """The graph of ``model`` (an error names the supported families for any other)."""
        family = _family(model)
        cfg = model.cfg
        return cls(
            cfg.n_layers,
            cfg.n_heads,
            cfg.d_model,
            post_ln=family == "encoder",
            parallel=family == "parallel",
        )

    def check_model(self, model: HookedModel) -> None:
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
        """A receiver's depth; it reads every sender of smaller depth. A parallel block's MLP
        reads the block's input, as its heads do, so it sits at their depth."""
        depth = []
        mlp = 0 if self.parallel else 1
        for layer in range(self.n_layers):
            depth += [2 * layer] * (3 * self.n_heads) + [2 * layer + mlp]
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

    def node_edges(self, nodes: Bool[torch.Tensor, " sender"]) -> Bool[torch.Tensor, " edge"]:
        """The edges of the circuit made of the kept ``nodes`` (senders): every edge from a kept
        node into a kept node or the output. Everything a node outside receives or sends is
        patched, so under the corrupted fill such a node computes its corrupted output, which
        is what activation patching of the node means (MIB's node-level circuits)."""
        nodes = nodes.detach().to("cpu", torch.bool)
        if nodes.shape != (self.n_senders,):
            raise InterventionError(
                f"expected {self.n_senders} node values, got {list(nodes.shape)}"
            )
        senders, receivers = self.edges[:, 0], self.edges[:, 1]
        owner = self._receiver_owner[receivers]
        into_kept = torch.where(owner >= 0, nodes[owner.clamp(min=0)], True)
        return nodes[senders] & into_kept

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
            "parallel": self.parallel,
        }

    def __str__(self) -> str:
        kind = (
            "post-LN encoder"
            if self.post_ln
            else "parallel pre-LN decoder"
            if self.parallel
            else "pre-LN decoder"
        )
        return (
            f"Graph({kind}, {self.n_layers} layers x {self.n_heads} heads: {self.n_senders} "
            f"senders, {self.n_receivers} receivers, {self.n_edges} edges)"
        )


# ------------------------------------------------------------------------ the model's switches
@contextlib.contextmanager
def _config_flags(model: HookedModel, **values: bool) -> Iterator[Any]:
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


@contextlib.contextmanager
def graph_switches(model: HookedModel, split_inputs: bool = True) -> Iterator[Any]:
    """Switch on what a graph needs for the span of a block: per-head query / key / value
    inputs (``split_inputs``; methods that take per-head gradients by hand run without them)
    with ``use_attn_in`` off, the MLP-input hook (decoders), ungrouped key / value heads
    (grouped-query models), and for families whose attention output passes a norm before the
    residual add, that norm at a frozen scale (:func:`frozen_output_norms`). The switches are
    restored on leaving."""
    flags = {"use_split_qkv_input": split_inputs, "use_attn_in": False, "use_hook_mlp_in": True}
    if model.cfg.n_key_value_heads is not None:
        flags["ungroup_grouped_query_attention"] = True
    with _config_flags(model, **flags), frozen_output_norms(model):
        yield model


def _output_norms(model: HookedModel) -> list[tuple[Any, Any]]:
    """``(attention, norm)`` of every layer whose attention output passes a norm before it is
    added to the residual stream (Gemma 2 / 3's ``ln1_post``, OLMo-2 / 3's ``ln1``); empty for
    every other model."""
    cfg = getattr(model, "cfg", None)
    blocks = getattr(model, "blocks", None)
    if cfg is None or blocks is None:
        return []
    if cfg.use_normalization_before_and_after:
        return [(b.attn, b.ln1_post) for b in blocks]
    if cfg.original_architecture in POST_NORM_ARCHITECTURES:
        return [(b.attn, b.ln1) for b in blocks]
    return []


#: Models inside a :func:`frozen_output_norms` block (a nested block does nothing).
_NORMS_FROZEN: weakref.WeakSet[Any] = weakref.WeakSet()


@contextlib.contextmanager
def frozen_output_norms(model: HookedModel) -> Iterator[Any]:
    """For the span of a block, write a normed attention output as a sum over heads.

    In Gemma 2 / 3 and OLMo-2 / 3 a layer's attention output is ``N(sum_h z_h W_O)`` with
    ``N(x) = x / s(x) * w`` (RMSNorm; these families have no attention bias): not a sum of
    head terms, so a head is no sender of its own. With the scale ``s`` frozen at its value in
    the run being computed (as a post-LN encoder's LayerNorm scales are), ``N`` is linear and
    the output is ``sum_h (z_h / s) (W_O w)``: here ``hook_z`` carries ``z / s`` (``s``
    computed from the heads' own sum, detached), ``W_O`` holds ``W_O w`` and the norm is the
    identity. Every value the model computes is unchanged (to rounding); each head's output
    is its share of what is added to the stream; gradients treat ``s`` as fixed. Nested
    blocks apply it once. Weights are restored on leaving."""
    norms = _output_norms(model)
    if not norms or model in _NORMS_FROZEN:
        yield model
        return
    from mi_core.models.hook_context import prepended_hooks

    for attn, _ in norms:
        if bool(attn.b_O.detach().abs().max() > 0):
            raise InterventionError(
                "an attention output bias before a normed output is not a sum of head terms; "
                "this model's graph is not defined"
            )

    def rescale(w_o: torch.Tensor, eps: float) -> Any:
        def hook(z: torch.Tensor, hook: Any) -> torch.Tensor:
            with torch.no_grad():
                out = torch.einsum("bphd,hdm->bpm", z.float(), w_o.to(z.device).float())
                scale = (out.pow(2).mean(-1, keepdim=True) + eps).sqrt()
            return z / scale[..., None].to(z.dtype)

        return hook

    def unit(scale: torch.Tensor, hook: Any) -> torch.Tensor:
        return torch.ones_like(scale)

    # new parameters in place of W_O and w (the originals are not written: a backward pass
    # after the block still finds the tensors its forward saved)
    originals = [(attn.W_O, norm.w) for attn, norm in norms]
    hooks = []
    for layer, ((_, norm), (w_o, _)) in enumerate(zip(norms, originals, strict=True)):
        hooks.append((act_name("z", layer), rescale(w_o.detach(), norm.eps)))
        hooks.append((norm.hook_scale.name, unit))
    _NORMS_FROZEN.add(model)
    try:
        for (attn, norm), (w_o, w) in zip(norms, originals, strict=True):
            folded = (w_o.detach() * w.detach().to(w_o.dtype)).requires_grad_(w_o.requires_grad)
            attn.W_O = torch.nn.Parameter(folded, requires_grad=w_o.requires_grad)
            norm.w = torch.nn.Parameter(torch.ones_like(w.detach()), requires_grad=w.requires_grad)
        with prepended_hooks(model, hooks):
            yield model
    finally:
        for (attn, norm), (w_o, w) in zip(norms, originals, strict=True):
            attn.W_O, norm.w = w_o, w
        _NORMS_FROZEN.discard(model)


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


# ------------------------------------------------------------------------------ MIB names
_MIB_NODE = re.compile(r"^(?:input|logits|a(\d+)\.h(\d+)|m(\d+))$")


def from_mib_name(name: str) -> str:
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
