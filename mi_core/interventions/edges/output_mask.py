"""Output masks: each sender's output kept or replaced dimension by dimension (MIB's neurons).

MIB's neuron level scores the ``d_model`` dimensions of every node's output (the input, each
head, each MLP) and patches the dimensions outside a circuit from the counterfactual prompt,
for every node the output reaches: a sender with weights ``w`` writes ``w * out + (1 - w) *
fill`` instead of ``out``. An :class:`OutputMask` is that intervention, data like an edge mask
(weights ``[sender, d_model]``, a fill, means, a corrupted run)::

    mask = OutputMask(graph, weights).patching(model, corrupted_ids)
    with apply(model, mask):
        logits = model(clean_ids)

A head's output is ``z_h W_O[h]`` (:func:`~mi_core.interventions.edges.recording.head_results`),
so the correction of a layer's heads is added to the attention output. A model that normalises
the attention output before the residual stream (Gemma 2's post-attention norm) would need the
correction before that norm, per head; such a model is refused.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from jaxtyping import Float

from mi_core.errors import InterventionError
from mi_core.interventions.edges.graph import Graph, NodeOutputs
from mi_core.interventions.edges.mask import GraphMask, check_mask
from mi_core.interventions.edges.recording import head_results, sender_zero_outputs
from mi_core.interventions.kinds import register_kind
from mi_core.models.hooks import act_name

if TYPE_CHECKING:
    from mi_core.models.types import HookedModel

__all__ = ["OUTPUT_MASK_KIND", "OutputMask"]

#: The ``kind`` in the metadata of a saved output mask.
OUTPUT_MASK_KIND = "mi_core.OutputMask"


@dataclass(frozen=True)
class OutputMask(GraphMask):
    """A weight per sender of ``graph`` and dimension of its output (1 kept, 0 replaced by the
    fill): ``corrupted`` (the sender's output in a corrupted run, bound with :meth:`patching`),
    ``mean`` (``means``, ``[sender, d_model]``) or ``zero`` (the sender writes nothing)."""

    #: Its hooks go first: a cache or a later hook sees the outputs it wrote.
    hook_position: ClassVar[str] = "first"
    kind: ClassVar[str] = OUTPUT_MASK_KIND
    what: ClassVar[str] = "output mask"

    graph: Graph
    weights: Float[torch.Tensor, "sender d_model"]
    fill: str = "corrupted"
    means: Float[torch.Tensor, "sender d_model"] | None = None
    corrupted: NodeOutputs | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        shape = (self.graph.n_senders, self.graph.d_model)
        check_mask("output mask", self.graph, self.fill, self.means, self.weights, shape)

    @classmethod
    def full(cls, graph: Graph, fill: str = "corrupted", **kwargs: Any) -> OutputMask:
        """Every dimension of every output kept."""
        return cls(graph, torch.ones(graph.n_senders, graph.d_model), fill, **kwargs)

    @property
    def n_kept(self) -> int:
        return int((self.weights > 0.5).sum())

    def __str__(self) -> str:
        total = self.graph.n_senders * self.graph.d_model
        return f"OutputMask({self.n_kept} of {total} output dimensions kept, {self.fill} fill)"

    # ------------------------------------------------------------------ intervention
    def hooks(self, model: HookedModel) -> list[tuple[str, Callable]]:
        """Hooks at the input (``hook_resid_pre`` of block 0), each layer's ``hook_z`` (read)
        and ``hook_attn_out`` (the heads' corrections), and each ``hook_mlp_out``."""
        graph = self.graph
        graph.check_model(model)
        if getattr(model.cfg, "use_normalization_before_and_after", False):
            raise InterventionError(
                "an output mask patches each head's output before the residual stream; this "
                "model normalises the attention output first (a post-attention norm), which "
                "output masks do not model"
            )
        if self.fill == "corrupted" and self.corrupted is None:
            raise InterventionError(
                "a corrupted-fill output mask needs the corrupted run: "
                "mask.patching(model, corrupted_input) binds it"
            )
        param = next(model.parameters())
        removed = (1.0 - self.weights.detach()).to(param)
        zero = sender_zero_outputs(model, graph)

        def fill(senders: slice, like: torch.Tensor) -> torch.Tensor:
            if self.fill == "corrupted":
                assert self.corrupted is not None
                return self.corrupted[senders].to(like)
            values = self.means if self.fill == "mean" else zero
            if values is None:
                return torch.zeros((1, 1, 1, like.shape[-1]), dtype=like.dtype, device=like.device)
            return values[senders].to(like)[:, None, None, :]

        def patch(senders: slice, out: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
            """``sum over senders of removed * (fill - out)``: ``out`` ``[sender, b, p, d]``."""
            gap = fill(senders, like) - out
            return (removed[senders][:, None, None, :] * gap).sum(0)

        hooks: list[tuple[str, Callable]] = []
        if bool(removed[0].any()):

            def input_hook(x: torch.Tensor, hook: Any) -> torch.Tensor:
                return x + patch(slice(0, 1), x[None], x)

            hooks.append((act_name("resid_pre", 0), input_hook))
        for layer in range(graph.n_layers):
            first = graph.head_sender(layer, 0)
            heads = slice(first, first + graph.n_heads)
            if bool(removed[heads].any()):
                hooks += self._head_hooks(model, layer, heads, patch)
            mlp = graph.mlp_sender(layer)
            if bool(removed[mlp].any()):

                def mlp_hook(x: torch.Tensor, hook: Any, mlp: int = mlp) -> torch.Tensor:
                    return x + patch(slice(mlp, mlp + 1), x[None], x)

                hooks.append((act_name("mlp_out", layer), mlp_hook))
        return hooks

    @staticmethod
    def _head_hooks(
        model: HookedModel, layer: int, heads: slice, patch: Callable[..., torch.Tensor]
    ) -> list[tuple[str, Callable]]:
        kept: dict[str, torch.Tensor] = {}

        def read_z(z: torch.Tensor, hook: Any) -> None:
            kept["z"] = z

        def attn_out(x: torch.Tensor, hook: Any) -> torch.Tensor:
            return x + patch(heads, head_results(model, layer, kept.pop("z")), x)

        return [(act_name("z", layer), read_z), (act_name("attn_out", layer), attn_out)]

    def claims(self, model: HookedModel) -> dict[Hashable, str]:
        """None: it replaces parts of outputs, not whole components."""
        return {}


register_kind(OUTPUT_MASK_KIND, OutputMask.load)
