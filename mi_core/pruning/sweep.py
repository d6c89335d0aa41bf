"""Many pruning runs: one per (target sparsity, seed), in this process or spread over Ray.

A sweep directory holds one run directory per pair (``SWEEP/s0.50/seed42/``, see
:func:`~mi_core.pruning.run.prune_run`), the shared inputs computed once for all of them
(``reference_logits.safetensors``: the full model's logits on the training set;
``full_model.json``: the full model's accuracy per eval set), and the summary:
``subnetworks.csv`` (one row per run) and ``subnetworks.html`` (the paper's Figure 2: in-domain
vs out-of-domain accuracy per subnetwork, the full model as lines).

Runs whose ``metrics.json`` exists are skipped, so re-running a sweep after a crash finishes
only what is missing. With ``executor="ray"`` every missing run is a Ray task that calls
:func:`prune_run` with paths; results are files, so the driver only waits and collects.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from mi_core.data import PairDataset
from mi_core.data.batches import tokenize_pairs
from mi_core.errors import ConfigError, MiCoreError, TrainingError
from mi_core.evaluation import evaluate
from mi_core.io import read_json, write_csv, write_json
from mi_core.pruning.profiles import PruneConfig, make_prune_config
from mi_core.pruning.reference_logits import reference_logits
from mi_core.pruning.run import _load_data, _load_means, _load_model, is_complete, prune_run

logger = logging.getLogger(__name__)

EXECUTORS = ("local", "ray")
#: Environment variables a Ray worker needs to find data and stay offline like the driver.
_WORKER_ENV = ("MI_CORE_DATA_DIR", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "HF_HOME")


def run_dir_for(sweep_dir: str | os.PathLike[str], sparsity: float, seed: int) -> Path:
    """``SWEEP/s0.50/seed42``: the directory of one run (sparsity to 2 decimals when exact)."""
    name = f"s{sparsity:.2f}" if round(sparsity, 2) == sparsity else f"s{sparsity:g}"
    return Path(sweep_dir) / name / f"seed{seed}"


@dataclass(frozen=True)
class SweepRun:
    """One run of a sweep: its target, seed, config and directory."""

    sparsity: float
    seed: int
    config: PruneConfig
    run_dir: Path


def plan_sweep(
    out: str | os.PathLike[str],
    sparsities: Sequence[float],
    seeds: Sequence[int],
    profile: str = "paper",
    overrides: Mapping[str, Any] | None = None,
) -> list[SweepRun]:
    """Every (sparsity, seed) run of a sweep with its validated config, sparsity-major."""
    if not sparsities or not seeds:
        raise ConfigError("a sweep needs at least one sparsity and one seed")
    return [
        SweepRun(
            s,
            seed,
            make_prune_config(profile, s, seed, **dict(overrides or {})),
            run_dir_for(out, s, seed),
        )
        for s in sparsities
        for seed in seeds
    ]


def _ray_prune(kwargs: dict[str, Any], env: dict[str, str]) -> str:
    """What a Ray worker runs: set the driver's data/offline environment, then one run."""
    os.environ.update(env)
    return str(prune_run(**kwargs).run_dir)


def _import_ray():
    try:
        import ray
    except ImportError:
        raise ConfigError(
            "the ray executor needs Ray: pip install 'mi_core[ray]' (or use --executor local)"
        ) from None
    return ray


def _run_with_ray(
    pending: Sequence[SweepRun],
    common: dict[str, Any],
    ray_address: str | None,
    num_cpus_per_run: float,
) -> list[str]:
    """Run ``pending`` as Ray tasks and wait for all; returns the failed runs' messages."""
    ray = _import_ray()
    started_here = False
    if not ray.is_initialized():
        ray.init(address=ray_address, include_dashboard=False, log_to_driver=False)
        started_here = True
    try:
        task = ray.remote(num_cpus=num_cpus_per_run)(_ray_prune)
        env = {k: os.environ[k] for k in _WORKER_ENV if k in os.environ}
        refs = [
            task.remote({**common, "out": str(r.run_dir), "config": r.config}, env) for r in pending
        ]
        failures: list[str] = []
        remaining = list(refs)
        while remaining:
            done, remaining = ray.wait(remaining, num_returns=1)
            try:
                logger.info("ray: %s finished", ray.get(done[0]))
            except Exception as exc:  # a failed task: keep collecting the others
                cause = getattr(exc, "cause", None) or exc
                failures.append(" ".join(str(cause).split()))
        return failures
    finally:
        if started_here:
            ray.shutdown()


def _full_model_accuracy(
    model: Any, evals: Sequence[PairDataset], cfg: PruneConfig, path: Path
) -> dict[str, float]:
    known: dict[str, float] = read_json(path) if path.is_file() else {}
    missing = [d for d in evals if d.name not in known]
    for dataset in missing:
        known[dataset.name] = evaluate(
            model, dataset, batch_size=cfg.eval_batch_size, max_length=cfg.max_length
        ).accuracy
    if missing:
        write_json(path, known)
    return {d.name: known[d.name] for d in evals}


def collect_subnetworks(runs: Sequence[SweepRun], eval_names: Sequence[str]) -> pd.DataFrame:
    """One row per complete run: sparsity, seed, achieved sparsity, accuracy per eval set
    (``acc_<name>``) and the full model's (``full_acc_<name>``)."""
    rows = []
    for r in runs:
        if not is_complete(r.run_dir):
            continue
        metrics = read_json(r.run_dir / "metrics.json")
        row: dict[str, Any] = {
            "sparsity": r.sparsity,
            "seed": r.seed,
            "achieved_sparsity": metrics["achieved_sparsity"],
            "n_removed": metrics["n_removed"],
            "run_dir": str(r.run_dir),
        }
        for name in eval_names:
            row[f"acc_{name}"] = metrics["accuracy"].get(name)
        for name in eval_names:
            row[f"full_acc_{name}"] = metrics["full_accuracy"].get(name)
        rows.append(row)
    columns = ["sparsity", "seed", "achieved_sparsity", "n_removed", "run_dir"]
    columns += [f"acc_{n}" for n in eval_names] + [f"full_acc_{n}" for n in eval_names]
    return pd.DataFrame(rows, columns=columns)


def subnetworks_figure(table: pd.DataFrame, eval_names: Sequence[str], full: Mapping[str, float]):
    """Figure 2 (ID vs OOD accuracy per subnetwork) when there are >= 2 eval sets; with one, its
    accuracy against sparsity; with none, the achieved sparsity against the target."""
    import plotly.graph_objects as go

    from mi_core.viz.figures import accuracy_vs_sparsity, id_vs_ood_scatter

    if len(eval_names) >= 2:
        frame = table.rename(columns={f"acc_{n}": n for n in eval_names})
        frame["run"] = [
            f"s={s:g} seed={seed}" for s, seed in zip(frame.sparsity, frame.seed, strict=True)
        ]
        return id_vs_ood_scatter(
            frame, dict(full), eval_names[0], list(eval_names[1:]), label_col="run"
        )
    if len(eval_names) == 1:
        long = pd.DataFrame(
            {
                "sparsity": table["sparsity"],
                "dataset": eval_names[0],
                "accuracy": table[f"acc_{eval_names[0]}"],
            }
        )
        return accuracy_vs_sparsity(long, full_model_acc=dict(full))
    fig = go.Figure(go.Scatter(x=table["sparsity"], y=table["achieved_sparsity"], mode="markers"))
    return fig.update_layout(
        title="Achieved vs target sparsity (no eval sets given)",
        xaxis_title="target sparsity",
        yaxis_title="achieved sparsity",
    )


def run_sweep(
    model: Any,
    train: str | os.PathLike[str] | PairDataset,
    out: str | os.PathLike[str],
    sparsities: Sequence[float],
    seeds: Sequence[int],
    *,
    means: str | os.PathLike[str] | None = None,
    eval_sets: Sequence[str | PairDataset] = (),
    profile: str = "paper",
    overrides: Mapping[str, Any] | None = None,
    task: str | None = None,
    max_train_examples: int | None = None,
    max_eval_examples: int | None = None,
    executor: str = "local",
    ray_address: str | None = None,
    num_cpus_per_run: float = 1.0,
    progress: bool | None = None,
) -> pd.DataFrame:
    """Prune at every sparsity with every seed under ``out``; return the subnetworks table.

    Missing runs only are run (``executor`` ``"local"``: one after another here; ``"ray"``: as
    Ray tasks on ``ray_address``, or on a local Ray instance when None and none is running).
    Reference logits and full-model accuracies are computed once here and shared by every run.
    The ray executor needs ``model``, ``train``, ``means`` and ``eval_sets`` as paths / specs.
    """
    if executor not in EXECUTORS:
        raise ConfigError(f"unknown executor {executor!r}; choose one of {EXECUTORS}")
    sweep_dir = Path(out)
    runs = plan_sweep(sweep_dir, sparsities, seeds, profile, overrides)
    cfg = runs[0].config
    if executor == "ray":
        _import_ray()
        objects = [
            x
            for x in (model, train, means, *eval_sets)
            if x is not None and not isinstance(x, (str, os.PathLike))
        ]
        if objects:
            raise ConfigError(
                "the ray executor needs the model, data and means as paths or specs, not objects"
            )

    model_obj, _ = _load_model(model, task)
    task = getattr(model_obj, "task", None) or task
    means_obj = _load_means(means, model_obj, cfg.ablation)
    train_set = _load_data(train, task, max_train_examples, "training")
    evals = [_load_data(d, task, max_eval_examples, "eval") for d in eval_sets]
    eval_names = [d.name for d in evals]

    sweep_dir.mkdir(parents=True, exist_ok=True)
    ref_path = sweep_dir / "reference_logits.safetensors"
    tokenized = tokenize_pairs(train_set, model_obj.tokenizer, cfg.max_length)
    reference_logits(model_obj, tokenized, ref_path, cfg.eval_batch_size, bool(progress))
    full = _full_model_accuracy(model_obj, evals, cfg, sweep_dir / "full_model.json")

    pending = [r for r in runs if not is_complete(r.run_dir)]
    logger.info("sweep %s: %d of %d runs to do", sweep_dir, len(pending), len(runs))
    failures: list[str] = []
    if executor == "local":
        for r in pending:
            try:
                prune_run(
                    model_obj,
                    train_set,
                    r.run_dir,
                    r.config,
                    means=means_obj,
                    eval_sets=evals,
                    task=task,
                    reference_logits_path=ref_path,
                    full_accuracy=full,
                    progress=progress,
                )
            except MiCoreError as exc:  # a failed run: finish the others, report at the end
                logger.warning("%s failed: %s", r.run_dir, exc)
                failures.append(f"{r.run_dir}: {exc}")
    elif pending:
        common = {
            "model": os.fspath(model),
            "train": os.fspath(train),
            "means": None if means is None else os.fspath(means),
            "eval_sets": [os.fspath(d) for d in eval_sets],
            "task": task,
            "max_train_examples": max_train_examples,
            "max_eval_examples": max_eval_examples,
            "reference_logits_path": str(ref_path),
            "full_accuracy": full,
            "progress": False,
        }
        failures = _run_with_ray(pending, common, ray_address, num_cpus_per_run)

    table = collect_subnetworks(runs, eval_names)
    write_csv(sweep_dir / "subnetworks.csv", table)
    from mi_core.viz.figures import write_figure_html

    write_figure_html(subnetworks_figure(table, eval_names, full), sweep_dir / "subnetworks.html")
    incomplete = [str(r.run_dir) for r in runs if not is_complete(r.run_dir)]
    if incomplete:
        first = failures[0] if failures else incomplete[0]
        raise TrainingError(
            f"{len(incomplete)} of {len(runs)} sweep runs did not finish (first: {first}); "
            "subnetworks.csv lists the finished ones; re-run the sweep to retry the rest"
        )
    return table
