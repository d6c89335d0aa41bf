"""Recording what every sender of a :class:`~mi_core.interventions.edges.graph.Graph` writes.

:func:`node_outputs` records one run (the ``corrupted`` fill of an edge mask), and
:func:`sender_means` averages it over a data set (the ``mean`` fill) and
:func:`sender_zero_outputs` says what a sender that writes nothing records (the ``zero`` fill).
:func:`head_results` gives each head's output in the residual stream from its ``hook_z``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
from jaxtyping import Float

from mi_core.buffers import scratch
from mi_core.errors import InterventionError
from mi_core.interventions.edges.graph import (
    Graph,
    NodeOutputs,
    _config_flags,
    frozen_output_norms,
)
from mi_core.models.classifier import batch_inputs
from mi_core.models.hook_context import hooked
from mi_core.models.hooks import act_name
from mi_core.models.value_biases import folded_value_biases

if TYPE_CHECKING:
    from mi_core.models.types import HookedModel

__all__ = ["head_results", "node_outputs", "sender_means", "sender_zero_outputs"]


def head_results(
    model: HookedModel,
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


def sender_zero_outputs(
    model: HookedModel, graph: Graph
) -> Float[torch.Tensor, "sender d_model"] | None:
    """What each sender's recorded output is when the sender writes nothing (the ``zero``
    fill), on the model's device and dtype; ``None`` when that is zero for every sender.

    A head whose value bias was folded out of ``hook_z`` (:mod:`mi_core.models.value_biases`)
    is recorded without its share of the output bias, ``b_V @ W_O``: writing nothing is then
    ``-b_V @ W_O`` in the recorded coordinates. Every other sender's is zero."""
    folded = folded_value_biases(model)
    if folded is None:
        return None
    param = next(model.parameters())
    out = torch.zeros(graph.n_senders, graph.d_model, device=param.device, dtype=param.dtype)
    with torch.no_grad():
        for layer in range(graph.n_layers):
            w_o = model.blocks[layer].attn.W_O.detach()  # [head, d_head, d_model]
            bias = folded[layer].to(w_o)
            first = graph.head_sender(layer, 0)
            out[first : first + graph.n_heads] = -torch.einsum("hd,hdm->hm", bias, w_o).to(out)
    return out


def _recorder_hooks(
    model: HookedModel,
    graph: Graph,
    store: dict[str, Any],
    head_z: dict[int, torch.Tensor] | None = None,
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
                head_results(model, layer, z, into=store["out"][first : first + graph.n_heads])
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


def node_outputs(model: HookedModel, graph: Graph, *args: Any, **kwargs: Any) -> NodeOutputs:
    """Run ``model(*args, **kwargs)`` without gradients and return every sender's output.

    Outputs are in each sender's own space (before any later LayerNorm). The forward stops at
    the last sender: the final norm, the unembedding or the classifier head never run (for a
    language model the unembedding and its logits are a large share of a forward; see
    ``bench_circuits.py`` in benchmarks/README.md).
    """
    return _record_senders(model, graph, args, kwargs)


def _record_senders(
    model: HookedModel,
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
        frozen_output_norms(model),
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
    model: HookedModel,
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
