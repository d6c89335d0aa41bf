"""Internal: the kernels of the fused masked forward (:mod:`~mi_core.interventions.edges._engine`).

Custom autograd functions that keep references instead of copies (:class:`_Correction`,
:class:`_GroupProduct`, :class:`_GroupPart`, :class:`_Tap`, :class:`_HeadsInto`), the buffers
the deltas and their gradients live in side by side (:class:`_SideBySide`), receiver groups
that share one product (:class:`_LayerGroup`), and each head's query / key / value projected
from its own input without per-head copies (:class:`_HeadInputs`). ``circuits/`` uses
:func:`folded_weights` and :func:`through_layer_norm`. Where each choice's cost was measured:
``benchmarks/README.md`` (``bench_circuits.py`` rows).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from jaxtyping import Float

from mi_core.buffers import scratch, workspace_memo

__all__ = ["folded_weights", "through_layer_norm"]


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
            folded, bias = folded_weights(attn, ln, normalization, stream.dtype, params)
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


def folded_weights(
    attn: Any, ln: Any, normalization: str, dtype: torch.dtype, params: Sequence[torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`_fold_weights`, detached. Inside a :func:`~mi_core.buffers.reusing_buffers`
    block that holds the weights fixed (``fixed_weights=True``: an edge-pruning run, an
    attribution) they are kept while the layer's parameters stay the same tensors at the same
    version, and dropped with the block: a run folds each
    layer once, not at every step (the concatenation, a grouped-query model's repeated key /
    value weights and the gain's product; what that saves: benchmarks/README.md). The
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
#: whole layers. About 112 (four of SmolLM2's layers) was the cheapest size measured
#: (benchmarks/README.md, "Group size"): larger groups read the senders' block less often,
#: but each point adds more senders itself. A
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


def through_layer_norm(
    delta: Float[torch.Tensor, "n batch pos d_model"],
    scale: Float[torch.Tensor, "batch pos 1"],
    weight: Float[torch.Tensor, " d_model"],
) -> Float[torch.Tensor, "n batch pos d_model"]:
    """LayerNorm's linear part at the run's own scale: centre, divide by the scale, times ``w``.

    The scale is the masked run's, so it depends on the edge weights; its gradient flows (as it
    does through the model's own LayerNorms), so a masked forward's gradient is the derivative
    of that forward; a detached scale would mix a frozen-scale derivative into the true one
    (tests/unit/test_circuit_prune.py compares the gradient with finite differences;
    docs/circuits.md says how far off a detached scale is)."""
    return (delta - delta.mean(-1, keepdim=True)) * (weight / scale)
