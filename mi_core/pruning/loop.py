"""The training loop of one run or of a group of runs: states, steps, probes, checkpoints."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import pandas as pd
import torch
from jaxtyping import Float
from tqdm.auto import tqdm

from mi_core.data import pair_batches
from mi_core.data.batches import TokenizedPairs
from mi_core.data.circuit_pairs import PromptPairs
from mi_core.data.prompt_tasks import TaskData
from mi_core.devices import grad_scaler, matmul_precision
from mi_core.errors import (
    ConfigError,
    TrainingError,
)
from mi_core.evaluation import evaluate
from mi_core.interventions import ComponentMask, ComponentMeans, ablate
from mi_core.interventions.components import model_dims
from mi_core.io import (
    write_csv,
)
from mi_core.models.dropout import train_dropout
from mi_core.models.frozen import frozen
from mi_core.pruning.checkpoint import (
    check_resumable,
    checkpoint_log,
    load_checkpoint,
    mask_tensors,
    save_checkpoint,
)
from mi_core.pruning.discretize import (
    AchievedSparsity,
    discretize,
    unflatten_components,
)
from mi_core.pruning.group_optimizer import GroupAdamW
from mi_core.pruning.hard_concrete import (
    HardConcrete,
)
from mi_core.pruning.lagrangian import (
    LagrangianController,
    pruning_optimizer,
)
from mi_core.pruning.mask_kinds import COMPONENTS, MaskKind, Schedule
from mi_core.pruning.objectives import OBJECTIVES, Objective, log_row
from mi_core.pruning.profiles import PruneConfig, unreachable_target
from mi_core.pruning.result import StepCallback, log_columns
from mi_core.pruning.schedule import lr_factor, target_sparsity_at
from mi_core.pruning.step import StepMember, group_pruning_step, sparsity_weights
from mi_core.seeding import derive_seed

if TYPE_CHECKING:
    from mi_core.models.types import HookedModel

logger = logging.getLogger(__name__)


class RunSettings(Protocol):
    """What the loop reads of a run's recipe: a :class:`PruneConfig` (heads and MLPs, neurons),
    or an edge run's :class:`~mi_core.circuits.EdgePruneSettings`, which names its settings so
    too (and fixes those its recipe does not vary)."""

    @property
    def seed(self) -> int: ...
    @property
    def steps(self) -> int: ...
    @property
    def batch_size(self) -> int: ...
    @property
    def target_sparsity(self) -> float: ...
    @property
    def warmup_steps(self) -> int: ...
    @property
    def lr_warmup_steps(self) -> int | None: ...
    @property
    def lr_schedule(self) -> str: ...
    @property
    def lr_log_alpha(self) -> float: ...
    @property
    def lr_lambda(self) -> float: ...
    @property
    def weight_decay(self) -> float: ...
    @property
    def lambda_weight_decay(self) -> float: ...
    @property
    def max_grad_norm(self) -> float: ...
    @property
    def checkpoint_every(self) -> int: ...
    @property
    def grad_accumulation(self) -> int: ...
    @property
    def dropout(self) -> bool: ...
    @property
    def eval_every(self) -> int: ...
    @property
    def precision(self) -> str: ...
    @property
    def sparsity_estimate(self) -> str: ...
    @property
    def sparsity_weighting(self) -> str: ...
    @property
    def objective(self) -> str: ...
    @property
    def fill(self) -> str: ...
    def to_dict(self) -> dict[str, Any]: ...


#: A run's training data: tokenised examples, or prompt pairs (edges).
RunData = TokenizedPairs | PromptPairs


@dataclass
class RunState:
    """One run's training state: gates, lambdas, optimizer, data order, log and files."""

    cfg: Any
    """The run's recipe (:class:`RunSettings`: a :class:`PruneConfig` for node masks)."""
    run_dir: Path | None
    gates: HardConcrete
    controller: LagrangianController
    optimizer: torch.optim.Optimizer
    base_lrs: list[float]
    schedule: Schedule
    start: int
    rows: list[dict[str, float]]
    last_good: int | None
    callback: StepCallback | None = None
    error: TrainingError | None = None
    scaler: torch.amp.GradScaler | None = None
    """This run's fp16 loss scaler (None in fp32 / bf16): each run of a group scales its own
    loss, so one run's overflow never skips or shrinks another's step."""
    objective: Objective = OBJECTIVES["answer_kl"]
    """What the run minimises (its config's, resolved for its training data)."""
    kind: MaskKind = COMPONENTS
    """What its gates gate (:mod:`~mi_core.pruning.mask_kinds`)."""
    fills: Any = None
    """What replaces a removed unit of a kind that carries its own fills (neurons: a
    :class:`~mi_core.interventions.neurons.PruneMasks`); None: the kind's default."""
    identity: dict[str, Any] | None = None
    """What the run's checkpoint must match to resume, where the run checks it itself
    (``config`` and ``inputs``: :func:`~mi_core.pruning.checkpoint.check_resumable`); None
    where its folder's ``config.json`` does (:mod:`~mi_core.pruning.run_folder`)."""
    what: str = "pruning"
    """The run in messages (``"edge-pruning"``)."""

    @property
    def checkpoint(self) -> Path | None:
        return None if self.run_dir is None else self.run_dir / self.kind.checkpoint_file

    @property
    def log_path(self) -> Path | None:
        return None if self.run_dir is None else self.run_dir / "log.csv"

    @property
    def trained(self) -> list[torch.Tensor]:
        return [self.gates.log_alpha, *self.controller.parameters()]

    def log(self) -> pd.DataFrame:
        """The rows as ``log.csv``: the loop's columns, then any a kind adds."""
        columns = list(log_columns(self.objective.column))
        columns += [k for k in (self.rows[0] if self.rows else {}) if k not in columns]
        return pd.DataFrame(self.rows, columns=columns)


def start_run(
    model: HookedModel,
    tokenized: RunData,
    cfg: RunSettings,
    run_dir: Path | None,
    callback: StepCallback | None,
    *,
    kind: MaskKind = COMPONENTS,
    objective: Objective | None = None,
    fills: Any = None,
    identity: dict[str, Any] | None = None,
    what: str = "pruning",
) -> RunState:
    """A run's fresh state, or its state at its last checkpoint in ``run_dir``: gates of
    ``kind`` (heads and MLPs, neurons with ``fills``, or edges), learned against
    ``objective`` (default: ``cfg.objective`` resolved by the kind for ``tokenized``; an
    objective with options of its own, as learned separability's, is passed built).
    ``identity`` (``{"config": ..., "inputs": ...}``): what a checkpoint must match to be
    resumed, refused in one line naming ``what`` otherwise."""
    device = next(model.parameters()).device
    gates = kind.gates(cfg, model).to(device)
    controller = kind.controller().to(device)
    optimizer = pruning_optimizer(
        gates.parameters(),
        controller,
        cfg.lr_log_alpha,
        cfg.lr_lambda,
        cfg.weight_decay,
        cfg.lambda_weight_decay,
    )
    state = RunState(
        cfg,
        run_dir,
        gates,
        controller,
        optimizer,
        [group["lr"] for group in optimizer.param_groups],
        kind.schedule(tokenized, cfg.batch_size, cfg.seed),
        start=0,
        rows=[],
        last_good=None,
        callback=callback,
        scaler=grad_scaler(device, cfg.precision),
        objective=kind.objective(cfg.objective, tokenized) if objective is None else objective,
        kind=kind,
        fills=fills,
        identity=identity,
        what=what,
    )
    if objective is not None:
        assert isinstance(tokenized, TokenizedPairs)  # a built objective: node masks' data
        objective.check(tokenized)
    checkpoint = state.checkpoint
    if checkpoint is not None and checkpoint.is_file():
        if identity is not None:
            check_resumable(
                checkpoint, kind.name, identity["config"], identity["inputs"], what, NOT_LEARNT
            )
        state.start = load_checkpoint(
            checkpoint, mask_tensors(gates, controller), optimizer, state.scaler
        )
        # the rows the checkpoint holds: log.csv may lag behind it
        state.rows = [row for row in checkpoint_log(checkpoint) if row["step"] < state.start]
        state.last_good = state.start
        logger.info("resuming %s from step %d", run_dir, state.start)
    elif isinstance(cfg, PruneConfig):
        short = unreachable_target(cfg)
        if short is not None:
            logger.warning("%s: %s", run_dir or "pruning run", short)
    return state


#: Settings that change how often a run saves, logs and evaluates, not what it learns: a
#: resumed run may change them.
NOT_LEARNT = ("checkpoint_every", "eval_every", "eval_batch_size")

#: Configuration fields that may differ between the runs trained together in one group: the
#: target and the seed, and the schedules derived from the target (the paper's step counts and
#: warm-ups grow with the sparsity).
GROUP_VARYING = ("target_sparsity", "seed", "steps", "warmup_steps", "lr_warmup_steps")


def check_group(configs: Sequence[PruneConfig]) -> None:
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


def train_group(
    model: HookedModel,
    means: ComponentMeans | None,
    tokenized: RunData,
    reference: torch.Tensor | None,
    runs: Sequence[RunState],
    progress: bool,
    max_chunk: int | None = None,
    evals: Sequence[TaskData] = (),
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

    ``reference``: the full model's logits on ``tokenized``, cached, where the runs' objective
    reads them (:attr:`~mi_core.pruning.objectives.Objective.needs_reference`), else None.
    """
    cfg = runs[0].cfg
    check_group([r.cfg for r in runs])
    objective, kind = runs[0].objective, runs[0].kind
    if any(r.objective is not objective or r.kind is not kind for r in runs):
        raise ConfigError("the runs of a group need one objective and one kind of mask")
    if kind.own_step and len(runs) > 1:
        raise ConfigError(
            f"{kind.name} masks are learned one run at a time (each step records its own "
            "batch's counterfactual run): train the runs one after another"
        )
    device = next(model.parameters()).device
    rng_devices = [device] if device.type == "cuda" else []
    weights = sparsity_weights(model, cfg.sparsity_weighting, kind)
    weights = None if weights is None else weights.to(device)
    targets = kind.targets(model, objective, tokenized, reference).to(device)
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
    mask = kind.blank(model, device, runs[0].fills)
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
    if evals and cfg.eval_every > 0 and kind is COMPONENTS:
        probe = _subnetwork_probe(model, mask, evals[0], weights, cfg)
    with (
        frozen(model),
        kind.applied(model, mask, means, cfg.fill),
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
                        step,
                    )
                )
            parts = [
                [r.schedule.indices(step * accumulation + micro) for r in active]
                for micro in range(accumulation)
            ]
            with (
                torch.random.fork_rng(devices=rng_devices, enabled=cfg.dropout),
                train_dropout(model, cfg.dropout),  # not around the probe's evaluations
            ):
                if cfg.dropout:
                    torch.manual_seed(derive_seed("prune", "dropout", active[0].cfg.seed, step))
                if kind.own_step:  # one run (checked above)
                    micro = [part[0] for part in parts]
                    rows = [kind.step(model, mask, members[0], tokenized, micro, targets,
                                      objective, cfg.precision)]  # fmt: skip
                else:
                    assert isinstance(tokenized, TokenizedPairs)
                    batches = [tokenized.collate([i for p in part for i in p]) for part in parts]
                    sizes = [[len(p) for p in part] for part in parts]
                    rows = group_pruning_step(
                        model, mask, members, batches, sizes, targets, weights, max_chunk,
                        cfg.precision, [r.scaler for r in active], objective=objective,
                        kind=kind,
                    )  # fmt: skip
            rows = [log_row(objective, row) for row in rows]
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
                postfix = {  # both sparsity estimates, named as in log.csv and warnings
                    objective.column: f"{shown[objective.column]:.4f}",
                    "target": f"{shown['target_sparsity']:.3f}",
                    "expected_sparsity": f"{shown['expected_sparsity']:.3f}",
                    "sampled_sparsity": f"{shown['sampled_sparsity']:.3f}",
                }
                if "eval_accuracy" in shown:
                    postfix["acc"] = f"{shown['eval_accuracy']:.3f}"
                bar.set_postfix(postfix)
    bar.close()
    if stacked is not None:  # each run's AdamW holds its state, as after a run alone
        for r in runs:
            stacked.export(slot[id(r)])


def _clip(r: RunState) -> torch.Tensor:
    """Unscale (fp16) and clip one run's gradients; their total norm before clipping."""
    if r.scaler is not None:
        r.scaler.unscale_(r.optimizer)
    max_norm = r.cfg.max_grad_norm if r.cfg.max_grad_norm > 0 else math.inf
    return torch.nn.utils.clip_grad_norm_(r.trained, max_norm).float()


def _finish_step(
    r: RunState,
    step: int,
    row: dict[str, float],
    factor: float,
    norm: float,
    export: Callable[[], None] | None = None,
    probe: Callable[[RunState, float], dict[str, float]] | None = None,
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
        rates = (
            "--lr-log-alpha / --lr-lambda" if isinstance(cfg, PruneConfig) else "--lr / --lr-lambda"
        )
        r.error = TrainingError(
            f"{r.what} loss became {'NaN' if math.isnan(total) else total} at step {step}; "
            f"stopped; {where}; lower {rates} or check the means and data"
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
        info = {"noise": {"seed": cfg.seed, "next_step": done}, "mask_kind": r.kind.name,
                **(r.identity or {})}  # fmt: skip
        tensors = mask_tensors(r.gates, r.controller)
        save_checkpoint(r.checkpoint, done, tensors, r.optimizer, r.rows, r.scaler, info)
        write_csv(r.log_path, r.log())
        r.last_good = done
    if r.callback is not None:
        r.callback(step, r.rows[-1])


#: Examples of the first eval set a probe evaluates (the authors' trainer: 2,000 MNLI pairs).
PROBE_EXAMPLES = 2000


def discrete_mask(
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
    model: HookedModel,
    mask: ComponentMask,
    dataset: TaskData,
    weights: torch.Tensor | None,
    cfg: PruneConfig,
) -> Callable[[RunState, float], dict[str, float]]:
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

    def probe(r: RunState, target: float) -> dict[str, float]:
        gates = r.gates.log_alpha.detach().cpu()
        discrete, achieved = discrete_mask(gates, dims, target, r.cfg, host_weights)
        mask.heads, mask.mlps = discrete.heads.to(device), discrete.mlps.to(device)
        accuracy = evaluate(model, subset, batches=batches).accuracy
        return {"eval_accuracy": accuracy, "eval_sparsity": achieved.by_count}

    return probe


def train_run(
    model: HookedModel,
    means: ComponentMeans | None,
    tokenized: TokenizedPairs,
    reference: torch.Tensor | None,
    cfg: PruneConfig,
    run_dir: Path | None,
    progress: bool,
    callback: StepCallback | None,
    evals: Sequence[TaskData] = (),
) -> tuple[torch.Tensor, pd.DataFrame, int | None]:
    """Train one run (:func:`train_group` of one): its final log_alpha, log and resume step."""
    state = start_run(model, tokenized, cfg, run_dir, callback)
    train_group(model, means, tokenized, reference, [state], progress, evals=evals)
    if state.error is not None:
        raise state.error
    return (
        state.gates.log_alpha.detach().cpu().clone(),
        state.log(),
        state.start if state.start > 0 else None,
    )


# ------------------------------------------------------------------------------- evaluation
def evaluate_sets(
    model: HookedModel,
    mask: ComponentMask,
    means: ComponentMeans | None,
    cfg: PruneConfig,
    eval_sets: Sequence[TaskData],
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
        with ablate(model, mask, means, cfg.fill):
            accuracy[dataset.name] = evaluate(
                model, dataset, batch_size=cfg.eval_batch_size, max_length=cfg.max_length
            ).accuracy
    return accuracy, full, sizes
