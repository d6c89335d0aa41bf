"""One pruning step: the gates sampled, the masked forward, the Lagrangian loss, its backward.

:func:`pruning_step` for a run alone, :func:`group_pruning_step` for runs trained together
(one forward / backward pass per micro-batch for all of them).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
from jaxtyping import Float

from mi_core.devices import move, to_device
from mi_core.errors import (
    ConfigError,
)
from mi_core.evaluation import model_inputs
from mi_core.interventions import ComponentMask
from mi_core.interventions.components import model_dims
from mi_core.interventions.neurons import NeuronGates
from mi_core.pruning.hard_concrete import (
    HardConcrete,
    hard_concrete_from_uniform,
    hard_concrete_prob_nonzero,
)
from mi_core.pruning.lagrangian import (
    LagrangianController,
    check_sparsity_weights,
    component_weights,
    expected_sparsity,
    lagrangian_penalty,
    sampled_sparsity,
)
from mi_core.pruning.mask_kinds import COMPONENTS, MaskKind
from mi_core.pruning.objective import with_penalty
from mi_core.pruning.objectives import OBJECTIVES, Objective, Targets
from mi_core.pruning.profiles import PruneConfig

if TYPE_CHECKING:
    from mi_core.models.types import HookedModel

logger = logging.getLogger(__name__)


def sparsity_weights(
    model: HookedModel, weighting: str, kind: MaskKind = COMPONENTS
) -> torch.Tensor | None:
    """Each gate's weight in the sparsity (None: every gate counts once)."""
    if weighting == "components":
        return None
    if kind is not COMPONENTS:
        raise ConfigError(
            f"sparsity weighting {weighting!r} weighs heads and MLPs by size; {kind.name} "
            "masks count every unit once (sparsity_weighting 'components')"
        )
    cfg = model_dims(model)
    return component_weights(
        cfg.n_layers, cfg.n_heads, "params", d_model=cfg.d_model, d_head=cfg.d_head, d_mlp=cfg.d_mlp
    )


@dataclass
class StepMember:
    """One run's part of a (batched) pruning step: its gates, lambdas, target and noise."""

    gates: HardConcrete
    controller: LagrangianController
    target_sparsity: float
    """This step's target (ramped: :func:`~mi_core.pruning.schedule.target_sparsity_at`)."""
    noise: torch.Generator | None = None
    sparsity_estimate: str = "sampled"
    step: int = 0
    """The step's number (a kind with a second schedule of its own reads it: edges' nodes)."""


def length_chunks(
    lengths: Sequence[int] | torch.Tensor, max_chunk: int | None
) -> list[torch.Tensor]:
    """Example indices cut into forward passes of at most ``max_chunk`` examples of similar
    length (longest first); one chunk of everything when ``max_chunk`` is None."""
    lengths = torch.as_tensor(lengths)
    order = torch.argsort(lengths, descending=True, stable=True)
    if max_chunk is None or max_chunk >= len(order):
        return [order]
    return list(order.split(max_chunk))


def _backward(loss: torch.Tensor, scaler: torch.amp.GradScaler | None) -> None:
    (loss if scaler is None else scaler.scale(loss)).backward()


def default_chunk(model: HookedModel, cfg: PruneConfig) -> int | None:
    """Examples per forward pass of a batched group: the runs' micro-batch size on a CPU
    (compute-bound: padding costs what it pads; measured: benchmarks/README.md,
    ``bench_group_chunk.py``), and one pass on a GPU (where a wide batch is what the sharing
    buys)."""
    device = next(model.parameters()).device
    return None if device.type == "cuda" else cfg.batch_size


def group_pruning_step(
    model: HookedModel,
    mask: ComponentMask | NeuronGates,
    members: Sequence[StepMember],
    batches: Sequence[Mapping[str, torch.Tensor]],
    sizes: Sequence[Sequence[int]],
    reference: Targets | torch.Tensor | None,
    weights: torch.Tensor | None = None,
    max_chunk: int | None = None,
    precision: str = "fp32",
    scalers: Sequence[torch.amp.GradScaler | None] | torch.amp.GradScaler | None = None,
    *,
    objective: Objective = OBJECTIVES["answer_kl"],
    kind: MaskKind = COMPONENTS,
) -> list[dict[str, float]]:
    """One step of several pruning runs, the runs sharing each forward / backward pass.

    ``batches[m]`` holds micro-batch ``m`` of every run, concatenated along the batch axis:
    ``sizes[m][k]`` examples of run ``k`` in turn. Each run draws its gates from its own noise
    and the mask holds one row per example (as :meth:`ComponentMask.stack`), so every example
    runs under its own run's sample (``kind`` puts a sample into ``mask``: heads and MLPs, or
    neurons, :mod:`~mi_core.pruning.mask_kinds`). The examples are regrouped by length into
    forward passes of at most ``max_chunk`` (:func:`length_chunks`; default: one pass), so a
    run's short examples are not padded to another run's long ones. Run ``k``'s loss is the mean
    of ``objective`` over its examples (:mod:`~mi_core.pruning.objectives`; against
    ``reference``, the targets of every training example, or the full model's cached logits
    alone) plus its Lagrangian term; the losses are summed before one backward pass per
    micro-batch: examples do not interact inside the frozen model, so each run gets the gradient
    it would get alone. Gradients are accumulated (mean over micro-batches); no optimizer step
    here. The forward passes run under ``precision`` autocast, the losses in float32; with fp16,
    ``scalers[k]`` scales run ``k``'s loss before the shared backward pass (the runs' gates are
    disjoint, so each run's gradients carry its own scale, which its optimizer step unscales).
    Returns each run's ``log.csv`` values for the step (see :func:`pruning_step`), the
    objective's under ``objective``.
    """
    if isinstance(scalers, torch.amp.GradScaler):  # one run's scaler, given alone
        if len(members) != 1:
            raise ConfigError("give each run of a group its own loss scaler (a list, one per run)")
        scalers = [scalers]
    scalers = list(scalers) if scalers is not None else [None] * len(members)
    if len(scalers) != len(members):
        raise ConfigError(f"{len(scalers)} loss scalers for {len(members)} runs")
    targets = reference if isinstance(reference, Targets) else Targets(reference)
    if len(members) == 1:
        return [
            _single_step(
                model, mask, members[0], batches, targets, objective, weights, precision,
                scalers[0], kind,
            )
        ]  # fmt: skip
    # the stacked arithmetic below takes these from the first run: every run must share them
    for name, value in (("hard-concrete beta", lambda m: m.gates.beta),
                        ("sparsity estimate", lambda m: m.sparsity_estimate)):  # fmt: skip
        values = sorted({str(value(m)) for m in members})
        if len(values) > 1:
            raise ConfigError(f"the runs of a group need one {name}; got {', '.join(values)}")
    device = next(model.parameters()).device
    n_runs = len(members)
    # the runs' gates and lambdas side by side, so the per-run arithmetic is a few kernels for
    # the whole group (on a GPU a group step is bound by the host, where per-run launches
    # would dominate it: benchmarks/README.md, GPU results)
    log_alpha = torch.stack([m.gates.log_alpha for m in members])
    beta = members[0].gates.beta
    lambda_1 = torch.stack([m.controller.lambda_1 for m in members])
    lambda_2 = torch.stack([m.controller.lambda_2 for m in members])
    target = move(torch.tensor([m.target_sparsity for m in members]), device)
    estimate = members[0].sparsity_estimate
    if weights is not None:
        check_sparsity_weights(weights, log_alpha[0])
        weights = weights.to(log_alpha)
    keys = ("loss", "objective", "penalty", "sampled_sparsity")
    sums = torch.zeros(n_runs, len(keys), device=device)  # read once at the end: no syncs
    t_expected = log_alpha.new_zeros(n_runs)
    for batch, split in zip(batches, sizes, strict=True):
        if len(split) != n_runs:
            raise ConfigError(f"{len(split)} sizes for {n_runs} runs in a pruning step")
        # each run's noise from its own generator (as alone), on the generator's device
        u = torch.stack(
            [
                torch.rand(
                    m.gates.log_alpha.shape, generator=m.noise, device=_noise_device(m, device)
                )
                for m in members
            ]
        )
        counts = torch.tensor(split)
        # np.repeat on the host: torch.repeat_interleave is a visible share of a GPU group step
        owner = torch.from_numpy(np.repeat(np.arange(n_runs), split))
        lengths = batch["attention_mask"].sum(dim=1)
        chunks = length_chunks(lengths, max_chunk)
        # the small per-step tensors too go through pinned memory: a pageable copy to a GPU
        # waits for the device, and the host would stop queueing work
        moved = to_device(
            {"u": u, "counts": counts, "owner": owner, "index": batch["index"]}
            | {f"chunk{i}": chunk for i, chunk in enumerate(chunks)},
            device,
        )
        counts, owner, index = moved["counts"], moved["owner"], moved["index"]
        zs = hard_concrete_from_uniform(log_alpha, moved["u"], beta)
        rows = zs[owner]
        inputs = to_device(model_inputs(model, batch), device)
        sums_of_values = rows.new_zeros(n_runs)
        for i, chunk in enumerate(chunks):
            width = int(lengths[chunk].max())
            chunk_d = moved[f"chunk{i}"]
            kind.assign(mask, rows[chunk_d])
            chunk_inputs = {k: v[chunk_d, :width] for k, v in inputs.items()}
            value = objective.per_example(
                model, mask, chunk_inputs, targets, index[chunk_d], precision
            )
            sums_of_values = sums_of_values.index_add(0, owner[chunk_d], value)
        values = sums_of_values / counts
        t_sampled = _row_sparsity(zs, weights)
        t_expected = _row_sparsity(hard_concrete_prob_nonzero(log_alpha, beta), weights)
        t = t_sampled if estimate == "sampled" else t_expected
        penalty = lagrangian_penalty(lambda_1, lambda_2, t, target)  # one entry per run
        losses = values + penalty
        if all(scaler is None for scaler in scalers):
            total = losses.sum()
        else:  # fp16: each run's loss carries its own scale
            total = sum(
                loss if scaler is None else scaler.scale(loss)
                for loss, scaler in zip(losses, scalers, strict=True)
            )
        sums += torch.stack([losses, values, penalty, t_sampled], dim=1).detach() / len(batches)
        (total / len(batches)).backward()
    ends = torch.stack([t_expected, lambda_1, lambda_2], dim=1).detach()
    values = torch.cat([sums, ends], dim=1).tolist()  # the step's one read from the device
    n = len(keys)
    return [
        {
            **dict(zip(keys, row[:n], strict=True)),
            "expected_sparsity": row[n],
            "target_sparsity": member.target_sparsity,
            "lambda_1": row[n + 1],
            "lambda_2": row[n + 2],
        }
        for row, member in zip(values, members, strict=True)
    ]


def _noise_device(member: StepMember, device: torch.device) -> torch.device:
    return member.noise.device if member.noise is not None else device


def _row_sparsity(
    gates: Float[torch.Tensor, "runs components"],
    weights: Float[torch.Tensor, " components"] | None,
) -> Float[torch.Tensor, " runs"]:
    """:func:`sampled_sparsity` / :func:`expected_sparsity` of each row (one run per row)."""
    if weights is None:
        return 1.0 - gates.mean(dim=-1)
    return 1.0 - (gates * weights).sum(dim=-1) / weights.sum()


def _single_step(
    model: HookedModel,
    mask: ComponentMask | NeuronGates,
    member: StepMember,
    batches: Sequence[Mapping[str, torch.Tensor]],
    targets: Targets,
    objective: Objective,
    weights: torch.Tensor | None,
    precision: str = "fp32",
    scaler: torch.amp.GradScaler | None = None,
    kind: MaskKind = COMPONENTS,
) -> dict[str, float]:
    """One run's step: one forward per micro-batch, the mask one sample for all examples."""
    device = next(model.parameters()).device
    parts = []
    for batch in batches:
        z = member.gates.sample(member.noise)
        kind.assign(mask, z)
        t_sampled = sampled_sparsity(z, weights)
        t_expected = expected_sparsity(member.gates.prob_nonzero(), weights)
        t = t_sampled if member.sparsity_estimate == "sampled" else t_expected
        inputs = to_device({**model_inputs(model, batch), "index": batch["index"]}, device)
        index = inputs.pop("index")
        value = objective.per_example(model, mask, inputs, targets, index, precision).mean()
        loss = with_penalty(value, member.controller, t, member.target_sparsity)
        _backward(loss.total / len(batches), scaler)
        parts.append(torch.stack([loss.total, loss.kl, loss.penalty, t_sampled]).detach())
    ends = torch.stack([t_expected, member.controller.lambda_1, member.controller.lambda_2])
    # the step's one read from the device (each .item() would wait for the GPU)
    total, value, penalty, sampled, expected, lambda_1, lambda_2 = torch.cat(
        [torch.stack(parts).mean(dim=0), ends.detach()]
    ).tolist()
    return {
        "loss": total,
        "objective": value,
        "penalty": penalty,
        "expected_sparsity": expected,
        "sampled_sparsity": sampled,
        "target_sparsity": member.target_sparsity,
        "lambda_1": lambda_1,
        "lambda_2": lambda_2,
    }


def pruning_step(
    model: HookedModel,
    mask: ComponentMask | NeuronGates,
    gates: HardConcrete,
    controller: LagrangianController,
    batches: Sequence[Mapping[str, torch.Tensor]],
    reference: Targets | torch.Tensor | None,
    target_sparsity: float,
    noise: torch.Generator | None = None,
    weights: torch.Tensor | None = None,
    sparsity_estimate: str = "sampled",
    *,
    objective: Objective = OBJECTIVES["answer_kl"],
    kind: MaskKind = COMPONENTS,
) -> dict[str, float]:
    """Accumulate the gradient of one step's loss over ``batches`` into the gates and lambdas.

    ``model`` runs inside ``ablate(model, mask, ..., skip_unmasked=False)``: each micro-batch
    draws fresh gates from ``noise`` and puts them in ``mask``; ``objective`` compares each
    example with row ``batch["index"]`` of ``reference`` (the cached full-model logits, or the
    objective's :class:`~mi_core.pruning.objectives.Targets`). The Lagrangian term
    measures the sparsity of that micro-batch's sample (``sparsity_estimate="sampled"``, the
    authors) or the expected L0 (``"expected"``, CoFi). No optimizer step here. Returns the
    step's mean loss, KL, penalty and sampled sparsity, the expected sparsity and the lambdas.
    (:func:`group_pruning_step` with one run.)
    """
    member = StepMember(gates, controller, target_sparsity, noise, sparsity_estimate)
    sizes = [[len(b["index"])] for b in batches]
    return group_pruning_step(
        model, mask, [member], batches, sizes, reference, weights, objective=objective, kind=kind
    )[0]
