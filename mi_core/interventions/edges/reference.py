"""The masked forward of an edge mask, stated plainly: the definition the fused engine meets.

Every receiver gets ``its input - sum over removed edges (delta of the sender)``, where a
sender's *delta* is ``its output - its fill`` (the corrupted run's output, the mean, or zero),
carried through every LayerNorm between sender and receiver at the run's own scale (post-LN
encoders; see :mod:`~mi_core.interventions.edges.graph`). Here that is written as it reads:
TransformerLens's per-head query / key / value inputs, one ``einsum`` over every delta so far
at each receiver, autograd for the gradients. :meth:`EdgeMask.hooks` runs the fused forward of
:mod:`~mi_core.interventions.edges._engine` instead (the same values and gradients, tested on
every family, in a fraction of the time and memory); use this one to read, check or extend the
method::

    with graph_switches(model), hooked(model, reference_hooks(model, mask)):
        logits = model(clean_ids)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from jaxtyping import Float

from mi_core.errors import InterventionError
from mi_core.interventions.edges.graph import Graph
from mi_core.interventions.edges.mask import EdgeMask
from mi_core.interventions.edges.recording import sender_zero_outputs
from mi_core.models.hooks import act_name

if TYPE_CHECKING:
    from mi_core.models.types import HookedModel

__all__ = ["reference_hooks"]


def _fill(
    mask: EdgeMask,
    start: int,
    outputs: Float[torch.Tensor, "n batch pos d_model"],
    zero: torch.Tensor | None,
) -> torch.Tensor | float:
    """The fill of senders ``start:start + n`` (``zero``: the senders' outputs when they
    write nothing, :func:`~mi_core.interventions.edges.recording.sender_zero_outputs`)."""
    if mask.fill == "zero":
        return 0.0 if zero is None else zero[start : start + outputs.shape[0], None, None, :]
    if mask.fill == "mean":
        assert mask.means is not None
        return mask.means[start : start + outputs.shape[0], None, None, :].to(outputs)
    if mask.corrupted is None:
        raise InterventionError(
            "a corrupted-fill edge mask needs the corrupted run: "
            "mask.patching(model, corrupted_input) binds it"
        )
    return mask.corrupted[start : start + outputs.shape[0]].to(outputs)


def reference_hooks(model: HookedModel, mask: EdgeMask) -> list[tuple[str, Callable]]:
    """Hooks that run ``mask``'s masked forward the plain way (the graph's switches on)."""
    graph: Graph = mask.graph
    graph.check_model(model)
    removed = graph.to_dense(1.0 - mask.weights.float(), fill=0.0)  # [sender, receiver]
    zero = sender_zero_outputs(model, graph)
    deltas: list[torch.Tensor] = []  # blocks of [n, batch, pos, d_model], in sender order
    pending: dict[str, torch.Tensor] = {}
    n_heads = graph.n_heads

    def append(start: int, outputs: torch.Tensor) -> None:
        deltas.append(outputs - _fill(mask, start, outputs, zero))

    def correction(receivers: slice | list[int]) -> torch.Tensor:
        """``[receiver, batch, pos, d_model]``: the removed edges' deltas into ``receivers``."""
        done = torch.cat(deltas)
        columns = removed[: done.shape[0], receivers].to(done)
        return torch.einsum("sr,sbpd->rbpd", columns, done)

    def start(x: torch.Tensor, hook: Any) -> None:
        deltas.clear()
        append(0, x[None])

    def head_input(layer: int, kind: str) -> Callable:
        def hook(x: torch.Tensor, hook: Any) -> torch.Tensor:
            if kind == "q":  # q, k and v receivers of every head: [batch, pos, 3 * heads, d]
                pending["qkv"] = correction(graph.qkv_receivers(layer)).permute(1, 2, 0, 3)
            i = "qkv".index(kind)
            return x - pending["qkv"][:, :, i * n_heads : (i + 1) * n_heads]

        return hook

    def heads(layer: int) -> Callable:
        def hook(z: torch.Tensor, hook: Any) -> None:
            w_o = model.blocks[layer].attn.W_O  # [head, d_head, d_model]
            append(graph.head_sender(layer, 0), torch.einsum("bphe,hem->hbpm", z, w_o.to(z)))

        return hook

    def mlp_out(layer: int) -> Callable:
        return lambda x, hook: append(graph.mlp_sender(layer), x[None])

    def receiver(index: int) -> Callable:
        return lambda x, hook: x - correction([index])[0]

    def layer_norm(ln: Any) -> Callable:
        def hook(scale: torch.Tensor, hook: Any) -> None:  # centre, divide by scale, times w
            deltas[:] = [(d - d.mean(-1, keepdim=True)) * (ln.w / scale) for d in deltas]

        return hook

    def encoder_mlp_input(layer: int) -> Callable:  # the correction enters through W_in
        w_in = model.blocks[layer].mlp.W_in
        index = graph.mlp_receiver(layer)
        return lambda x, hook: x - correction([index])[0] @ w_in.to(x)

    hooks: list[tuple[str, Callable]] = [(act_name("resid_pre", 0), start)]
    for layer in range(graph.n_layers):
        block = model.blocks[layer]
        hooks += [(act_name(f"{k}_input", layer), head_input(layer, k)) for k in "qkv"]
        hooks.append((act_name("z", layer), heads(layer)))
        if graph.post_ln:
            hooks += [
                (act_name("scale", layer, "ln1"), layer_norm(block.ln1)),
                (act_name("pre", layer), encoder_mlp_input(layer)),
                (act_name("mlp_out", layer), mlp_out(layer)),
                (act_name("scale", layer, "ln2"), layer_norm(block.ln2)),
            ]
        else:
            hooks += [
                (act_name("mlp_in", layer), receiver(graph.mlp_receiver(layer))),
                (act_name("mlp_out", layer), mlp_out(layer)),
            ]
    out_point = "normalized_resid_post" if graph.post_ln else "resid_post"
    hooks.append((act_name(out_point, graph.n_layers - 1), receiver(graph.output_receiver)))
    return hooks
