"""A pruning run's folder: claiming it, its reference logits, its final files, and reading it back.

A run directory holds::

    config.json               what was asked for (the run's identity; a re-run must match it)
    reference_logits.safetensors   the full model's logits per training example (unless shared)
    checkpoint.safetensors    log_alpha, lambdas, AdamW state; JSON metadata: step, noise seed
    log.csv                   per step: loss, kl, expected and target sparsity, lambdas; every
                              eval_every steps the subnetwork's accuracy on the first eval set
    mask.safetensors, mask.json    the binary subnetwork (mask.json lists removed components)
    subnetwork.safetensors    the mask with its fill and means, ready for ``apply`` /
                              ``load_intervention``
    metrics.json              achieved sparsity; subnetwork and full-model accuracy per eval set

A folder whose ``metrics.json`` and ``config.json`` exist holds a finished run.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd
import torch

from mi_core.data.batches import TokenizedPairs
from mi_core.data.prompt_tasks import TaskData
from mi_core.data.text import TextTask
from mi_core.errors import (
    ConfigError,
    DamagedFileError,
    MiCoreError,
    OutputError,
)
from mi_core.interventions import ComponentMask, ComponentMeans, Subnetwork
from mi_core.interventions.components import model_dims
from mi_core.io import (
    check_replaceable,
    read_json,
    read_safetensors,
    write_csv,
    write_json,
)
from mi_core.models.fingerprint import weights_fingerprint
from mi_core.pruning.inputs import RunSources, means_identity
from mi_core.pruning.loop import NOT_LEARNT, discrete_mask, evaluate_sets
from mi_core.pruning.objectives import objective_column, resolve_objective
from mi_core.pruning.profiles import PruneConfig
from mi_core.pruning.reference_logits import (
    load_reference_logits,
    reference_logits,
)
from mi_core.pruning.result import LOG_COLUMNS, TARGET_TOLERANCE, PruneResult, final_sparsity
from mi_core.pruning.step import sparsity_weights

if TYPE_CHECKING:
    from mi_core.models.types import HookedModel

logger = logging.getLogger(__name__)


def is_complete(run_dir: str | os.PathLike[str]) -> bool:
    """True when ``run_dir`` holds a finished run: its ``metrics.json`` and the ``config.json``
    that says what was asked for (a folder without it holds nothing a run can be matched to;
    :func:`prune_run` refuses it)."""
    return (Path(run_dir) / "metrics.json").is_file() and (Path(run_dir) / "config.json").is_file()


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


def _train_identity(train_set: TaskData) -> dict[str, Any]:
    """What a run records of its training data: its name and size, and for plain text a digest
    of its windows (a text file edited between a kill and the resume is refused; prompt and
    pair data are checked by their reference logits' digest)."""
    identity: dict[str, Any] = {"name": train_set.name, "n_examples": len(train_set)}
    if isinstance(train_set, TextTask):
        identity["tokens"] = train_set.digest()
    return identity


def claim_run_dir(
    run_dir: Path,
    config: PruneConfig,
    model: HookedModel,
    sources: RunSources,
    train_set: TaskData,
    means_obj: ComponentMeans | None,
    names: Sequence[str],
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
        "train": _train_identity(train_set),
        "means": means_identity(means_obj),
    }
    run_config = {
        **identity,
        "model": sources.model,
        "task": sources.task,
        "means_path": sources.means_path,
        "eval": list(names),
        "max_eval_examples": sources.max_eval_examples,
        "reference_logits": None if reference_logits_path is None else str(reference_logits_path),
    }
    if config_path.is_file():
        on_disk = read_json(config_path)
        old = dict(on_disk)
        recorded = old.get("prune")
        # how often a run saves, logs and evaluates, and its evaluation batch size, change
        # nothing it learns: a resumed run may take other values (a user who crashed may want
        # to checkpoint more often), and config.json records them
        cadence = {k: identity["prune"][k] for k in NOT_LEARNT}
        if isinstance(recorded, dict):
            lacks = sorted(k for k in identity["prune"] if k not in recorded)
            if lacks:
                raise ConfigError(
                    f"{config_path} is a pruning run of an older mi_core (it records no "
                    f"{', '.join(lacks)}): delete {run_dir} and run it again"
                )
            old["prune"] = {**recorded, **cadence}
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


def run_targets(
    model: HookedModel,
    tokenized: TokenizedPairs,
    config: PruneConfig,
    run_dir: Path,
    reference_logits_path: str | os.PathLike[str] | None,
    progress: bool,
) -> torch.Tensor | None:
    """The full model's logits on the training set: shared ones, or the run's own (cached);
    None where the run's objective computes its own (plain text's, in each step)."""
    if not resolve_objective(config.objective, tokenized).needs_reference:
        return None
    if reference_logits_path is not None:
        ref_path = Path(reference_logits_path)
        if not ref_path.is_file():
            raise ConfigError(f"reference logits {ref_path} do not exist")
        return load_reference_logits(ref_path, model, tokenized)
    ref_path = run_dir / "reference_logits.safetensors"
    return reference_logits(model, tokenized, ref_path, config.eval_batch_size, progress)


def finish_run(
    model: HookedModel,
    means: ComponentMeans | None,
    cfg: PruneConfig,
    run_dir: Path | None,
    log_alpha: torch.Tensor,
    log: pd.DataFrame,
    evals: Sequence[TaskData],
    full_accuracy: Mapping[str, float] | None,
    seconds: float,
) -> PruneResult:
    weights = sparsity_weights(model, cfg.sparsity_weighting)
    mask, achieved = discrete_mask(log_alpha, model_dims(model), cfg.target_sparsity, cfg, weights)
    if run_dir is not None:
        mask.save(run_dir / "mask.safetensors")
        mask.save(run_dir / "mask.json")
        save_subnetwork(run_dir, mask, means, cfg)
    device = next(model.parameters()).device
    accuracy, full, sizes = evaluate_sets(model, mask.to(device), means, cfg, evals, full_accuracy)
    last = log.iloc[-1] if len(log) else None
    column = objective_column(cfg.objective)
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
        f"final_{column}": None if last is None else float(last[column]),
        "accuracy": accuracy,
        "full_accuracy": full,
        "eval_examples": sizes,
        "eval_selection": {d.name: d.selection() for d in evals},
        "chance_accuracy": {d.name: d.chance_accuracy for d in evals},
        "seconds": round(seconds, 2),
    }
    if run_dir is not None:
        # the whole log again, before metrics.json marks the run finished: a run killed after
        # its last checkpoint but before log.csv would resume with those rows and write them
        # nowhere
        write_csv(run_dir / "log.csv", log)
        write_json(run_dir / "metrics.json", metrics)
    return PruneResult(run_dir, mask, log_alpha, metrics, log=log)


def save_subnetwork(
    run_dir: Path, mask: ComponentMask, means: ComponentMeans | None, cfg: PruneConfig
) -> None:
    """``subnetwork.safetensors``: the mask with what fills its removed components, so
    ``apply(model, load_intervention(path))`` runs the subnetwork the run evaluated."""
    Subnetwork(mask, cfg.fill, means).save(run_dir / "subnetwork.safetensors")


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
                save_subnetwork(run_dir, good, means, cfg)
            else:
                good.save(run_dir / name)
    except OutputError as exc:  # a finished run kept read-only on purpose: report, do not fail
        logger.warning("%s; the run's result is read from its other files", exc)
    return good


def refresh_run_metrics(
    model: HookedModel,
    means: ComponentMeans | None,
    cfg: PruneConfig,
    run_dir: Path,
    evals: Sequence[TaskData],
    full_accuracy: Mapping[str, float] | None,
) -> dict[str, Any]:
    """A finished run's ``metrics.json``, with every eval set it lacks, or measured on other
    examples (``max_eval_examples`` changed), evaluated now with the run's mask (its result;
    the accuracies follow the sets asked for) and written back."""
    metrics = read_json(run_dir / "metrics.json")
    if "eval_selection" not in metrics:
        raise ConfigError(
            f"{run_dir / 'metrics.json'} is a pruning run of an older mi_core (it records no "
            f"eval_selection): delete {run_dir} and run it again"
        )
    chosen = metrics["eval_selection"]
    missing = [
        d
        for d in evals
        if d.name not in metrics.get("accuracy", {}) or not d.matches(chosen.get(d.name))
    ]
    if missing:
        mask = ComponentMask.load(run_dir / "mask.safetensors")
        device = next(model.parameters()).device
        accuracy, full, new_sizes = evaluate_sets(
            model, mask.to(device), means, cfg, missing, full_accuracy
        )
        metrics.setdefault("accuracy", {}).update(accuracy)
        metrics.setdefault("full_accuracy", {}).update(full)
        metrics.setdefault("eval_examples", {}).update(new_sizes)
        metrics["eval_selection"] = {**chosen, **{d.name: d.selection() for d in missing}}
        metrics.setdefault("chance_accuracy", {}).update(
            {d.name: d.chance_accuracy for d in missing}
        )
        try:
            write_json(run_dir / "metrics.json", metrics)
        except OutputError as exc:  # a finished run kept read-only: report, do not fail
            logger.warning("%s; its new numbers are reported but not kept", exc)
    return metrics


def report_complete(
    model: HookedModel, means: ComponentMeans | None, cfg: PruneConfig, run_dir: Path,
    evals: Sequence[TaskData], full_accuracy: Mapping[str, float] | None,
) -> PruneResult:  # fmt: skip
    """A finished run's result, read from its folder (eval sets it lacks measured now)."""
    mask = finished_mask(run_dir, read_json(run_dir / "metrics.json"), means, cfg)
    metrics = refresh_run_metrics(model, means, cfg, run_dir, evals, full_accuracy)
    checkpoint = run_dir / "checkpoint.safetensors"
    log_alpha = read_safetensors(checkpoint)[0]["log_alpha"] if checkpoint.is_file() else None
    log_path = run_dir / "log.csv"
    log = pd.read_csv(log_path) if log_path.is_file() else pd.DataFrame(columns=list(LOG_COLUMNS))
    return PruneResult(run_dir, mask, log_alpha, metrics, already_complete=True, log=log)
