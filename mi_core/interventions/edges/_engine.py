"""Internal: the masked forward an :class:`~mi_core.interventions.edges.mask.EdgeMask` runs.

Not part of mi_core's public API. :func:`masked_hooks` is what ``EdgeMask.hooks`` returns;
``circuits/`` calls it directly where it knows more than a mask says: edge pruning passes
``hard_concrete=True`` (its weights are clamped samples, whose exact 0s and 1s need no
gradient) and a :class:`CorruptedRun` recorded with :func:`record_corrupted` (the heads kept as
``hook_z``). The values equal :mod:`~mi_core.interventions.edges.reference`'s plain forward
(tested on every family); the kernels it is built from are in
:mod:`~mi_core.interventions.edges._kernels`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch
from jaxtyping import Float

from mi_core.buffers import scratch
from mi_core.errors import InterventionError
from mi_core.interventions.edges._kernels import (
    _Correction,
    _GroupPart,
    _GroupProduct,
    _HeadInputs,
    _HeadsInto,
    _LayerGroup,
    _layers_per_group,
    _SideBySide,
    _Tap,
    through_layer_norm,
)
from mi_core.interventions.edges.graph import Graph, NodeOutputs, reads_unnormed_stream
from mi_core.interventions.edges.recording import (
    _record_senders,
    head_results,
    sender_zero_outputs,
)
from mi_core.models.hooks import act_name

if TYPE_CHECKING:
    from mi_core.models.types import HookedModel

__all__ = ["CorruptedRun", "masked_hooks", "record_corrupted"]


class MaskData(Protocol):
    """What the engine reads of an :class:`~mi_core.interventions.edges.mask.EdgeMask`."""

    graph: Graph
    weights: torch.Tensor
    fill: str
    means: torch.Tensor | None
    corrupted: NodeOutputs | None


@dataclass(frozen=True)
class CorruptedRun:
    """A corrupted run recorded for mi_core's own masked forwards (:func:`record_corrupted`):
    every sender's output, except that the heads' rows of ``outputs`` are left unwritten and
    each layer's ``hook_z`` is kept in ``head_z`` instead, so the masked forward forms each
    head's difference as ``(z - z') W_O``, one product, instead of the head's output and the
    corrupted one, two products and a subtraction. Not a mask's ``corrupted`` outputs (a user
    binds those with :meth:`EdgeMask.patching`)."""

    outputs: NodeOutputs
    head_z: dict[int, torch.Tensor]


def record_corrupted(model: HookedModel, graph: Graph, **inputs: Any) -> CorruptedRun:
    """Record the corrupted run ``model(**inputs)`` as a :class:`CorruptedRun`."""
    head_z: dict[int, torch.Tensor] = {}
    outputs = _record_senders(model, graph, (), inputs, head_z)
    return CorruptedRun(outputs, head_z)


def masked_hooks(
    model: HookedModel,
    mask: MaskData,
    *,
    hard_concrete: bool = False,
    corrupted: CorruptedRun | None = None,
) -> list[tuple[str, Callable]]:
    """Hooks that run ``mask``'s masked forward (the graph's switches must be on).

    ``hard_concrete``: the weights are clamped hard-concrete samples (edge pruning): a weight of
    exactly 0 or 1 gets no gradient (the clamp gives it none anyway), so with gradients the
    masked forward and its backward read only the senders with an edge that is removed or
    undecided. The values and the gradients of ``log_alpha`` are those of the plain forward.
    ``corrupted``: the corrupted-fill mask's run, recorded by :func:`record_corrupted` (instead
    of the mask's own ``corrupted`` outputs)."""
    graph = mask.graph
    graph.check_model(model)
    cfg = model.cfg
    if not (cfg.use_split_qkv_input and (graph.post_ln or cfg.use_hook_mlp_in)):
        raise InterventionError(
            "an edge mask needs per-head query / key / value inputs and the MLP-input hook: "
            "use apply(model, mask), or wrap the run in graph_switches(model)"
        )
    outputs, head_z = mask.corrupted, None
    if corrupted is not None:
        if mask.fill != "corrupted":
            raise InterventionError(
                f"a recorded corrupted run fills a corrupted-fill edge mask, not a {mask.fill} one"
            )
        outputs, head_z = corrupted.outputs, corrupted.head_z
    if mask.fill == "corrupted" and outputs is None:
        raise InterventionError(
            "a corrupted-fill edge mask needs the corrupted run: "
            "mask.patching(model, corrupted_input) binds it"
        )
    removed = graph.to_dense(1.0 - mask.weights.float(), fill=0.0)
    constant = mask.means if mask.fill == "mean" else sender_zero_outputs(model, graph)
    fill = _fill_values(mask.fill, constant, outputs)
    return _EdgeRun(model, graph, removed, fill, hard_concrete, head_z).hooks()


def _fill_values(
    fill: str, constant: torch.Tensor | None, outputs: NodeOutputs | None
) -> Callable[[slice, torch.Tensor], torch.Tensor | None]:
    """The fill of senders ``senders``, broadcastable to ``like`` ``[n, batch, pos, d]``;
    ``constant``: the senders' means (``mean``) or their zero outputs (``zero``, ``None`` where
    every sender's is zero: :func:`~mi_core.interventions.edges.recording.sender_zero_outputs`)."""

    def value(senders: slice, like: torch.Tensor) -> torch.Tensor | None:
        if fill in ("zero", "mean"):
            assert constant is not None or fill == "zero"
            return None if constant is None else constant[senders, None, None, :].to(like)
        assert outputs is not None
        found = outputs[senders]
        if found.shape[1:3] != like.shape[1:3]:
            raise InterventionError(
                f"the corrupted run has {found.shape[1]} x {found.shape[2]} (examples x tokens) "
                f"but the clean run {like.shape[1]} x {like.shape[2]}; pad both to one shape"
            )
        return found.to(like)

    return value


# --------------------------------------------------------------------- the masked forward
#: What reading one sender row by a gather costs, in rows read in place: a point with
#: gradients reads the whole block of senders side by side once it needs a sixth of them
#: (measured: benchmarks/README.md, ``bench_circuits.py --parts step``).
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
        model: HookedModel,
        graph: Graph,
        removed: Float[torch.Tensor, "sender receiver"],
        fill: Callable[[slice, torch.Tensor], torch.Tensor | None],
        sparse: bool = False,
        head_z: dict[int, torch.Tensor] | None = None,
    ) -> None:
        self.model, self.graph, self.fill = model, graph, fill
        self.head_z = head_z  # the fill's heads as z per layer (CorruptedRun)
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

    def _carry_through_layer_norm(self, scale: torch.Tensor, weight: torch.Tensor) -> None:
        if self.total is not None:
            self.total = through_layer_norm(self.total[None], scale, weight)[0]
        if self.buffer is None:
            self.deltas = [through_layer_norm(d, scale, weight) for d in self.deltas]
        else:
            self.buffer[: self.n] = through_layer_norm(self.buffer[: self.n], scale, weight)

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
            # or more of it (:data:`_GATHER_COST`); a list of blocks would be concatenated:
            # half. Read whole, the removed weights give the correction itself (no total - kept
            # part).
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
        all the group's points, two reads of its senders (one product for four layers'
        receivers costs about two of one layer's: benchmarks/README.md)."""
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
        if self.sparse and (graph.post_ln or reads_unnormed_stream(model)):
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

    def _unsplit_hooks(self, model: HookedModel, graph: Graph) -> list[tuple[str, Callable]]:
        """Encoders and OLMo-2 / 3 under hard-concrete masks (edge pruning; pre-norm decoders
        never build per-head copies, see :meth:`_decoder_head_hooks`): a layer none of whose
        query / key / value inputs has a removed edge runs with one shared input,
        TransformerLens's unsplit path, instead
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
        self, model: HookedModel, graph: Graph, layer: int
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

    def _layer_hooks(
        self, model: HookedModel, graph: Graph, layer: int
    ) -> list[tuple[str, Callable]]:
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
                self._append(first, head_results(model, layer, z))
                return
            # (the fill's shape was checked at the input embedding's row, appended first)
            filled = self.head_z[layer].to(z)
            w_o, side = block.attn.W_O, self.side
            if side is not None and not w_o.requires_grad and side.values.dtype == z.dtype:
                # straight into the side-by-side rows: no fresh [heads, batch, pos, d_model]
                # block per layer to write and then copy (fresh memory is paid for in page
                # faults on a CPU; the profile is in benchmarks/README.md)
                delta = _HeadsInto.apply(z - filled, w_o.to(z), side, first)
                self._append(first, delta, is_delta=True, tapped=True)
                return
            self._append(first, head_results(model, layer, z - filled), is_delta=True)

        def mlp_out(x: torch.Tensor, hook: Any) -> None:
            self._append(graph.mlp_sender(layer), x[None])

        if graph.post_ln or reads_unnormed_stream(model):
            # each head's input is TransformerLens's split input itself (no norm before the
            # projections): the correction is taken off it where it enters
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
                    self._carry_through_layer_norm(scale, ln.w)

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
