"""One L0 pruning run: learn hard-concrete gates on a frozen classifier, checkpoint, resume, report.

:func:`prune` on loaded objects, :func:`prune_run` from paths (``mi-core prune``), and
:func:`prune_group` for runs trained together. A run's folder and its files:
:mod:`mi_core.pruning.run_folder`.

Exact resumption: the hard-concrete noise of step ``k`` comes from a generator seeded with
``(seed, k)`` and the micro-batches of step ``k`` from the data order of ``seed`` and the epoch
(:func:`mi_core.data.length_grouped_batches`: random batches of similar-length examples),
so nothing about the random state has to be saved besides the step. A run killed at any point
and started again with the same arguments continues from its last checkpoint and ends with the
same ``log_alpha`` and mask as an uninterrupted run. A run whose ``metrics.json`` exists is
complete: running it again only reports the result (and evaluates eval sets it lacks).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from mi_core.data.batches import tokenize_pairs
from mi_core.data.prompt_tasks import TaskData
from mi_core.errors import (
    ConfigError,
    TrainingError,
)
from mi_core.interventions import ComponentMeans
from mi_core.io import (
    write_safetensors,
)
from mi_core.models.fingerprint import fingerprint_held
from mi_core.pruning.inputs import RunSources, check_inputs, resolve_inputs
from mi_core.pruning.loop import check_group, start_run, train_group, train_run
from mi_core.pruning.objectives import resolve_objective
from mi_core.pruning.profiles import PruneConfig
from mi_core.pruning.reference_logits import (
    compute_reference_logits,
    load_reference_logits,
    reference_metadata,
)
from mi_core.pruning.result import PruneResult, StepCallback
from mi_core.pruning.run_folder import (
    claim_run_dir,
    finish_run,
    is_complete,
    report_complete,
    run_targets,
)
from mi_core.pruning.step import default_chunk

if TYPE_CHECKING:
    from mi_core.models.types import HookedModel

logger = logging.getLogger(__name__)


# -------------------------------------------------------------------------------------- run
def prune(
    model: HookedModel,
    task_data: TaskData,
    means: ComponentMeans | None,
    config: PruneConfig,
    *,
    out: str | os.PathLike[str] | None = None,
    eval_sets: Sequence[TaskData] = (),
    reference_logits_path: str | os.PathLike[str] | None = None,
    reference: torch.Tensor | None = None,
    full_accuracy: Mapping[str, float] | None = None,
    progress: bool = True,
    callback: StepCallback | None = None,
    sources: RunSources | None = None,
) -> PruneResult:
    """Prune ``model`` to ``config.target_sparsity`` on ``task_data``; return the subnetwork.

    Takes loaded objects (``load_model``, ``load_pairs``, ``load_means``; ``means`` None for
    zero ablation); :func:`prune_run` and ``mi-core prune`` take paths. In memory by default.
    With ``out`` the run also writes its files there (``config.json``, ``log.csv``,
    ``checkpoint.safetensors``, ``mask.*``, ``metrics.json``), resumes from the last
    checkpoint when called again, and a complete run only reports.

    ``reference_logits_path`` points at the full model's logits on ``task_data`` shared by
    several runs (default: ``reference_logits.safetensors`` in ``out``, computed on first
    use); ``reference`` gives them in memory, for a run without ``out`` (e.g. shared by the
    runs of an in-memory sweep);
    ``full_accuracy`` gives full-model accuracies already known per eval set name, which are
    then not recomputed. ``callback(step, row)`` runs after every step (an exception raised
    there stops the run like a kill; with ``out`` the next call resumes). ``sources``: where
    the inputs came from, recorded in ``config.json`` (the path-taking callers fill it).
    """
    if not isinstance(config, PruneConfig):
        raise ConfigError(
            f"config must be a PruneConfig, not {type(config).__name__}: make one with "
            "make_prune_config(profile, target_sparsity=..., ...) or PruneConfig.from_dict(...)"
        )
    if out is not None and not isinstance(out, str | os.PathLike):
        raise ConfigError(f"out must be a folder path (str or Path), not {type(out).__name__}")
    if reference is not None and out is not None:
        raise ConfigError(
            "reference= gives an in-memory run its full-model logits; a run with out= keeps "
            "them in its folder (or shares a file: reference_logits_path=)"
        )
    run_dir = None if out is None else Path(out)
    with fingerprint_held(model):  # the weights stay fixed: one fingerprint for every check
        evals, names, sources = check_inputs(model, task_data, means, eval_sets, config, sources)
        if run_dir is None:
            return _prune_in_memory(
                model,
                means,
                config,
                task_data,
                evals,
                full_accuracy,
                progress,
                callback,
                reference_logits_path,
                reference,
            )

        claim_run_dir(run_dir, config, model, sources, task_data, means, names,
                      reference_logits_path)  # fmt: skip
        if is_complete(run_dir):
            return report_complete(model, means, config, run_dir, evals, full_accuracy)

        started = time.perf_counter()
        tokenized = tokenize_pairs(task_data, model.tokenizer, config.max_length)
        targets = run_targets(model, tokenized, config, run_dir, reference_logits_path, progress)
        log_alpha, log, resumed_from = train_run(
            model, means, tokenized, targets, config, run_dir, progress, callback, evals
        )
        result = finish_run(
            model,
            means,
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


def prune_group(
    model: HookedModel,
    task_data: TaskData,
    means: ComponentMeans | None,
    configs: Sequence[PruneConfig],
    outs: Sequence[str | os.PathLike[str]],
    *,
    eval_sets: Sequence[TaskData] = (),
    reference_logits_path: str | os.PathLike[str] | None = None,
    full_accuracy: Mapping[str, float] | None = None,
    progress: bool = True,
    max_chunk: int | None | str = "auto",
    sources: RunSources | None = None,
) -> list[PruneResult]:
    """Several pruning runs trained together, each with its files in its own folder.

    The runs (``configs[k]`` in ``outs[k]``, differing only in target sparsity, seed and the
    schedules that follow from them, :data:`GROUP_VARYING`)
    share one forward / backward pass per micro-batch (:func:`group_pruning_step`): the frozen
    model and the reference logits are shared, while each run keeps its own gates, lambdas,
    optimizer, target schedule, noise and data order, so every run ends as it would alone (up
    to float rounding from padding the concatenated batch; with dropout on, the dropout noise is
    drawn per group). Each folder is a :func:`prune` folder: finished runs only report,
    unfinished ones resume from their own checkpoint, and a run can later be resumed alone. A run
    whose loss becomes non-finite stops; the others finish, then :class:`TrainingError` names it.
    Without ``reference_logits_path`` the logits are computed once and cached in every folder.
    ``max_chunk``: examples per forward pass (:func:`default_chunk` when ``"auto"``). Loaded
    objects, as :func:`prune` takes them.
    """
    if len(configs) != len(outs) or not configs:
        raise ConfigError(f"prune_group needs one folder per config; got {len(configs)} configs "
                          f"and {len(outs)} folders")  # fmt: skip
    check_group(configs)
    dirs = [Path(d) for d in outs]
    if len(set(dirs)) != len(dirs):
        raise ConfigError("the runs of a group need distinct folders")
    with fingerprint_held(model):  # the weights stay fixed: one fingerprint for every check
        evals, names, sources = check_inputs(model, task_data, means, eval_sets, configs[0],
                                             sources)  # fmt: skip
        for cfg, run_dir in zip(configs, dirs, strict=True):
            claim_run_dir(run_dir, cfg, model, sources, task_data, means, names,
                          reference_logits_path)  # fmt: skip
        results: dict[int, PruneResult] = {}
        pending = []
        for k, (cfg, run_dir) in enumerate(zip(configs, dirs, strict=True)):
            if is_complete(run_dir):
                results[k] = report_complete(model, means, cfg, run_dir, evals, full_accuracy)
            else:
                pending.append(k)
        failures: list[TrainingError] = []
        if pending:
            started = time.perf_counter()
            tokenized = tokenize_pairs(task_data, model.tokenizer, configs[0].max_length)
            targets = run_targets(
                model, tokenized, configs[0], dirs[pending[0]], reference_logits_path, progress
            )
            if reference_logits_path is None and targets is not None:
                # every folder keeps its logits, as a run alone does
                for k in pending[1:]:
                    path = dirs[k] / "reference_logits.safetensors"
                    if not path.is_file():
                        write_safetensors(
                            path, {"logits": targets.cpu()}, reference_metadata(model, tokenized)
                        )
            states = [start_run(model, tokenized, configs[k], dirs[k], None) for k in pending]
            if max_chunk == "auto":
                max_chunk = default_chunk(model, configs[0])
            train_group(
                model, means, tokenized, targets, states, progress, max_chunk, evals=evals,
            )  # fmt: skip
            seconds = (time.perf_counter() - started) / len(pending)
            for k, state in zip(pending, states, strict=True):
                if state.error is not None:
                    failures.append(state.error)
                    continue
                log_alpha = state.gates.log_alpha.detach().cpu().clone()
                result = finish_run(
                    model, means, configs[k], dirs[k], log_alpha, state.log(), evals,
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
    model: HookedModel | str | os.PathLike[str],
    train: str | os.PathLike[str] | TaskData,
    out: str | os.PathLike[str],
    config: PruneConfig,
    *,
    means: str | os.PathLike[str] | ComponentMeans | None = None,
    eval_sets: Sequence[str | TaskData] = (),
    task: str | None = None,
    max_train_examples: int | None = None,
    max_eval_examples: int | None = None,
    device: str = "auto",
    **options: Any,
) -> PruneResult:
    """:func:`prune` with its files under ``out`` (resumable), from paths / specs or loaded
    objects: the form ``mi-core prune`` and a Ray worker use. ``max_*_examples`` cap the sets
    (:meth:`PairDataset.spread`); ``device``: where a model given as a path is loaded."""
    with resolve_inputs(
        model, train, means, eval_sets=eval_sets, fill=config.fill, task=task,
        max_train_examples=max_train_examples, max_eval_examples=max_eval_examples,
        device=device,
    ) as inputs:  # fmt: skip
        return prune(
            inputs.model, inputs.train, inputs.means, config, out=out,
            eval_sets=inputs.eval_sets, sources=inputs.sources, **options,
        )  # fmt: skip


def _prune_in_memory(
    model: HookedModel,
    means: ComponentMeans | None,
    config: PruneConfig,
    train_set: TaskData,
    evals: Sequence[TaskData],
    full_accuracy: Mapping[str, float] | None,
    progress: bool,
    callback: StepCallback | None,
    reference_logits_path: str | os.PathLike[str] | None,
    reference: torch.Tensor | None,
) -> PruneResult:
    started = time.perf_counter()
    tokenized = tokenize_pairs(train_set, model.tokenizer, config.max_length)
    targets: torch.Tensor | None
    if not resolve_objective(config.objective, tokenized).needs_reference:
        targets = None  # the objective computes its own (plain text's, in each step)
    elif reference is not None:
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
    log_alpha, log, _ = train_run(
        model, means, tokenized, targets, config, None, progress, callback, evals
    )
    seconds = time.perf_counter() - started
    return finish_run(model, means, config, None, log_alpha, log, evals, full_accuracy, seconds)
