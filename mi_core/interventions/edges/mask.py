"""Edge masks as an intervention: which edges of a graph are kept, and what fills the others.

An :class:`EdgeMask` is data: a weight per edge (1 kept, 0 removed, anything between for
pruning), and the fill of a removed edge: the corrupted run's output of its sender
(``corrupted``, activation patching), the sender's mean output over a data set (``mean``), or
zero. A receiver gets ``its input - sum over removed edges (sender output - fill)``: the
activations flow as in the model except along removed edges. Masks save, load and apply like
every intervention::

    graph = Graph.from_model(model)
    mask = EdgeMask.from_edges(graph, ["input->L0.H1.v", "L0.H1->output"], fill="corrupted")
    with apply(model, mask.patching(model, corrupted_ids)):
        logits = model(clean_ids)

Masks of one graph and fill combine on their *kept* edges: ``a | b`` keeps what either keeps,
``a & b`` what both keep, ``a - b`` what ``a`` keeps and ``b`` does not.

The forward a mask's hooks run is :mod:`mi_core.interventions.edges._engine` (fused, exact);
:mod:`mi_core.interventions.edges.reference` states the same forward plainly.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Self

import torch
from jaxtyping import Float

from mi_core.errors import InterventionError
from mi_core.interventions.config import FILLS
from mi_core.interventions.edges._engine import masked_hooks
from mi_core.interventions.edges.graph import (
    Graph,
    NodeOutputs,
    from_mib_name,
    graph_switches,
    greedy_order,
    top_k_order,
)
from mi_core.interventions.edges.recording import node_outputs
from mi_core.interventions.kinds import read_kind, register_kind
from mi_core.io import read_json, write_safetensors
from mi_core.models.hook_context import hooked

if TYPE_CHECKING:
    from mi_core.models.types import HookedModel

__all__ = ["EDGE_MASK_KIND", "EdgeMask", "graph_error"]

#: The ``kind`` in the metadata of a saved edge mask.
EDGE_MASK_KIND = "mi_core.EdgeMask"
_FORMAT_VERSION = "1"


_EDGE_MASK_APPLIED = "_mi_core_edge_mask_applied"


@contextlib.contextmanager
def _one_edge_mask(model: HookedModel) -> Iterator[None]:
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


class GraphMask:
    """What an edge mask and an output mask share (dataclasses with ``graph``, ``weights``,
    ``fill``, ``means`` and ``corrupted`` fields): binding a corrupted run, and saving."""

    graph: Graph
    weights: torch.Tensor
    fill: str
    means: torch.Tensor | None
    #: The ``kind`` in a saved mask's metadata, and what the mask is called in messages.
    kind: ClassVar[str]
    what: ClassVar[str]

    def with_corrupted(self, outputs: NodeOutputs) -> Self:
        """This mask with its fill bound to a corrupted run's sender outputs."""
        if outputs.shape[0] != self.graph.n_senders or outputs.shape[-1] != self.graph.d_model:
            raise InterventionError(
                f"corrupted outputs of shape {tuple(outputs.shape)} do not fit {self.graph}"
            )
        return replace(self, corrupted=outputs)  # type: ignore[type-var]

    def patching(self, model: HookedModel, *args: Any, **kwargs: Any) -> Self:
        """This mask bound to the corrupted run ``model(*args, **kwargs)``."""
        return self.with_corrupted(node_outputs(model, self.graph, *args, **kwargs))

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write weights, fill and (for ``mean``) means as one safetensors file, atomically. A
        corrupted run is data, not part of the mask, and is not saved."""
        if Path(path).suffix.lower() != ".safetensors":
            raise InterventionError(f"cannot save an {self.what} as {path}: use .safetensors")
        tensors = {"weights": self.weights.detach().float()}
        if self.means is not None:
            tensors["means"] = self.means.detach().float()
        metadata = {"kind": self.kind, "format_version": _FORMAT_VERSION, "fill": self.fill,
                    "graph": json.dumps(self.graph.to_dict())}  # fmt: skip
        return write_safetensors(path, tensors, metadata)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Self:
        """Read a mask of this kind written by :meth:`save`."""
        tensors, metadata = read_kind(path, cls.kind, cls.what, _FORMAT_VERSION)
        graph = Graph(**json.loads(metadata["graph"]))
        return cls(graph, tensors["weights"], metadata["fill"], tensors.get("means"))  # type: ignore[call-arg]


def check_mask(
    what: str, graph: Graph, fill: str, means: torch.Tensor | None, weights: torch.Tensor,
    shape: tuple[int, ...],
) -> None:  # fmt: skip
    """Refuse an unknown fill, a ``mean`` fill without one mean output per sender, and
    weights not of ``shape`` (what the mask weighs)."""
    if fill not in FILLS:
        raise InterventionError(f"unknown {what} fill {fill!r}; expected one of {FILLS}")
    if tuple(weights.shape) != shape:
        wanted = f"{shape[0]} weights" if len(shape) == 1 else f"weights of shape {shape}"
        raise InterventionError(f"an {what} of {graph} needs {wanted}, got {tuple(weights.shape)}")
    expected = (graph.n_senders, graph.d_model)
    if fill == "mean" and (means is None or tuple(means.shape) != expected):
        raise InterventionError(
            f"a mean-filled {what} needs means of shape {expected} (sender_means)"
        )


def _check_k(graph: Graph, k: int) -> None:
    if not 0 <= k <= graph.n_edges:
        raise InterventionError(f"k must be between 0 and {graph.n_edges}, not {k}")


# ------------------------------------------------------------------------------ edge masks
@dataclass(eq=False)
class EdgeMask(GraphMask):
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

    #: Its hooks act after every hook already on the model: it reads each sender's output and
    #: the residual stream as the model (and the interventions acting first) computed them.
    hook_position: ClassVar[str] = "last"
    kind: ClassVar[str] = EDGE_MASK_KIND
    what: ClassVar[str] = "edge mask"

    def __post_init__(self) -> None:
        shape = (self.graph.n_edges,)
        check_mask("edge mask", self.graph, self.fill, self.means, self.weights, shape)

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
        cls, graph: Graph, scores: Float[torch.Tensor, " edge"], k: int, fill: str = "corrupted",
        absolute: bool = True, **kwargs: Any,
    ) -> EdgeMask:  # fmt: skip
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

    def __or__(self, other: EdgeMask) -> EdgeMask:
        """The edges either keeps (the same graph and fill; this mask's binding)."""
        self._check_combinable(other, "|")
        return replace(self, weights=torch.maximum(self.weights, other.weights))

    def __and__(self, other: EdgeMask) -> EdgeMask:
        """The edges both keep: every edge either removes is removed (the same graph and fill;
        this mask's binding). How to apply two masks at once."""
        self._check_combinable(other, "&")
        return replace(self, weights=torch.minimum(self.weights, other.weights))

    def __sub__(self, other: EdgeMask) -> EdgeMask:
        """The edges this mask keeps and ``other`` does not (the same graph and fill; this
        mask's binding): ``min(a, 1 - b)`` per edge."""
        self._check_combinable(other, "-")
        return replace(self, weights=torch.minimum(self.weights, 1.0 - other.weights))

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
    def prepare(self, model: HookedModel) -> contextlib.AbstractContextManager[Any]:
        """The switches the graph needs (:func:`graph_switches`), for :func:`apply`; one edge
        mask at a time: a second one, in the same ``apply`` or nested, is refused (each feeds
        receivers their input minus its removed edges' differences, so an edge both remove
        would be subtracted twice): apply ``a & b``."""
        return _one_edge_mask(model)

    def hooks(self, model: HookedModel) -> list[tuple[str, Callable]]:
        """Hooks that feed every receiver its input minus the removed edges' differences.

        The model must have the graph's switches on (:func:`apply` does it).
        """
        return masked_hooks(model, self)

    def claims(self, model: HookedModel) -> dict[Hashable, str]:
        """None: a second edge mask is refused whole, by :meth:`prepare`."""
        return {}

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
            names = [from_mib_name(name) for name in names]
        return cls.from_edges(graph, names, fill, **kwargs)


register_kind(EDGE_MASK_KIND, EdgeMask.load)


def graph_error(
    model: HookedModel,
    graph: Graph,
    clean: dict[str, torch.Tensor],
    corrupted: dict[str, torch.Tensor],
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
