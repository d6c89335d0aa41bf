"""One L0 pruning run: learn hard-concrete gates on a frozen classifier, checkpoint, resume, report.

:func:`prune_run` is the library form of ``mi-core prune``; a sweep calls it once per (sparsity,
seed). A run directory holds::

    config.json               what was asked for (the run's identity; a re-run must match it)
    reference_logits.safetensors   the full model's logits per training example (unless shared)
    checkpoint.safetensors    log_alpha, lambdas, AdamW state; JSON metadata: step, noise seed
    log.csv                   per step: loss, kl, expected and target sparsity, lambdas; every
                              eval_every steps the subnetwork's accuracy on the first eval set
    mask.safetensors, mask.json    the binary subnetwork (mask.json lists removed components)
    subnetwork.safetensors    the mask with its fill and means, ready for ``apply`` /
                              ``load_intervention`` (added to runs finished before it existed)
    metrics.json              achieved sparsity; subnetwork and full-model accuracy per eval set

Exact resumption: the hard-concrete noise of step ``k`` comes from a generator seeded with
``(seed, k)`` and the micro-batches of step ``k`` from the data order of ``seed`` and the epoch
(:func:`mi_core.data.length_grouped_batches`: random batches of similar-length examples),
so nothing about the random state has to be saved besides the step. A run killed at any point
and started again with the same arguments continues from its last checkpoint and ends with the
same ``log_alpha`` and mask as an uninterrupted run. A run whose ``metrics.json`` exists is
complete: running it again only reports the result (and evaluates eval sets it lacks).
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float
from tqdm.auto import tqdm

from mi_core.data import PairDataset, load_pairs, pair_batches
from mi_core.data.batches import PairBatches, TokenizedPairs, tokenize_pairs
from mi_core.data.pairs import check_pair_spec
from mi_core.devices import autocast, grad_scaler, matmul_precision, move, to_device
from mi_core.errors import (
    ConfigError,
    DamagedFileError,
    DataError,
    InterventionError,
    MiCoreError,
    OutputError,
    TrainingError,
)
from mi_core.evaluation import evaluate, model_inputs
from mi_core.interventions import ComponentMask, ComponentMeans, Subnetwork, ablate, load_means
from mi_core.interventions.components import model_dims
from mi_core.io import (
    check_replaceable,
    read_json,
    read_safetensors,
    write_csv,
    write_json,
    write_safetensors,
)
from mi_core.models.classifier import StagedClassifier
from mi_core.models.dropout import train_dropout
from mi_core.models.fingerprint import fingerprint_held, weights_fingerprint
from mi_core.models.frozen import frozen
from mi_core.pruning.discretize import (
    AchievedSparsity,
    discretize,
    make_gates,
    unflatten_components,
)
from mi_core.pruning.group_optimizer import GroupAdamW
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
    pruning_optimizer,
    sampled_sparsity,
)
from mi_core.pruning.objective import kl_per_example, pruning_loss
from mi_core.pruning.profiles import PruneConfig, unreachable_target
from mi_core.pruning.reference_logits import (
    compute_reference_logits,
    load_reference_logits,
    reference_logits,
    reference_metadata,
)
from mi_core.pruning.schedule import lr_factor, target_sparsity_at
from mi_core.seeding import derive_seed

logger = logging.getLogger(__name__)

CHECKPOINT_KIND = "mi_core.PruneCheckpoint"
LOG_COLUMNS = (
    "step",
    "loss",
    "kl",
    "penalty",
    "expected_sparsity",
    "target_sparsity",
    "sampled_sparsity",
    "lambda_1",
    "lambda_2",
    "lr_factor",
    "grad_norm",
    "eval_accuracy",
    "eval_sparsity",
)
#: A run "reached" its target when the sparsity it optimised (sampled or expected, averaged over
#: the last tenth of its steps) lies this close to it.
TARGET_TOLERANCE = 0.05
#: Callback after every step: ``callback(step, row)`` with the step's ``log.csv`` row.
StepCallback = Callable[[int, dict[str, float]], None]


@dataclass
class PruneResult:
    """What a finished run produced (also on disk under ``run_dir``, when it has one)."""

    run_dir: Path | None
    mask: ComponentMask
    """The binary subnetwork (1 = kept)."""
    log_alpha: torch.Tensor | None
    """The learnt gate parameters, flat: every head (row-major), then every MLP (None when a
    finished run's checkpoint was deleted)."""
    metrics: dict[str, Any]
    resumed_from: int | None = None
    """The checkpoint step this call started from (None: from scratch or already complete)."""
    already_complete: bool = False
    log: pd.DataFrame = field(default_factory=pd.DataFrame)

    @property
    def achieved_sparsity(self) -> float:
        return float(self.metrics["achieved_sparsity"])

    @property
    def accuracy(self) -> dict[str, float]:
        """The binary subnetwork's accuracy per eval set."""
        return dict(self.metrics["accuracy"])

    @property
    def full_accuracy(self) -> dict[str, float]:
        """The full model's accuracy per eval set."""
        return dict(self.metrics["full_accuracy"])


def final_sparsity(log: pd.DataFrame, estimate: str) -> float | None:
    """The sparsity a run ended at: its ``estimate`` (``"sampled"`` or ``"expected"``) averaged
    over the last tenth of the steps (sampled sparsity is noisy step to step)."""
    if not len(log):
        return None
    tail = log[f"{estimate}_sparsity"].iloc[-max(1, len(log) // 10) :]
    return float(tail.mean())


def is_complete(run_dir: str | os.PathLike[str]) -> bool:
    """True when ``run_dir`` holds a finished run: its ``metrics.json`` and the ``config.json``
    that says what was asked for (a folder without it holds nothing a run can be matched to;
    :func:`prune_run` refuses it)."""
    return (Path(run_dir) / "metrics.json").is_file() and (Path(run_dir) / "config.json").is_file()


# ------------------------------------------------------------------------------------ inputs
def check_named_inputs(train: Any, eval_sets: Sequence[Any], means: Any) -> None:
    """The data specs and means file a job names exist, checked before the model loads (a
    typo'd spec had failed after it)."""
    for spec in (train, *eval_sets):
        if isinstance(spec, (str, os.PathLike)):
            check_pair_spec(spec)
    if isinstance(means, (str, os.PathLike)) and not Path(means).is_file():
        raise InterventionError(f"means file {means} does not exist; make one with mi-core means")


def _load_model(model: Any, task: str | None, device: str = "auto") -> tuple[Any, str]:
    """A loaded model as given, or the model at a path / spec loaded on ``device``."""
    if isinstance(model, (str, os.PathLike)):
        from mi_core.devices import resolve_device
        from mi_core.models import load_model
        from mi_core.models.loading import loads_as_classifier

        if not loads_as_classifier(model, task):
            raise ConfigError(
                f"{os.fspath(model)} is a causal language model: node pruning runs on "
                "sentence-pair classifiers (name a --task to give a GPT-2 body a classifier "
                "head); for a language model's circuits use mi-core circuit"
            )
        return load_model(model, task=task, device=str(resolve_device(device))), os.fspath(model)
    if not isinstance(model, StagedClassifier) or getattr(model, "tokenizer", None) is None:
        raise ConfigError("model must be a hooked classifier or a checkpoint path / model name")
    return model, str(getattr(model, "model_name", "") or "model")


def _load_data(data: Any, task: str | None, max_examples: int | None, role: str) -> PairDataset:
    if isinstance(data, PairDataset):
        dataset = data.spread(max_examples) if max_examples is not None else data
    else:
        dataset = load_pairs(os.fspath(data), max_examples=max_examples, task=task)
    if task is not None and dataset.task != task:
        raise DataError(
            f"{role} set {dataset.name} is {dataset.task} data, but the model is a {task} "
            "classifier; use data of the model's task"
        )
    if len(dataset) == 0:
        raise DataError(f"{role} set {dataset.name} is empty")
    return dataset


def _load_means(means: Any, model: Any, ablation: str) -> ComponentMeans | None:
    if means is None:
        if ablation == "mean":
            raise ConfigError(
                "mean ablation needs --means (make them with mi-core means) or use --ablation zero"
            )
        return None
    if isinstance(means, ComponentMeans):
        means.check_model(model)
        return means
    return load_means(means, model)


def _load_inputs(
    model: Any,
    task: str | None,
    means: Any,
    ablation: str,
    train: Any,
    max_train_examples: int | None,
    eval_sets: Sequence[Any],
    max_eval_examples: int | None,
) -> tuple[str | None, ComponentMeans | None, PairDataset, list[PairDataset], list[str]]:
    """A job's task, means, training set and eval sets (whose names must differ), for a loaded
    ``model``: inside the job's :func:`fingerprint_held`, as means files check the weights."""
    task = getattr(model, "task", None) or task
    means_obj = _load_means(means, model, ablation)
    train_set = _load_data(train, task, max_train_examples, "training")
    evals = [_load_data(d, task, max_eval_examples, "eval") for d in eval_sets]
    names = [d.name for d in evals]
    if len(set(names)) != len(names):
        raise ConfigError(f"eval sets must differ; got {names}")
    return task, means_obj, train_set, evals, names


def _means_identity(means: ComponentMeans | None) -> dict[str, Any] | None:
    if means is None:
        return None
    return {
        "model_fingerprint": means.fingerprint,
        "dataset": means.dataset,
        "n_tokens": means.n_tokens,
    }


# ------------------------------------------------------------------------------- checkpoints
def save_checkpoint(
    path: Path,
    step: int,
    seed: int,
    gates: HardConcrete,
    controller: LagrangianController,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler | None = None,
    log: list[dict[str, Any]] | None = None,
) -> None:
    """Write gates, lambdas, AdamW state (tensors), step, groups, the fp16 loss scaler's state
    and the log rows of the steps done (JSON), atomically: ``log.csv`` is written beside it, and
    a kill between the two writes cannot lose rows, which resume from here."""
    state = optimizer.state_dict()
    tensors = {
        "log_alpha": gates.log_alpha,
        "lambda_1": controller.lambda_1,
        "lambda_2": controller.lambda_2,
    }
    for param_id, param_state in state["state"].items():
        for key, value in param_state.items():
            tensors[f"optimizer.{param_id}.{key}"] = torch.as_tensor(value)
    info = {
        "step": step,
        "noise": {"seed": seed, "next_step": step},
        "groups": state["param_groups"],
    }
    if scaler is not None:
        info["scaler"] = scaler.state_dict()
    if log is not None:
        info["log"] = log
    write_safetensors(path, tensors, {"kind": CHECKPOINT_KIND, "state": json.dumps(info)})


def checkpoint_log(path: Path) -> list[dict[str, Any]] | None:
    """The log rows a checkpoint holds (None for one written before they were kept)."""
    _, metadata = read_safetensors(path)
    return json.loads(metadata["state"]).get("log")


#: AdamW's implementation flags, which follow the device a run resumes on.
_OPTIMIZER_IMPLEMENTATION = ("fused", "foreach", "capturable", "differentiable")


def load_checkpoint(
    path: Path,
    gates: HardConcrete,
    controller: LagrangianController,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler | None = None,
) -> int:
    """Restore what :func:`save_checkpoint` wrote; returns the number of steps already done.

    The loss scaler resumes at its saved scale (a checkpoint written without one, or before the
    field existed, leaves ``scaler`` at its initial scale)."""
    tensors, metadata = read_safetensors(path)
    if metadata.get("kind") != CHECKPOINT_KIND:
        raise TrainingError(f"{path} is not a pruning checkpoint; delete it to start over")
    info = json.loads(metadata["state"])
    if tensors["log_alpha"].shape != gates.log_alpha.shape:
        raise TrainingError(
            f"checkpoint {path} has {tensors['log_alpha'].numel()} gates but the model has "
            f"{gates.log_alpha.numel()}; it belongs to another model"
        )
    with torch.no_grad():
        gates.log_alpha.copy_(tensors["log_alpha"])
        controller.lambda_1.copy_(tensors["lambda_1"])
        controller.lambda_2.copy_(tensors["lambda_2"])
    opt_state: dict[int, dict[str, torch.Tensor]] = {}
    for name, value in tensors.items():
        if name.startswith("optimizer."):
            _, param_id, key = name.split(".", 2)
            opt_state.setdefault(int(param_id), {})[key] = value
    # how AdamW computes (fused on a GPU, foreach, ...) is this machine's choice, not the file's
    groups = [
        {**saved, **{k: current[k] for k in _OPTIMIZER_IMPLEMENTATION if k in current}}
        for saved, current in zip(info["groups"], optimizer.param_groups, strict=True)
    ]
    optimizer.load_state_dict({"state": opt_state, "param_groups": groups})
    if scaler is not None and info.get("scaler"):
        scaler.load_state_dict(info["scaler"])
    return int(info["step"])


# ---------------------------------------------------------------------------------- training


class _Schedule:
    """Which examples micro-batch ``k`` holds: a function of the seed and ``k`` only."""

    def __init__(self, tokenized: TokenizedPairs, batch_size: int, seed: int) -> None:
        self.batches = PairBatches(
            tokenized, batch_size, shuffle=True, seed=seed, drop_last=True, sort_by_length=True
        )
        self._epoch = -1
        self._order: list[list[int]] = []

    def indices(self, k: int) -> list[int]:
        if not self._order:
            self._epoch, self._order = 0, self._batches(0)
        epoch, position = divmod(k, len(self._order))
        if epoch != self._epoch:
            self._epoch, self._order = epoch, self._batches(epoch)
        return self._order[position]

    def _batches(self, epoch: int) -> list[list[int]]:
        return self.batches.batch_indices(epoch)


def _sparsity_weights(model: Any, weighting: str) -> torch.Tensor | None:
    if weighting == "components":
        return None
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


def default_chunk(model: Any, cfg: PruneConfig) -> int | None:
    """Examples per forward pass of a batched group: the runs' micro-batch size on a CPU
    (compute-bound: padding costs what it pads; measured on MiniLM, 8 runs of 16, 2 cores:
    chunks of 16 took 2.25 s a step, one padded pass 4.17 s, the runs one by one 2.35 s), and
    one pass on a GPU (where a wide batch is what the sharing buys)."""
    device = next(model.parameters()).device
    return None if device.type == "cuda" else cfg.batch_size


def group_pruning_step(
    model: Any,
    mask: ComponentMask,
    members: Sequence[StepMember],
    batches: Sequence[Mapping[str, torch.Tensor]],
    sizes: Sequence[Sequence[int]],
    reference: torch.Tensor,
    weights: torch.Tensor | None = None,
    max_chunk: int | None = None,
    precision: str = "fp32",
    scalers: Sequence[torch.amp.GradScaler | None] | torch.amp.GradScaler | None = None,
) -> list[dict[str, float]]:
    """One step of several pruning runs, the runs sharing each forward / backward pass.

    ``batches[m]`` holds micro-batch ``m`` of every run, concatenated along the batch axis:
    ``sizes[m][k]`` examples of run ``k`` in turn. Each run draws its gates from its own noise
    and the mask holds one row per example (as :meth:`ComponentMask.stack`), so every example
    runs under its own run's sample. The examples are regrouped by length into forward passes of
    at most ``max_chunk`` (:func:`length_chunks`; default: one pass), so a run's short examples
    are not padded to another run's long ones. Run ``k``'s loss is the mean KL of its examples
    plus its Lagrangian term; the losses are summed before one backward pass per micro-batch:
    examples do not interact inside the frozen model, so each run gets the gradient it would get
    alone. Gradients are accumulated (mean over micro-batches); no optimizer step here. The
    forward passes run under ``precision`` autocast, the losses in float32; with fp16,
    ``scalers[k]`` scales run ``k``'s loss before the shared backward pass (the runs' gates are
    disjoint, so each run's gradients carry its own scale, which its optimizer step unscales).
    Returns each run's ``log.csv`` values for the step (see :func:`pruning_step`).
    """
    if isinstance(scalers, torch.amp.GradScaler):  # one run's scaler, given alone
        if len(members) != 1:
            raise ConfigError("give each run of a group its own loss scaler (a list, one per run)")
        scalers = [scalers]
    scalers = list(scalers) if scalers is not None else [None] * len(members)
    if len(scalers) != len(members):
        raise ConfigError(f"{len(scalers)} loss scalers for {len(members)} runs")
    if len(members) == 1:
        return [
            _single_step(
                model, mask, members[0], batches, reference, weights, precision, scalers[0]
            )
        ]
    # the stacked arithmetic below takes these from the first run: every run must share them
    for name, value in (("hard-concrete beta", lambda m: m.gates.beta),
                        ("sparsity estimate", lambda m: m.sparsity_estimate)):  # fmt: skip
        values = sorted({str(value(m)) for m in members})
        if len(values) > 1:
            raise ConfigError(f"the runs of a group need one {name}; got {', '.join(values)}")
    device = reference.device
    n_layers, n_heads = mask.n_layers, mask.n_heads
    n_runs = len(members)
    # the runs' gates and lambdas side by side, so the per-run arithmetic is a few kernels for
    # the whole group (on a GPU the per-run launches, not the shared pass, dominated a step)
    log_alpha = torch.stack([m.gates.log_alpha for m in members])
    beta = members[0].gates.beta
    lambda_1 = torch.stack([m.controller.lambda_1 for m in members])
    lambda_2 = torch.stack([m.controller.lambda_2 for m in members])
    target = move(torch.tensor([m.target_sparsity for m in members]), device)
    estimate = members[0].sparsity_estimate
    if weights is not None:
        check_sparsity_weights(weights, log_alpha[0])
        weights = weights.to(log_alpha)
    keys = ("loss", "kl", "penalty", "sampled_sparsity")
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
        owner = torch.from_numpy(np.repeat(np.arange(n_runs), split))  # (torch's: 0.5 ms)
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
        kl_sums = rows.new_zeros(n_runs)
        for i, chunk in enumerate(chunks):
            width = int(lengths[chunk].max())
            chunk_d = moved[f"chunk{i}"]
            mask.heads, mask.mlps = unflatten_components(rows[chunk_d], n_layers, n_heads)
            with autocast(device, precision):
                logits = model(**{k: v[chunk_d, :width] for k, v in inputs.items()})
            kl = kl_per_example(reference[index[chunk_d]], logits.float())
            kl_sums = kl_sums.index_add(0, owner[chunk_d], kl)
        kls = kl_sums / counts
        t_sampled = _row_sparsity(zs, weights)
        t_expected = _row_sparsity(hard_concrete_prob_nonzero(log_alpha, beta), weights)
        t = t_sampled if estimate == "sampled" else t_expected
        penalty = lagrangian_penalty(lambda_1, lambda_2, t, target)  # one entry per run
        losses = kls + penalty
        if all(scaler is None for scaler in scalers):
            total = losses.sum()
        else:  # fp16: each run's loss carries its own scale
            total = sum(
                loss if scaler is None else scaler.scale(loss)
                for loss, scaler in zip(losses, scalers, strict=True)
            )
        sums += torch.stack([losses, kls, penalty, t_sampled], dim=1).detach() / len(batches)
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
    model: Any,
    mask: ComponentMask,
    member: StepMember,
    batches: Sequence[Mapping[str, torch.Tensor]],
    reference: torch.Tensor,
    weights: torch.Tensor | None,
    precision: str = "fp32",
    scaler: torch.amp.GradScaler | None = None,
) -> dict[str, float]:
    """One run's step: one forward per micro-batch, the mask one sample for all examples."""
    device = reference.device
    n_layers, n_heads = mask.n_layers, mask.n_heads
    parts = []
    for batch in batches:
        z = member.gates.sample(member.noise)
        mask.heads, mask.mlps = unflatten_components(z, n_layers, n_heads)
        t_sampled = sampled_sparsity(z, weights)
        t_expected = expected_sparsity(member.gates.prob_nonzero(), weights)
        t = t_sampled if member.sparsity_estimate == "sampled" else t_expected
        inputs = to_device({**model_inputs(model, batch), "index": batch["index"]}, device)
        index = inputs.pop("index")
        with autocast(device, precision):
            logits = model(**inputs)
        loss = pruning_loss(
            reference[index],
            logits if precision == "fp32" else logits.float(),
            member.controller,
            t,
            member.target_sparsity,
        )
        _backward(loss.total / len(batches), scaler)
        parts.append(torch.stack([loss.total, loss.kl, loss.penalty, t_sampled]).detach())
    ends = torch.stack([t_expected, member.controller.lambda_1, member.controller.lambda_2])
    # the step's one read from the device (each .item() would wait for the GPU)
    total, kl, penalty, sampled, expected, lambda_1, lambda_2 = torch.cat(
        [torch.stack(parts).mean(dim=0), ends.detach()]
    ).tolist()
    return {
        "loss": total,
        "kl": kl,
        "penalty": penalty,
        "expected_sparsity": expected,
        "sampled_sparsity": sampled,
        "target_sparsity": member.target_sparsity,
        "lambda_1": lambda_1,
        "lambda_2": lambda_2,
    }


def pruning_step(
    model: Any,
    mask: ComponentMask,
    gates: HardConcrete,
    controller: LagrangianController,
    batches: Sequence[Mapping[str, torch.Tensor]],
    reference: torch.Tensor,
    target_sparsity: float,
    noise: torch.Generator | None = None,
    weights: torch.Tensor | None = None,
    sparsity_estimate: str = "sampled",
) -> dict[str, float]:
    """Accumulate the gradient of one step's loss over ``batches`` into the gates and lambdas.

    ``model`` runs inside ``ablate(model, mask, ..., skip_unmasked=False)``: each micro-batch
    draws fresh gates from ``noise`` and puts them in ``mask``; the KL target of each example is
    row ``batch["index"]`` of ``reference`` (the cached full-model logits). The Lagrangian term
    measures the sparsity of that micro-batch's sample (``sparsity_estimate="sampled"``, the
    authors) or the expected L0 (``"expected"``, CoFi). No optimizer step here. Returns the
    step's mean loss, KL, penalty and sampled sparsity, the expected sparsity and the lambdas.
    (:func:`group_pruning_step` with one run.)
    """
    member = StepMember(gates, controller, target_sparsity, noise, sparsity_estimate)
    sizes = [[len(b["index"])] for b in batches]
    return group_pruning_step(model, mask, [member], batches, sizes, reference, weights)[0]


@dataclass
class _RunState:
    """One run's training state: gates, lambdas, optimizer, data order, log and files."""

    cfg: PruneConfig
    run_dir: Path | None
    gates: HardConcrete
    controller: LagrangianController
    optimizer: torch.optim.Optimizer
    base_lrs: list[float]
    schedule: _Schedule
    start: int
    rows: list[dict[str, float]]
    last_good: int | None
    callback: StepCallback | None = None
    error: TrainingError | None = None
    scaler: torch.amp.GradScaler | None = None
    """This run's fp16 loss scaler (None in fp32 / bf16): each run of a group scales its own
    loss, so one run's overflow never skips or shrinks another's step."""

    @property
    def checkpoint(self) -> Path | None:
        return None if self.run_dir is None else self.run_dir / "checkpoint.safetensors"

    @property
    def log_path(self) -> Path | None:
        return None if self.run_dir is None else self.run_dir / "log.csv"

    @property
    def trained(self) -> list[torch.Tensor]:
        return [self.gates.log_alpha, *self.controller.parameters()]

    def log(self) -> pd.DataFrame:
        return pd.DataFrame(self.rows, columns=list(LOG_COLUMNS))


def _start_run(
    model: Any,
    tokenized: TokenizedPairs,
    cfg: PruneConfig,
    run_dir: Path | None,
    callback: StepCallback | None,
) -> _RunState:
    """A run's fresh state, or its state at its last checkpoint in ``run_dir``."""
    dims = model_dims(model)
    device = next(model.parameters()).device
    gates = make_gates(cfg, dims.n_layers, dims.n_heads).to(device)
    controller = LagrangianController().to(device)
    optimizer = pruning_optimizer(
        gates.parameters(),
        controller,
        cfg.lr_log_alpha,
        cfg.lr_lambda,
        cfg.weight_decay,
        cfg.lambda_weight_decay,
    )
    state = _RunState(
        cfg,
        run_dir,
        gates,
        controller,
        optimizer,
        [group["lr"] for group in optimizer.param_groups],
        _Schedule(tokenized, cfg.batch_size, cfg.seed),
        start=0,
        rows=[],
        last_good=None,
        callback=callback,
        scaler=grad_scaler(device, cfg.precision),
    )
    checkpoint = state.checkpoint
    if checkpoint is not None and checkpoint.is_file():
        state.start = load_checkpoint(checkpoint, gates, controller, optimizer, state.scaler)
        kept = checkpoint_log(checkpoint)
        if kept is not None:  # the rows the checkpoint holds: log.csv may lag behind it
            state.rows = [row for row in kept if row["step"] < state.start]
        elif state.log_path.is_file() and state.start > 0:  # a checkpoint from before
            log = pd.read_csv(state.log_path)
            state.rows = log[log["step"] < state.start].to_dict("records")
        state.last_good = state.start
        logger.info("resuming %s from step %d", run_dir, state.start)
    else:
        short = unreachable_target(cfg)
        if short is not None:
            logger.warning("%s: %s", run_dir or "pruning run", short)
    return state


#: PruneConfig fields added after runs were first written, with the value older runs used.
_DEFAULTS_SINCE: dict[str, Any] = {"precision": "fp32"}
#: The files a pruning run writes in its folder.
RUN_FILES = (
    "config.json",
    "checkpoint.safetensors",
    "log.csv",
    "reference_logits.safetensors",
    "mask.safetensors",
    "mask.json",
    "metrics.json",
    "subnetwork.safetensors",
)

#: Settings that change how often a run saves, logs and evaluates, not what it learns: a
#: resumed run may change them.
_NOT_LEARNT = ("checkpoint_every", "eval_every", "eval_batch_size")

#: Configuration fields that may differ between the runs trained together in one group: the
#: target and the seed, and the schedules derived from the target (the paper's step counts and
#: warm-ups grow with the sparsity).
GROUP_VARYING = ("target_sparsity", "seed", "steps", "warmup_steps", "lr_warmup_steps")


def _check_group(configs: Sequence[PruneConfig]) -> None:
    first = configs[0].to_dict()
    for cfg in configs[1:]:
        other = cfg.to_dict()
        differ = sorted(k for k in first if k not in GROUP_VARYING and first[k] != other[k])
        if differ:
            raise ConfigError(
                "runs trained together must differ only in target sparsity, seed and the "
                f"schedules derived from them ({', '.join(GROUP_VARYING)}); "
                f"{', '.join(differ)} differ"
            )


def _train_group(
    model: Any,
    means: ComponentMeans | None,
    tokenized: TokenizedPairs,
    targets: torch.Tensor,
    runs: Sequence[_RunState],
    progress: bool,
    max_chunk: int | None = None,
    evals: Sequence[PairDataset] = (),
) -> None:
    """Train ``runs`` together, each from its own start step to its own last step (see
    :func:`group_pruning_step`); each run's state, log and checkpoints are updated in place.

    Every ``eval_every`` steps each run's subnetwork as it stands (its gates discretised by the
    run's rule at the step's target) is evaluated on the first of ``evals`` (its first
    :data:`PROBE_EXAMPLES`) without dropout, and its accuracy and sparsity go into that step's
    log row (``eval_accuracy``, ``eval_sparsity``), as the authors' trainer evaluates its model
    every 64 steps. With ``precision="tf32"`` the probe's products are TF32 too.

    A run whose loss becomes non-finite gets its ``error`` set and leaves the group (its last
    checkpoint stays); the others go on. With dropout on, the dropout noise of a step is drawn
    for the whole concatenated batch from the first active run's seed: identical to a run alone
    for a group of one, and otherwise a function of the group.
    """
    cfg = runs[0].cfg
    _check_group([r.cfg for r in runs])
    device = next(model.parameters()).device
    rng_devices = [device] if device.type == "cuda" else []
    weights = _sparsity_weights(model, cfg.sparsity_weighting)
    weights = None if weights is None else weights.to(device)
    targets = targets.to(device)
    accumulation = cfg.grad_accumulation
    first = min(r.start for r in runs)
    last = max(r.cfg.steps for r in runs)
    desc = (
        f"prune s={cfg.target_sparsity:g} seed={cfg.seed}"
        if len(runs) == 1
        else f"prune {len(runs)} runs together"
    )
    bar = tqdm(
        range(first, last),
        initial=first,
        total=last,
        desc=desc,
        disable=not progress,
        leave=False,
    )
    mask = ComponentMask.ones(model, device=device)
    # a group's optimizer steps taken together (fp16's per-run loss scalers step run by run)
    stacked = None
    if len(runs) > 1 and all(r.scaler is None for r in runs):
        stacked = GroupAdamW(
            [r.optimizer for r in runs],
            [r.trained for r in runs],
            [r.cfg.max_grad_norm if r.cfg.max_grad_norm > 0 else math.inf for r in runs],
        )
    slot = {id(r): k for k, r in enumerate(runs)}
    probe = None
    if evals and cfg.eval_every > 0:
        probe = _subnetwork_probe(model, mask, evals[0], weights, cfg)
    with (
        frozen(model),
        ablate(model, mask, means, cfg.ablation, skip_unmasked=False),
        matmul_precision(cfg.precision),  # tf32: the steps' forward and backward passes
    ):
        for step in bar:
            active = [r for r in runs if r.start <= step < r.cfg.steps and r.error is None]
            if not active:
                continue
            members, factors = [], []
            for r in active:
                factor = lr_factor(step, r.cfg.lr_warmup_steps, r.cfg.steps, r.cfg.lr_schedule)
                for group, base in zip(r.optimizer.param_groups, r.base_lrs, strict=True):
                    group["lr"] = base * factor
                r.optimizer.zero_grad(set_to_none=True)
                factors.append(factor)
                members.append(
                    StepMember(
                        r.gates,
                        r.controller,
                        target_sparsity_at(step, r.cfg.target_sparsity, r.cfg.warmup_steps),
                        torch.Generator().manual_seed(  # CPU: one stream on every device
                            derive_seed("prune", r.cfg.seed, step)
                        ),
                        r.cfg.sparsity_estimate,
                    )
                )
            batches, sizes = [], []
            for micro in range(accumulation):
                parts = [r.schedule.indices(step * accumulation + micro) for r in active]
                batches.append(tokenized.collate([i for part in parts for i in part]))
                sizes.append([len(part) for part in parts])
            with (
                torch.random.fork_rng(devices=rng_devices, enabled=cfg.dropout),
                train_dropout(model, cfg.dropout),  # not around the probe's evaluations
            ):
                if cfg.dropout:
                    torch.manual_seed(derive_seed("prune", "dropout", active[0].cfg.seed, step))
                rows = group_pruning_step(
                    model, mask, members, batches, sizes, targets, weights, max_chunk,
                    cfg.precision, [r.scaler for r in active],
                )  # fmt: skip
            if stacked is None:
                # clip every run, then read all the norms at once (one device sync per step)
                norms = torch.stack([_clip(r) for r in active]).tolist()
                for r, row, factor, norm in zip(active, rows, factors, norms, strict=True):
                    _finish_step(r, step, row, factor, norm, probe=probe)
            else:  # every run's clipping and AdamW step at once; a failed run takes none
                good = [math.isfinite(row["loss"]) for row in rows]
                taken = [slot[id(r)] for r, ok in zip(active, good, strict=True) if ok]
                norms = iter(stacked.step(taken).tolist() if taken else [])
                for r, row, factor, ok in zip(active, rows, factors, good, strict=True):
                    _finish_step(r, step, row, factor, next(norms) if ok else math.nan,
                                 export=lambda r=r: stacked.export(slot[id(r)]),
                                 probe=probe)  # fmt: skip
            shown = active[0].rows[-1] if active[0].rows else None
            if shown is not None:
                bar.set_postfix(  # both sparsity estimates, named as in log.csv and warnings
                    kl=f"{shown['kl']:.4f}",
                    target=f"{shown['target_sparsity']:.3f}",
                    expected_sparsity=f"{shown['expected_sparsity']:.3f}",
                    sampled_sparsity=f"{shown['sampled_sparsity']:.3f}",
                    **(
                        {"acc": f"{shown['eval_accuracy']:.3f}"} if "eval_accuracy" in shown else {}
                    ),
                )
    bar.close()
    if stacked is not None:  # each run's AdamW holds its state, as after a run alone
        for r in runs:
            stacked.export(slot[id(r)])


def _clip(r: _RunState) -> torch.Tensor:
    """Unscale (fp16) and clip one run's gradients; their total norm before clipping."""
    if r.scaler is not None:
        r.scaler.unscale_(r.optimizer)
    max_norm = r.cfg.max_grad_norm if r.cfg.max_grad_norm > 0 else math.inf
    return torch.nn.utils.clip_grad_norm_(r.trained, max_norm).float()


def _finish_step(
    r: _RunState,
    step: int,
    row: dict[str, float],
    factor: float,
    norm: float,
    export: Callable[[], None] | None = None,
    probe: Callable[[_RunState, float], dict[str, float]] | None = None,
) -> None:
    """Check, take the optimizer step, log and checkpoint one run after a step (clipped by
    :func:`_clip`, whose ``norm`` is logged). With ``export``, the step was already taken
    (:class:`GroupAdamW`, for the group); ``export`` gives the run's AdamW its state before its
    checkpoint is written. ``probe`` evaluates the run's subnetwork every ``eval_every`` steps
    (see :func:`_subnetwork_probe`)."""
    cfg, scaler = r.cfg, r.scaler
    row.update(lr_factor=factor, grad_norm=norm)
    total = row["loss"]
    if not math.isfinite(total):
        where = (
            f"the last good checkpoint (step {r.last_good}) is kept in {r.checkpoint}"
            if r.last_good is not None
            else "no checkpoint had been written yet"
        )
        r.error = TrainingError(
            f"pruning loss became {'NaN' if math.isnan(total) else total} at step {step}; "
            f"stopped; {where}; lower "
            "--lr-log-alpha / --lr-lambda or check the means and data"
        )
        return
    if export is None and scaler is None:
        r.optimizer.step()
    elif export is None:  # skipped when the scaled gradients overflowed; the scale then shrinks
        scaler.step(r.optimizer)
        scaler.update()
    done = step + 1
    if probe is not None and done % cfg.eval_every == 0:
        row.update(probe(r, row["target_sparsity"]))
    r.rows.append({"step": step, **row})
    if r.checkpoint is not None and (done % cfg.checkpoint_every == 0 or done == cfg.steps):
        if export is not None:
            export()
        save_checkpoint(r.checkpoint, done, cfg.seed, r.gates, r.controller, r.optimizer,
                        r.scaler, log=r.rows)  # fmt: skip
        write_csv(r.log_path, r.log())
        r.last_good = done
    if r.callback is not None:
        r.callback(step, r.rows[-1])


#: Examples of the first eval set a probe evaluates (the authors' trainer: 2,000 MNLI pairs).
PROBE_EXAMPLES = 2000


def _discrete_mask(
    log_alpha: Float[torch.Tensor, " components"],
    dims: Any,
    target: float,
    cfg: PruneConfig,
    weights: Float[torch.Tensor, " components"] | None,
) -> tuple[ComponentMask, AchievedSparsity]:
    """A run's binary subnetwork from its flat gates: ``cfg``'s rule at ``target``."""
    keep, achieved = discretize(
        log_alpha, dims.n_layers, dims.n_heads, target, cfg.discretize, weights, beta=cfg.beta
    )
    heads, mlps = unflatten_components(keep.float(), dims.n_layers, dims.n_heads)
    return ComponentMask(heads, mlps), achieved


def _subnetwork_probe(
    model: Any,
    mask: ComponentMask,
    dataset: PairDataset,
    weights: torch.Tensor | None,
    cfg: PruneConfig,
) -> Callable[[_RunState, float], dict[str, float]]:
    """``probe(run, target)``: the accuracy on ``dataset`` (its first :data:`PROBE_EXAMPLES`) of
    ``run``'s gates discretised now (the run's rule at ``target``) and that mask's achieved
    sparsity, as log columns. The examples are tokenised once, here.

    Meant for inside the training loop's :func:`ablate` block on ``mask``, whose values it
    replaces with the discrete mask's (each step assigns its own again)."""
    dims = model_dims(model)
    device = next(model.parameters()).device
    host_weights = None if weights is None else weights.cpu()
    subset = dataset.head(PROBE_EXAMPLES)
    batches = list(
        pair_batches(
            subset, model.tokenizer, batch_size=cfg.eval_batch_size, max_length=cfg.max_length,
            sort_by_length=True,
        )
    )  # fmt: skip

    def probe(r: _RunState, target: float) -> dict[str, float]:
        gates = r.gates.log_alpha.detach().cpu()
        discrete, achieved = _discrete_mask(gates, dims, target, r.cfg, host_weights)
        mask.heads, mask.mlps = discrete.heads.to(device), discrete.mlps.to(device)
        accuracy = evaluate(model, subset, batches=batches).accuracy
        return {"eval_accuracy": accuracy, "eval_sparsity": achieved.by_count}

    return probe


def _train(
    model: Any,
    means: ComponentMeans | None,
    tokenized: TokenizedPairs,
    targets: torch.Tensor,
    cfg: PruneConfig,
    run_dir: Path | None,
    progress: bool,
    callback: StepCallback | None,
    evals: Sequence[PairDataset] = (),
) -> tuple[torch.Tensor, pd.DataFrame, int | None]:
    state = _start_run(model, tokenized, cfg, run_dir, callback)
    _train_group(model, means, tokenized, targets, [state], progress, evals=evals)
    if state.error is not None:
        raise state.error
    return (
        state.gates.log_alpha.detach().cpu().clone(),
        state.log(),
        state.start if state.start > 0 else None,
    )


# ------------------------------------------------------------------------------- evaluation
def _evaluate_sets(
    model: Any,
    mask: ComponentMask,
    means: ComponentMeans | None,
    cfg: PruneConfig,
    eval_sets: Sequence[PairDataset],
    full_accuracy: Mapping[str, float] | None,
) -> tuple[dict[str, float], dict[str, float], dict[str, int]]:
    accuracy: dict[str, float] = {}
    full: dict[str, float] = {}
    sizes: dict[str, int] = {}
    known = dict(full_accuracy or {})
    for dataset in eval_sets:
        sizes[dataset.name] = len(dataset)
        if dataset.name in known:
            full[dataset.name] = float(known[dataset.name])
        else:
            full[dataset.name] = evaluate(
                model, dataset, batch_size=cfg.eval_batch_size, max_length=cfg.max_length
            ).accuracy
        with ablate(model, mask, means, cfg.ablation):
            accuracy[dataset.name] = evaluate(
                model, dataset, batch_size=cfg.eval_batch_size, max_length=cfg.max_length
            ).accuracy
    return accuracy, full, sizes


# -------------------------------------------------------------------------------------- run
def prune(
    model: Any,
    train: str | os.PathLike[str] | PairDataset,
    means: str | os.PathLike[str] | ComponentMeans | None,
    config: PruneConfig,
    *,
    eval_sets: Sequence[str | PairDataset] = (),
    checkpoint_dir: str | os.PathLike[str] | None = None,
    task: str | None = None,
    max_train_examples: int | None = None,
    max_eval_examples: int | None = None,
    reference_logits_path: str | os.PathLike[str] | None = None,
    reference: torch.Tensor | None = None,
    full_accuracy: Mapping[str, float] | None = None,
    progress: bool = True,
    callback: StepCallback | None = None,
    device: str = "auto",
) -> PruneResult:
    """Prune ``model`` to ``config.target_sparsity`` on ``train``; return the subnetwork.

    In memory by default. With ``checkpoint_dir`` the run also writes its files there
    (``config.json``, ``log.csv``, ``checkpoint.safetensors``, ``mask.*``, ``metrics.json``),
    resumes from the last checkpoint when called again, and a complete run only reports.

    ``model``, ``train``, ``means`` and ``eval_sets`` may be loaded objects or paths / specs (the
    latter is how a Ray worker calls it). ``reference_logits_path`` points at the full model's
    logits on ``train`` shared by several runs (default: ``reference_logits.safetensors`` in
    ``checkpoint_dir``, computed on first use); ``full_accuracy`` gives full-model accuracies
    already known per eval set name, which are then not recomputed; ``reference`` gives the
    reference logits themselves (in memory only, e.g. shared by the runs of a sweep).
    ``callback(step, row)`` runs after every step (an exception raised there stops the run like
    a kill; with a ``checkpoint_dir`` the next call resumes). ``device``: where a model given
    as a path is loaded (``auto``: CUDA when present); a loaded model stays where it is.
    """
    run_dir = None if checkpoint_dir is None else Path(checkpoint_dir)
    check_named_inputs(train, eval_sets, means)
    model, model_spec = _load_model(model, task, device)
    with fingerprint_held(model):  # the weights stay fixed: one fingerprint for every check
        task, means_obj, train_set, evals, names = _load_inputs(
            model, task, means, config.ablation, train, max_train_examples, eval_sets,
            max_eval_examples,
        )  # fmt: skip
        if run_dir is None:
            return _prune_in_memory(
                model,
                means_obj,
                config,
                train_set,
                evals,
                full_accuracy,
                progress,
                callback,
                reference_logits_path,
                reference,
            )

        _claim_run_dir(
            run_dir, config, model, model_spec, task, train_set, means, means_obj, names,
            max_eval_examples, reference_logits_path,
        )  # fmt: skip
        if is_complete(run_dir):
            return _report_complete(model, means_obj, config, run_dir, evals, full_accuracy)

        started = time.perf_counter()
        tokenized = tokenize_pairs(train_set, model.tokenizer, config.max_length)
        targets = _run_targets(model, tokenized, config, run_dir, reference_logits_path, progress)
        log_alpha, log, resumed_from = _train(
            model, means_obj, tokenized, targets, config, run_dir, progress, callback, evals
        )
        result = _finish(
            model,
            means_obj,
            config,
            run_dir,
            log_alpha,
            log,
            evals,
            full_accuracy,
            time.perf_counter() - started,
        )
        result.resumed_from = resumed_from
        return result


def _claim_run_dir(
    run_dir: Path,
    config: PruneConfig,
    model: Any,
    model_spec: str,
    task: str | None,
    train_set: PairDataset,
    means: Any,
    means_obj: ComponentMeans | None,
    names: Sequence[str],
    max_eval_examples: int | None,
    reference_logits_path: str | os.PathLike[str] | None,
) -> None:
    """Write ``config.json`` in a new run folder, or check that an existing one is this run
    (and, for a run still to train, that every file it writes can be replaced; a finished run
    is only read, and may be archived read-only)."""
    config_path = run_dir / "config.json"
    orphans = [n for n in RUN_FILES if (run_dir / n).is_file()] if not config_path.is_file() else []
    if orphans:
        raise ConfigError(
            f"{run_dir} holds {', '.join(orphans)} without the config.json that says which run "
            "wrote them (the folder was deleted or emptied while a run wrote to it, or copied "
            "in part): they cannot be matched to these settings; delete them or use another --out"
        )
    if not is_complete(run_dir):
        check_replaceable(run_dir, RUN_FILES)
    identity = {  # what a run folder must match to be resumed
        "prune": config.to_dict(),
        "model_fingerprint": weights_fingerprint(model),
        "train": {"name": train_set.name, "n_examples": len(train_set)},
        "means": _means_identity(means_obj),
    }
    run_config = {
        **identity,
        "model": model_spec,
        "task": task,
        "means_path": None if means is None or isinstance(means, ComponentMeans) else str(means),
        "eval": list(names),
        "max_eval_examples": max_eval_examples,
        "reference_logits": None if reference_logits_path is None else str(reference_logits_path),
    }
    if config_path.is_file():
        on_disk = read_json(config_path)
        old = dict(on_disk)
        recorded = old.get("prune")
        # how often a run saves, logs and evaluates, and its evaluation batch size, change
        # nothing it learns: a resumed run may take other values (a user who crashed may want
        # to checkpoint more often), and config.json records them
        cadence = {k: identity["prune"][k] for k in _NOT_LEARNT}
        if isinstance(recorded, dict):  # a field added since: its default was implied
            added = {k: v for k, v in _DEFAULTS_SINCE.items() if k not in recorded}
            old["prune"] = {**recorded, **added, **cadence}
        differ = sorted(k for k in identity if old.get(k) != identity[k])
        if "prune" in differ and isinstance(old.get("prune"), dict):  # name the fields
            was, now = old["prune"], identity["prune"]
            fields_ = sorted(k for k in {*was, *now} if was.get(k) != now.get(k))
            differ = [*(f"prune.{k}" for k in fields_), *(k for k in differ if k != "prune")]
        if differ:
            raise ConfigError(
                f"{run_dir} already holds a run with other settings ({', '.join(differ)} differ); "
                "use another --out or delete it"
            )
        # the same run asked with other eval sets or sizes: record them (a finished run's
        # metrics are re-evaluated to match); best effort, as the record is not the result
        asked = {k: run_config[k] for k in ("eval", "max_eval_examples")}
        if isinstance(recorded, dict) and any(recorded.get(k) != v for k, v in cadence.items()):
            asked["prune"] = {**recorded, **cadence}
        if any(on_disk.get(k) != v for k, v in asked.items()):
            try:
                write_json(config_path, {**on_disk, **asked})
            except OutputError as exc:
                logger.warning("%s; it keeps the first call's eval settings", exc)
    else:
        write_json(config_path, run_config)


def _run_targets(
    model: Any,
    tokenized: TokenizedPairs,
    config: PruneConfig,
    run_dir: Path,
    reference_logits_path: str | os.PathLike[str] | None,
    progress: bool,
) -> torch.Tensor:
    """The full model's logits on the training set: shared ones, or the run's own (cached)."""
    if reference_logits_path is not None:
        ref_path = Path(reference_logits_path)
        if not ref_path.is_file():
            raise ConfigError(f"reference logits {ref_path} do not exist")
        return load_reference_logits(ref_path, model, tokenized)
    ref_path = run_dir / "reference_logits.safetensors"
    return reference_logits(model, tokenized, ref_path, config.eval_batch_size, progress)


def prune_group(
    model: Any,
    train: str | os.PathLike[str] | PairDataset,
    means: str | os.PathLike[str] | ComponentMeans | None,
    configs: Sequence[PruneConfig],
    run_dirs: Sequence[str | os.PathLike[str]],
    *,
    eval_sets: Sequence[str | PairDataset] = (),
    task: str | None = None,
    max_train_examples: int | None = None,
    max_eval_examples: int | None = None,
    reference_logits_path: str | os.PathLike[str] | None = None,
    full_accuracy: Mapping[str, float] | None = None,
    progress: bool = True,
    max_chunk: int | None | str = "auto",
    device: str = "auto",
) -> list[PruneResult]:
    """Several pruning runs trained together, each with its files in its own folder.

    The runs (``configs[k]`` in ``run_dirs[k]``, differing only in target sparsity, seed and the
    schedules that follow from them, :data:`GROUP_VARYING`)
    share one forward / backward pass per micro-batch (:func:`group_pruning_step`): the frozen
    model and the reference logits are shared, while each run keeps its own gates, lambdas,
    optimizer, target schedule, noise and data order, so every run ends as it would alone (up
    to float rounding from padding the concatenated batch; with dropout on, the dropout noise is
    drawn per group). Each folder is a :func:`prune_run` folder: finished runs only report,
    unfinished ones resume from their own checkpoint, and a run can later be resumed alone. A run
    whose loss becomes non-finite stops; the others finish, then :class:`TrainingError` names it.
    Without ``reference_logits_path`` the logits are computed once and cached in every folder.
    ``max_chunk``: examples per forward pass (:func:`default_chunk` when ``"auto"``);
    ``device``: where a model given as a path is loaded.
    """
    if len(configs) != len(run_dirs) or not configs:
        raise ConfigError(f"prune_group needs one folder per config; got {len(configs)} configs "
                          f"and {len(run_dirs)} folders")  # fmt: skip
    _check_group(configs)
    dirs = [Path(d) for d in run_dirs]
    if len(set(dirs)) != len(dirs):
        raise ConfigError("the runs of a group need distinct folders")
    check_named_inputs(train, eval_sets, means)
    model, model_spec = _load_model(model, task, device)
    with fingerprint_held(model):  # the weights stay fixed: one fingerprint for every check
        task, means_obj, train_set, evals, names = _load_inputs(
            model, task, means, configs[0].ablation, train, max_train_examples, eval_sets,
            max_eval_examples,
        )  # fmt: skip
        for cfg, run_dir in zip(configs, dirs, strict=True):
            _claim_run_dir(
                run_dir, cfg, model, model_spec, task, train_set, means, means_obj, names,
                max_eval_examples, reference_logits_path,
            )  # fmt: skip
        results: dict[int, PruneResult] = {}
        pending = []
        for k, (cfg, run_dir) in enumerate(zip(configs, dirs, strict=True)):
            if is_complete(run_dir):
                results[k] = _report_complete(model, means_obj, cfg, run_dir, evals, full_accuracy)
            else:
                pending.append(k)
        failures: list[TrainingError] = []
        if pending:
            started = time.perf_counter()
            tokenized = tokenize_pairs(train_set, model.tokenizer, configs[0].max_length)
            targets = _run_targets(
                model, tokenized, configs[0], dirs[pending[0]], reference_logits_path, progress
            )
            if reference_logits_path is None:  # every folder keeps its logits, as a run alone does
                for k in pending[1:]:
                    path = dirs[k] / "reference_logits.safetensors"
                    if not path.is_file():
                        write_safetensors(
                            path, {"logits": targets.cpu()}, reference_metadata(model, tokenized)
                        )
            states = [_start_run(model, tokenized, configs[k], dirs[k], None) for k in pending]
            if max_chunk == "auto":
                max_chunk = default_chunk(model, configs[0])
            _train_group(
                model, means_obj, tokenized, targets, states, progress, max_chunk, evals=evals,
            )  # fmt: skip
            seconds = (time.perf_counter() - started) / len(pending)
            for k, state in zip(pending, states, strict=True):
                if state.error is not None:
                    failures.append(state.error)
                    continue
                log_alpha = state.gates.log_alpha.detach().cpu().clone()
                result = _finish(
                    model, means_obj, configs[k], dirs[k], log_alpha, state.log(), evals,
                    full_accuracy, seconds,
                )  # fmt: skip
                result.resumed_from = state.start if state.start > 0 else None
                results[k] = result
        if len(configs) == 1 and failures:  # a run alone fails as prune_run does
            raise failures[0]
        if failures:
            first = next(k for k in pending if k not in results)
            raise TrainingError(
                f"{len(failures)} of {len(configs)} runs trained together failed (first: "
                f"{dirs[first]}: {failures[0]}); the others finished"
            )
        return [results[k] for k in range(len(configs))]


def prune_run(
    model: Any,
    train: str | os.PathLike[str] | PairDataset,
    out: str | os.PathLike[str],
    config: PruneConfig,
    *,
    means: str | os.PathLike[str] | ComponentMeans | None = None,
    **options: Any,
) -> PruneResult:
    """:func:`prune` with its files under ``out`` (resumable): the form a sweep and a Ray
    worker use."""
    return prune(model, train, means, config, checkpoint_dir=out, **options)


def _prune_in_memory(
    model: Any,
    means: ComponentMeans | None,
    config: PruneConfig,
    train_set: PairDataset,
    evals: Sequence[PairDataset],
    full_accuracy: Mapping[str, float] | None,
    progress: bool,
    callback: StepCallback | None,
    reference_logits_path: str | os.PathLike[str] | None,
    reference: torch.Tensor | None,
) -> PruneResult:
    started = time.perf_counter()
    tokenized = tokenize_pairs(train_set, model.tokenizer, config.max_length)
    if reference is not None:
        if reference.shape[0] != len(tokenized):
            raise ConfigError(
                f"reference logits for {reference.shape[0]} examples, but the training set has "
                f"{len(tokenized)}"
            )
        targets = reference
    elif reference_logits_path is not None:
        targets = load_reference_logits(Path(reference_logits_path), model, tokenized)
    else:
        targets = compute_reference_logits(model, tokenized, config.eval_batch_size, progress)
    log_alpha, log, _ = _train(
        model, means, tokenized, targets, config, None, progress, callback, evals
    )
    seconds = time.perf_counter() - started
    return _finish(model, means, config, None, log_alpha, log, evals, full_accuracy, seconds)


def _finish(
    model: Any,
    means: ComponentMeans | None,
    cfg: PruneConfig,
    run_dir: Path | None,
    log_alpha: torch.Tensor,
    log: pd.DataFrame,
    evals: Sequence[PairDataset],
    full_accuracy: Mapping[str, float] | None,
    seconds: float,
) -> PruneResult:
    weights = _sparsity_weights(model, cfg.sparsity_weighting)
    mask, achieved = _discrete_mask(log_alpha, model_dims(model), cfg.target_sparsity, cfg, weights)
    if run_dir is not None:
        mask.save(run_dir / "mask.safetensors")
        mask.save(run_dir / "mask.json")
        _save_subnetwork(run_dir, mask, means, cfg)
    device = next(model.parameters()).device
    accuracy, full, sizes = _evaluate_sets(model, mask.to(device), means, cfg, evals, full_accuracy)
    last = log.iloc[-1] if len(log) else None
    final = final_sparsity(log, cfg.sparsity_estimate)
    reached = final is not None and abs(final - cfg.target_sparsity) <= TARGET_TOLERANCE
    if not reached:
        logger.warning(
            "%s: the %s sparsity ended at %s, not within %g of the target %g: the gates did not "
            "converge (too few steps?); the discrete mask still removes %d of %d components",
            run_dir or "pruning run",
            cfg.sparsity_estimate,
            "n/a" if final is None else f"{final:.3f}",
            TARGET_TOLERANCE,
            cfg.target_sparsity,
            len(mask.removed()),
            mask.n_components,
        )
    metrics = {
        "target_sparsity": cfg.target_sparsity,
        "achieved_sparsity": achieved.by_count,
        "achieved_sparsity_by_weight": achieved.by_weight,
        "discretize": cfg.discretize,
        "threshold": achieved.threshold,
        "n_components": mask.n_components,
        "n_removed": len(mask.removed()),
        "removed": [str(c) for c in mask.removed()],
        "steps": cfg.steps,
        "final_sparsity": final,
        "final_expected_sparsity": None if last is None else float(last["expected_sparsity"]),
        "final_sampled_sparsity": None if last is None else float(last["sampled_sparsity"]),
        "reached_target": reached,
        "final_kl": None if last is None else float(last["kl"]),
        "accuracy": accuracy,
        "full_accuracy": full,
        "eval_examples": sizes,
        "eval_selection": {d.name: d.selection() for d in evals},
        "chance_accuracy": {d.name: 1.0 / d.num_labels for d in evals},
        "seconds": round(seconds, 2),
    }
    if run_dir is not None:
        # the whole log again, before metrics.json marks the run finished: one killed after its
        # last checkpoint but before log.csv resumed with the rows and wrote them nowhere
        write_csv(run_dir / "log.csv", log)
        write_json(run_dir / "metrics.json", metrics)
    return PruneResult(run_dir, mask, log_alpha, metrics, log=log)


def _save_subnetwork(
    run_dir: Path, mask: ComponentMask, means: ComponentMeans | None, cfg: PruneConfig
) -> None:
    """``subnetwork.safetensors``: the mask with what fills its removed components, so
    ``apply(model, load_intervention(path))`` runs the subnetwork the run evaluated."""
    Subnetwork(mask, cfg.ablation, means).save(run_dir / "subnetwork.safetensors")


def finished_mask(
    run_dir: Path, metrics: Mapping[str, Any], means: ComponentMeans | None, cfg: PruneConfig
) -> ComponentMask:
    """A finished run's mask, its files checked as ``metrics.json`` is: ``mask.safetensors``
    and ``mask.json`` must read back and remove the components ``metrics.json`` lists, and
    ``subnetwork.safetensors`` must hold that mask. A file missing, cut short or disagreeing
    is written again from one that agrees (with a warning); when neither mask file does, the
    run cannot be trusted and :class:`DamagedFileError` says so."""
    removed = metrics.get("removed")
    good: ComponentMask | None = None
    redo: list[str] = []
    for name in ("mask.safetensors", "mask.json"):
        try:
            mask = ComponentMask.load(run_dir / name)
        except MiCoreError:
            redo.append(name)
            continue
        if [str(c) for c in mask.removed()] != removed:
            redo.append(name)
        elif good is None:
            good = mask
    if good is None:
        raise DamagedFileError(
            f"{run_dir} is a finished run whose mask.safetensors and mask.json are missing, "
            "damaged or disagree with its metrics.json; delete the folder and run it again"
        )
    try:
        kept = Subnetwork.load(run_dir / "subnetwork.safetensors").mask
        if not torch.equal(kept.heads, good.heads) or not torch.equal(kept.mlps, good.mlps):
            redo.append("subnetwork.safetensors")
    except MiCoreError:
        redo.append("subnetwork.safetensors")
    try:
        for name in redo:
            logger.warning(
                "%s: %s is missing or damaged; written again from its mask", run_dir, name
            )
            if name == "subnetwork.safetensors":
                _save_subnetwork(run_dir, good, means, cfg)
            else:
                good.save(run_dir / name)
    except OutputError as exc:  # a finished run kept read-only on purpose: report, do not fail
        logger.warning("%s; the run's result is read from its other files", exc)
    return good


def refresh_run_metrics(
    model: Any,
    means: ComponentMeans | None,
    cfg: PruneConfig,
    run_dir: Path,
    evals: Sequence[PairDataset],
    full_accuracy: Mapping[str, float] | None,
) -> dict[str, Any]:
    """A finished run's ``metrics.json``, with every eval set it lacks, or measured on other
    examples (``max_eval_examples`` changed), evaluated now with the run's mask (its result;
    the accuracies follow the sets asked for) and written back."""
    metrics = read_json(run_dir / "metrics.json")
    # runs from before eval_selection: their sizes, where the first rows were always taken
    chosen = metrics.get("eval_selection") or metrics.get("eval_examples", {})
    missing = [
        d
        for d in evals
        if d.name not in metrics.get("accuracy", {}) or not d.matches(chosen.get(d.name))
    ]
    if missing:
        mask = ComponentMask.load(run_dir / "mask.safetensors")
        device = next(model.parameters()).device
        accuracy, full, new_sizes = _evaluate_sets(
            model, mask.to(device), means, cfg, missing, full_accuracy
        )
        metrics.setdefault("accuracy", {}).update(accuracy)
        metrics.setdefault("full_accuracy", {}).update(full)
        metrics.setdefault("eval_examples", {}).update(new_sizes)
        metrics["eval_selection"] = {
            **metrics.get("eval_selection", {}),
            **{d.name: d.selection() for d in missing},
        }
        metrics.setdefault("chance_accuracy", {}).update(
            {d.name: 1.0 / d.num_labels for d in missing}
        )
        try:
            write_json(run_dir / "metrics.json", metrics)
        except OutputError as exc:  # a finished run kept read-only: report, do not fail
            logger.warning("%s; its new numbers are reported but not kept", exc)
    return metrics


def _report_complete(
    model: Any,
    means: ComponentMeans | None,
    cfg: PruneConfig,
    run_dir: Path,
    evals: Sequence[PairDataset],
    full_accuracy: Mapping[str, float] | None,
) -> PruneResult:
    mask = finished_mask(run_dir, read_json(run_dir / "metrics.json"), means, cfg)
    metrics = refresh_run_metrics(model, means, cfg, run_dir, evals, full_accuracy)
    checkpoint = run_dir / "checkpoint.safetensors"
    log_alpha = read_safetensors(checkpoint)[0]["log_alpha"] if checkpoint.is_file() else None
    log_path = run_dir / "log.csv"
    log = pd.read_csv(log_path) if log_path.is_file() else pd.DataFrame(columns=list(LOG_COLUMNS))
    return PruneResult(run_dir, mask, log_alpha, metrics, already_complete=True, log=log)
