"""Many pruning runs: one per (target sparsity, seed), in this process or spread over Ray.

A sweep directory holds one run directory per pair (``SWEEP/s0.50/seed42/``, see
:func:`~mi_core.pruning.run.prune_run`), the shared inputs computed once for all of them
(``reference_logits.safetensors``: the full model's logits on the training set;
``full_model.json``: the full model's accuracy per eval set), and the summary:
``subnetworks.csv`` (one row per run) and ``subnetworks.html`` (the paper's Figure 2: in-domain
vs out-of-domain accuracy per subnetwork, the full model as lines).

Runs whose ``metrics.json`` exists are skipped, so re-running a sweep after a crash finishes
only what is missing. Executors:

* ``local``: the missing runs one after another in this process;
* ``batched``: groups of ``group_size`` runs trained together through one forward / backward
  pass per micro-batch (:func:`~mi_core.pruning.run.prune_group`; the default group size is
  what memory allows, :func:`auto_group_size`); the folders are the ``local`` executor's;
* ``ray``: every missing run (or every group of ``group_size`` runs) is a Ray task that calls
  :func:`prune_run` (or :func:`prune_group`) with paths; results are files, so the driver only
  waits and collects.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd
import torch
from jaxtyping import Bool
from torch import Tensor

from mi_core.data.batches import tokenize_pairs
from mi_core.data.prompt_tasks import TaskData
from mi_core.errors import ConfigError, MiCoreError, TrainingError
from mi_core.evaluation import evaluate
from mi_core.interventions import ComponentMask, ComponentMeans
from mi_core.io import check_replaceable, read_json, write_csv, write_json
from mi_core.pruning.constants import EXECUTORS, check_ray_gpus
from mi_core.pruning.inputs import PruneInputs, resolve_inputs
from mi_core.pruning.objectives import resolve_objective
from mi_core.pruning.profiles import PruneConfig, make_prune_config
from mi_core.pruning.reference_logits import (
    compute_reference_logits,
    reference_logits,
)
from mi_core.pruning.run import prune, prune_group, prune_run
from mi_core.pruning.run_folder import (
    RUN_FILES,
    claim_run_dir,
    finished_mask,
    is_complete,
    refresh_run_metrics,
)

if TYPE_CHECKING:
    from mi_core.models.types import HookedModel

logger = logging.getLogger(__name__)

#: The most runs one batched group trains together when the size is chosen from memory.
MAX_AUTO_GROUP = 32
#: Environment variables a Ray worker needs to find data and stay offline like the driver.
_WORKER_ENV = ("MI_CORE_DATA_DIR", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "HF_HOME")


_SEED_DIR = re.compile(r"^seed(\d+)$")


def group_name(sparsity: float) -> str:
    """The column suffix of one sparsity in the tables: ``0.5`` -> ``"0.5"``."""
    return f"{float(sparsity):g}"


@dataclass
class SweepResult:
    """Every finished run of a sweep: its metrics (one row each) and its binary mask.

    :func:`sweep` returns one (in memory, or with files under a ``out``);
    :meth:`load` reads one back from a sweep directory (the inverse of :func:`run_sweep`).
    """

    sweep_dir: Path | None
    runs: pd.DataFrame
    """One row per run, by (sparsity, seed): ``sparsity, seed, subnetwork, achieved_sparsity,
    n_removed, mlps_removed, run_dir``, then ``acc_<set>`` and ``full_acc_<set>`` per eval set."""
    masks: list[ComponentMask]
    """The runs' masks, in the order of ``runs``."""
    eval_names: list[str]
    full_accuracy: dict[str, float]

    @property
    def sparsities(self) -> list[float]:
        return sorted({float(s) for s in self.runs["sparsity"]})

    def head_masks(self, sparsity: float | None = None) -> Bool[Tensor, "n n_layers n_heads"]:
        """Stacked head masks (True = kept) of every run, or of the runs at one sparsity."""
        rows = range(len(self.masks))
        if sparsity is not None:
            rows = [i for i in rows if math.isclose(self.runs["sparsity"].iloc[i], sparsity)]
        if not rows:
            where = f" in {self.sweep_dir}" if self.sweep_dir else ""
            raise ConfigError(f"no finished runs at sparsity {sparsity}{where}")
        return torch.stack([self.masks[i].heads.detach().cpu() > 0.5 for i in rows])

    def masks_by_sparsity(self) -> dict[str, Bool[Tensor, "n n_layers n_heads"]]:
        """``{"0.5": masks, ...}`` in increasing sparsity."""
        return {group_name(s): self.head_masks(s) for s in self.sparsities}

    def accuracy_long(self) -> pd.DataFrame:
        """Tidy accuracies: ``sparsity, seed, subnetwork, dataset, accuracy`` (one row per run
        and eval set)."""
        rows = [
            {
                "sparsity": r["sparsity"],
                "seed": r["seed"],
                "subnetwork": r["subnetwork"],
                "dataset": name,
                "accuracy": r[f"acc_{name}"],
            }
            for _, r in self.runs.iterrows()
            for name in self.eval_names
        ]
        return pd.DataFrame(rows, columns=["sparsity", "seed", "subnetwork", "dataset", "accuracy"])

    @classmethod
    def load(
        cls,
        sweep_dir: str | os.PathLike[str],
        sparsities: Sequence[float] | None = None,
        seeds: Sequence[int] | None = None,
    ) -> SweepResult:
        """The finished runs under ``sweep_dir`` (see :func:`load_sweep`)."""
        return load_sweep(sweep_dir, sparsities, seeds)


def _run_seed(run_dir: Path, metrics: dict[str, Any]) -> int:
    match = _SEED_DIR.match(run_dir.name)
    if match:
        return int(match.group(1))
    config = run_dir / "config.json"
    if config.is_file():
        return int(read_json(config)["prune"]["seed"])
    raise ConfigError(f"cannot tell the seed of run {run_dir}; expected a seed<N> directory")


def _load_mask(run_dir: Path) -> ComponentMask:
    for name in ("mask.safetensors", "mask.json"):
        if (run_dir / name).is_file():
            return ComponentMask.load(run_dir / name)
    raise ConfigError(f"run {run_dir} has metrics.json but no mask.safetensors or mask.json")


def load_sweep(
    sweep_dir: str | os.PathLike[str],
    sparsities: Sequence[float] | None = None,
    seeds: Sequence[int] | None = None,
) -> SweepResult:
    """Every finished run (a ``metrics.json`` beside a mask) under ``sweep_dir``, optionally only
    those of ``sparsities`` and ``seeds``.

    Runs are found as ``*/seed*/metrics.json`` (the layout of :func:`run_dir_for`);
    the sparsity is the run's ``target_sparsity``. Unfinished runs are left out.
    """
    root = Path(sweep_dir)
    if not root.is_dir():
        raise ConfigError(f"sweep directory {root} does not exist")
    found = []
    for metrics_path in sorted(root.glob("*/*/metrics.json")):
        run_dir = metrics_path.parent
        metrics = read_json(metrics_path)
        sparsity, seed = float(metrics["target_sparsity"]), _run_seed(run_dir, metrics)
        if sparsities is not None and not any(math.isclose(sparsity, s) for s in sparsities):
            continue
        if seeds is not None and seed not in seeds:
            continue
        found.append((sparsity, seed, run_dir))
    if not found:
        raise ConfigError(
            f"no finished pruning runs in {root} (expected s<sparsity>/seed<N>/metrics.json); "
            "run mi-core sweep first"
        )
    found.sort(key=lambda t: (t[0], t[1]))
    eval_names: list[str] = []
    full: dict[str, float] = {}
    full_path = root / "full_model.json"
    if full_path.is_file():
        full.update(read_json(full_path))
    rows, masks = [], []
    for sparsity, seed, run_dir in found:
        metrics = read_json(run_dir / "metrics.json")
        mask = _load_mask(run_dir)
        for name in metrics.get("accuracy", {}):
            if name not in eval_names:
                eval_names.append(name)
        for name, acc in metrics.get("full_accuracy", {}).items():
            full.setdefault(name, acc)
        rows.append(_run_row(sparsity, seed, metrics, mask, run_dir))
        masks.append(mask)
    shapes = {(m.n_layers, m.n_heads) for m in masks}
    if len(shapes) != 1:
        raise ConfigError(f"the runs in {root} belong to different models (mask shapes {shapes})")
    return _result(root, rows, masks, eval_names, full)


def _run_row(
    sparsity: float, seed: int, metrics: dict[str, Any], mask: ComponentMask, run_dir: Any
) -> dict[str, Any]:
    row: dict[str, Any] = {
        "sparsity": sparsity,
        "seed": seed,
        "subnetwork": f"s={group_name(sparsity)} seed={seed}",
        "achieved_sparsity": metrics.get("achieved_sparsity", mask.sparsity()),
        "n_removed": metrics.get("n_removed", len(mask.removed())),
        "mlps_removed": int((mask.mlps.detach() < 0.5).sum()),
        "final_expected_sparsity": metrics.get("final_expected_sparsity"),
        "run_dir": None if run_dir is None else str(run_dir),
    }
    row.update({f"acc_{k}": v for k, v in metrics.get("accuracy", {}).items()})
    row.update({f"n_{k}": v for k, v in metrics.get("eval_examples", {}).items()})
    return row


def _result(
    root: Path | None,
    rows: list[dict[str, Any]],
    masks: list[ComponentMask],
    eval_names: list[str],
    full: dict[str, float],
) -> SweepResult:
    columns = ["sparsity", "seed", "subnetwork", "achieved_sparsity", "n_removed", "mlps_removed"]
    columns += ["final_expected_sparsity", "run_dir"] + [f"acc_{n}" for n in eval_names]
    frame = pd.DataFrame(rows)
    runs = frame.reindex(columns=columns)
    for name in eval_names:
        runs[f"full_acc_{name}"] = full.get(name, float("nan"))
    for name in eval_names:  # the examples each accuracy was measured on
        runs[f"n_{name}"] = frame.get(f"n_{name}")
    full = {n: full[n] for n in eval_names if n in full}
    return SweepResult(root, runs, masks, eval_names, full)


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


def sweep(
    model: HookedModel | str | os.PathLike[str],
    train: str | os.PathLike[str] | TaskData,
    means: str | os.PathLike[str] | ComponentMeans | None,
    sparsities: Sequence[float],
    seeds: Sequence[int],
    *,
    profile: str = "paper",
    overrides: Mapping[str, Any] | None = None,
    eval_sets: Sequence[str | TaskData] = (),
    out: str | os.PathLike[str] | None = None,
    executor: str = "local",
    group_size: int | None = None,
    ray_address: str | None = None,
    num_cpus_per_run: float = 1.0,
    num_gpus_per_run: float = 0.0,
    task: str | None = None,
    max_train_examples: int | None = None,
    max_eval_examples: int | None = None,
    progress: bool = True,
    device: str = "auto",
) -> SweepResult:
    """Prune at every sparsity with every seed; return every subnetwork.

    In memory by default: the full model's logits and accuracies are computed once and shared
    by the runs, and nothing is written. With ``out`` the sweep is :func:`run_sweep`'s, with
    its files (resumable; finished runs are skipped), read back; there ``executor`` chooses how
    the runs are trained (``local``: one after another; ``batched``: ``group_size`` at a time
    in one pass; ``ray``: as Ray tasks on ``ray_address`` with ``num_cpus_per_run`` /
    ``num_gpus_per_run`` each, which take ``model``, ``train`` and ``means`` as paths).
    """
    if out is None and (executor != "local" or group_size is not None):
        raise ConfigError(
            f"a sweep with executor {executor!r} writes every run's folder: give out="
        )
    if out is not None:
        run_sweep(model, train, out, sparsities, seeds, means=means, eval_sets=eval_sets,
                  profile=profile, overrides=overrides, task=task,
                  max_train_examples=max_train_examples, max_eval_examples=max_eval_examples,
                  executor=executor, group_size=group_size, ray_address=ray_address,
                  num_cpus_per_run=num_cpus_per_run, num_gpus_per_run=num_gpus_per_run,
                  progress=progress, device=device)  # fmt: skip
        return SweepResult.load(out, sparsities, seeds)
    configs = sweep_configs(sparsities, seeds, profile, overrides)
    cfg = configs[0]
    with _sweep_inputs(model, train, means, eval_sets, cfg, task, max_train_examples,
                       max_eval_examples, device) as inputs:  # fmt: skip
        model_obj, means_obj = inputs.model, inputs.means
        train_set, evals = inputs.train, inputs.eval_sets
        tokenized = tokenize_pairs(train_set, model_obj.tokenizer, cfg.max_length)
        objective = resolve_objective(cfg.objective, tokenized)
        reference = (
            compute_reference_logits(model_obj, tokenized, cfg.eval_batch_size, progress)
            if objective.needs_reference
            else None
        )
        full = _full_model_accuracy(model_obj, evals, cfg)
        rows, masks = [], []
        for config in configs:
            result = prune(
                model_obj,
                train_set,
                means_obj,
                config,
                eval_sets=evals,
                reference=reference,
                full_accuracy=full,
                progress=progress,
            )
            rows.append(
                _run_row(config.target_sparsity, config.seed, result.metrics, result.mask, None)
            )
            masks.append(result.mask)
        return _result(None, rows, masks, [d.name for d in evals], full)


def _sweep_inputs(
    model: HookedModel | str | os.PathLike[str],
    train: Any,
    means: Any,
    eval_sets: Sequence[Any],
    cfg: PruneConfig,
    task: str | None,
    max_train_examples: int | None,
    max_eval_examples: int | None,
    device: str,
) -> contextlib.AbstractContextManager[PruneInputs]:
    """:func:`resolve_inputs` for a sweep's runs (``cfg``: the first run's; they share the
    fill)."""
    return resolve_inputs(
        model, train, means, eval_sets=eval_sets, fill=cfg.fill, task=task,
        max_train_examples=max_train_examples, max_eval_examples=max_eval_examples,
        device=device,
    )  # fmt: skip


def sweep_configs(
    sparsities: Sequence[float],
    seeds: Sequence[int],
    profile: str = "paper",
    overrides: Mapping[str, Any] | None = None,
) -> list[PruneConfig]:
    """The validated config of every (sparsity, seed) run of a sweep, sparsity-major."""
    if not sparsities or not seeds:
        raise ConfigError("a sweep needs at least one sparsity and one seed")
    return [
        make_prune_config(profile, s, seed, **dict(overrides or {}))
        for s in sparsities
        for seed in seeds
    ]


def plan_sweep(
    out: str | os.PathLike[str],
    sparsities: Sequence[float],
    seeds: Sequence[int],
    profile: str = "paper",
    overrides: Mapping[str, Any] | None = None,
) -> list[SweepRun]:
    """Every (sparsity, seed) run of a sweep with its validated config and folder."""
    return [
        SweepRun(c.target_sparsity, c.seed, c, run_dir_for(out, c.target_sparsity, c.seed))
        for c in sweep_configs(sparsities, seeds, profile, overrides)
    ]


def _prune_task(**kwargs: Any) -> str:
    """One Ray task of a sweep: one run, or a group of runs trained together
    (``kwargs["configs"]`` and ``kwargs["run_dirs"]``)."""
    if "configs" in kwargs:
        configs, dirs = kwargs.pop("configs"), kwargs.pop("run_dirs")
        with resolve_inputs(
            kwargs.pop("model"), kwargs.pop("train"), kwargs.pop("means"),
            eval_sets=kwargs.pop("eval_sets"), fill=configs[0].fill,
            task=kwargs.pop("task"), max_train_examples=kwargs.pop("max_train_examples"),
            max_eval_examples=kwargs.pop("max_eval_examples"), device=kwargs.pop("device"),
        ) as inputs:  # fmt: skip
            results = prune_group(
                inputs.model, inputs.train, inputs.means, configs, dirs,
                eval_sets=inputs.eval_sets, sources=inputs.sources, **kwargs,
            )  # fmt: skip
            return ", ".join(str(r.run_dir) for r in results)
    return str(prune_run(**kwargs).run_dir)


def _ray_call(function: Any, kwargs: dict[str, Any], env: dict[str, str]) -> Any:
    """What a Ray worker runs: the driver's data / offline environment, then ``function``."""
    os.environ.update(env)
    return function(**kwargs)


def _import_ray():
    try:
        import ray
    except ImportError:
        raise ConfigError(
            "the ray executor needs Ray: pip install 'mi_core[ray]' (or use --executor local)"
        ) from None
    return ray


def run_ray_tasks(
    function: Any,
    payloads: Sequence[dict[str, Any]],
    ray_address: str | None = None,
    num_cpus_per_task: float = 1.0,
    num_gpus_per_task: float = 0.0,
) -> list[str]:
    """``function(**payload)`` for every payload as a Ray task (on ``ray_address``, or a local
    Ray instance when none is running), with the driver's data / offline environment; waits for
    all and returns the failed tasks' messages (the others finish)."""
    ray = _import_ray()
    started_here = False
    if not ray.is_initialized():
        ray.init(address=ray_address, include_dashboard=False, log_to_driver=False)
        started_here = True
    try:
        # a task asking for more than any node has waits forever (Ray's own warning goes to
        # the workers' logs): refuse it here instead
        have = ray.cluster_resources()
        for name, wanted in (("GPU", num_gpus_per_task), ("CPU", num_cpus_per_task)):
            if wanted > have.get(name, 0.0):
                raise ConfigError(
                    f"each Ray task asks for {wanted:g} {name}s but the cluster has "
                    f"{have.get(name, 0.0):g}; lower --num-{name.lower()}s-per-run"
                )
        task = ray.remote(num_cpus=num_cpus_per_task, num_gpus=num_gpus_per_task)(_ray_call)
        env = {k: os.environ[k] for k in _WORKER_ENV if k in os.environ}
        remaining = [task.remote(function, dict(payload), env) for payload in payloads]
        failures: list[str] = []
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


def _run_with_ray(
    groups: Sequence[Sequence[SweepRun]],
    common: dict[str, Any],
    ray_address: str | None,
    num_cpus_per_run: float,
    num_gpus_per_run: float = 0.0,
) -> list[str]:
    """Run each group of ``groups`` as a Ray task (a group of one: :func:`prune_run`; more: the
    runs trained together) and wait for all; returns the failed tasks' messages."""
    payloads = []
    for group in groups:
        if len(group) == 1:
            payloads.append({**common, "out": str(group[0].run_dir), "config": group[0].config})
        else:
            payloads.append({**common, "configs": [r.config for r in group],
                             "run_dirs": [str(r.run_dir) for r in group]})  # fmt: skip
    return run_ray_tasks(_prune_task, payloads, ray_address, num_cpus_per_run, num_gpus_per_run)


def training_bytes_per_example(
    model: HookedModel, max_length: int, every_position: bool = False
) -> int:
    """A generous estimate of the memory one training example of a pruning step holds until
    the backward pass (float32 activations at ``max_length`` tokens): per layer and token, about
    16 residual-width vectors (residual copies, q / k / v, z, hook outputs, LayerNorm), 3
    MLP-width ones and 4 attention rows (scores, probabilities, dropout, masks). With
    ``every_position`` (plain text) each token also holds 6 vocabulary-wide rows (both passes'
    logits, their log-probabilities, the KL terms and their gradient)."""
    from mi_core.interventions.components import model_dims

    dims = model_dims(model)
    cfg = model.cfg
    d_mlp = int(getattr(cfg, "d_mlp", None) or 4 * dims.d_model)
    per_token = 16 * dims.d_model + 3 * d_mlp + 4 * dims.n_heads * max_length
    vocab = 6 * int(getattr(cfg, "d_vocab_out", 0) or 0) * max_length if every_position else 0
    return 4 * (dims.n_layers * max_length * per_token + vocab)


def available_memory(device: torch.device) -> int:
    """Free bytes on ``device``: CUDA's free memory, or the machine's available RAM."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


def auto_group_size(
    model: HookedModel,
    cfg: PruneConfig,
    n_runs: int,
    fraction: float = 0.5,
    every_position: bool = False,
) -> int:
    """How many runs one batched group trains together: all ``n_runs`` when ``fraction`` of the
    free memory holds their micro-batches (:func:`training_bytes_per_example` at
    ``cfg.max_length``), else as many as it does (at least 1, at most :data:`MAX_AUTO_GROUP`)."""
    device = next(model.parameters()).device
    per_run = training_bytes_per_example(model, cfg.max_length, every_position) * cfg.batch_size
    fits = int(available_memory(device) * fraction // max(per_run, 1))
    return max(1, min(n_runs, fits, MAX_AUTO_GROUP))


def _full_model_accuracy(
    model: HookedModel, evals: Sequence[TaskData], cfg: PruneConfig, path: Path | None = None
) -> dict[str, float]:
    """The full model's accuracy per eval set (cached in ``path`` when given, with each set's
    selection (:meth:`PairDataset.selection`: its size and a digest of its examples) beside it
    in ``*_examples.json``: a set evaluated on other examples, e.g. after ``max_eval_examples``
    changed, is evaluated again)."""
    sizes_path = None if path is None else path.with_name(path.stem + "_examples.json")
    known: dict[str, float] = read_json(path) if path is not None and path.is_file() else {}
    sizes: dict[str, Any] = (
        read_json(sizes_path) if sizes_path is not None and sizes_path.is_file() else {}
    )
    missing = [d for d in evals if d.name not in known or not d.matches(sizes.get(d.name))]
    for dataset in missing:
        known[dataset.name] = evaluate(
            model, dataset, batch_size=cfg.eval_batch_size, max_length=cfg.max_length
        ).accuracy
        sizes[dataset.name] = dataset.selection()
    if missing and path is not None and sizes_path is not None:
        # the accuracies first: a kill between the two leaves a size that does not match, and
        # the set is evaluated again (the other order paired a new size with an old accuracy)
        write_json(path, known)
        write_json(sizes_path, sizes)
    return {d.name: known[d.name] for d in evals}


def collect_subnetworks(runs: Sequence[SweepRun], eval_names: Sequence[str]) -> pd.DataFrame:
    """One row per complete run: sparsity, seed, achieved sparsity, components removed, the
    expected sparsity its gates ended at (whether they converged), accuracy per eval set
    (``acc_<name>``), the full model's (``full_acc_<name>``) and the examples they were
    measured on (``n_<name>``)."""
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
            "final_expected_sparsity": metrics["final_expected_sparsity"],
            "run_dir": str(r.run_dir),
        }
        for name in eval_names:
            row[f"acc_{name}"] = metrics["accuracy"].get(name)
        for name in eval_names:
            row[f"full_acc_{name}"] = metrics["full_accuracy"].get(name)
        for name in eval_names:
            row[f"n_{name}"] = metrics["eval_examples"].get(name)
        rows.append(row)
    columns = ["sparsity", "seed", "achieved_sparsity", "n_removed", "final_expected_sparsity"]
    columns += ["run_dir"]
    columns += [f"acc_{n}" for n in eval_names] + [f"full_acc_{n}" for n in eval_names]
    columns += [f"n_{n}" for n in eval_names]
    return pd.DataFrame(rows, columns=columns)


def run_sweep(
    model: HookedModel | str | os.PathLike[str],
    train: str | os.PathLike[str] | TaskData,
    out: str | os.PathLike[str],
    sparsities: Sequence[float],
    seeds: Sequence[int],
    *,
    means: str | os.PathLike[str] | ComponentMeans | None = None,
    eval_sets: Sequence[str | TaskData] = (),
    profile: str = "paper",
    overrides: Mapping[str, Any] | None = None,
    task: str | None = None,
    max_train_examples: int | None = None,
    max_eval_examples: int | None = None,
    executor: str = "local",
    group_size: int | None = None,
    ray_address: str | None = None,
    num_cpus_per_run: float = 1.0,
    num_gpus_per_run: float = 0.0,
    progress: bool = True,
    device: str = "auto",
) -> pd.DataFrame:
    """Prune at every sparsity with every seed under ``out``; return the subnetworks table.

    Missing runs only are run (``executor`` ``"local"``: one after another here; ``"batched"``:
    ``group_size`` runs at a time trained together here, by default as many as memory allows;
    ``"ray"``: as Ray tasks on ``ray_address``, or on a local Ray instance when None and none is
    running, one run per task or ``group_size`` runs trained together per task). Reference
    logits and full-model accuracies are computed once here and shared by every run. The ray
    executor needs ``model``, ``train``, ``means`` and ``eval_sets`` as paths / specs; the
    others also take them loaded (``means`` from :func:`~mi_core.interventions.load_means`,
    checked against the model as a file is).
    ``device``: where a model given as a path is loaded, here and in every Ray task (``auto``:
    CUDA when the machine has one).
    """
    if executor not in EXECUTORS:
        raise ConfigError(f"unknown executor {executor!r}; choose one of {EXECUTORS}")
    if group_size is not None and group_size < 1:
        raise ConfigError(f"--group-size must be at least 1, got {group_size}")
    if group_size is not None and executor == "local" and group_size != 1:
        raise ConfigError("--group-size needs --executor batched or ray (local runs one by one)")
    check_ray_gpus(executor, device, num_gpus_per_run)
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

    with _sweep_inputs(model, train, means, eval_sets, cfg, task, max_train_examples,
                       max_eval_examples, device) as inputs:  # fmt: skip
        model_obj, means_obj = inputs.model, inputs.means
        train_set, evals = inputs.train, inputs.eval_sets
        eval_names = [d.name for d in evals]
        # every file the sweep will replace, before any work (else a read-only run folder is
        # found only after the runs before it have run)
        check_replaceable(
            sweep_dir, ("reference_logits.safetensors", "full_model.json", "subnetworks.csv",
                        "subnetworks.html")
        )  # fmt: skip
        for r in runs:
            if not is_complete(r.run_dir):
                check_replaceable(r.run_dir, RUN_FILES)
        for r in runs:  # a folder left by a run with other settings is refused, finished or not
            if (r.run_dir / "config.json").is_file():
                claim_run_dir(r.run_dir, r.config, model_obj, inputs.sources, train_set,
                              means_obj, eval_names, None)  # fmt: skip

        sweep_dir.mkdir(parents=True, exist_ok=True)
        ref_path = sweep_dir / "reference_logits.safetensors"
        tokenized = tokenize_pairs(train_set, model_obj.tokenizer, cfg.max_length)
        objective = resolve_objective(cfg.objective, tokenized)
        if objective.needs_reference:
            reference_logits(model_obj, tokenized, ref_path, cfg.eval_batch_size, progress)
        full = _full_model_accuracy(model_obj, evals, cfg, sweep_dir / "full_model.json")

        pending = [r for r in runs if not is_complete(r.run_dir)]
        logger.info("sweep %s: %d of %d runs to do", sweep_dir, len(pending), len(runs))
        failures: list[str] = []
        if executor in ("local", "batched") and pending:  # local: groups of one run
            size = (
                1
                if executor == "local"
                else group_size
                or auto_group_size(
                    model_obj, cfg, len(pending), every_position=objective.every_position
                )
            )
            if size > 1:
                logger.info("sweep %s: groups of %d runs trained together", sweep_dir, size)
            for start in range(0, len(pending), size):
                group = pending[start : start + size]
                try:
                    prune_group(
                        model_obj,
                        train_set,
                        means_obj,
                        [r.config for r in group],
                        [r.run_dir for r in group],
                        eval_sets=evals,
                        reference_logits_path=ref_path,
                        full_accuracy=full,
                        progress=progress,
                        sources=inputs.sources,  # recorded as the sweep asked it
                    )
                except MiCoreError as exc:  # a failed run or group: finish the others, report
                    where = f"{group[0].run_dir}: " if len(group) == 1 else ""
                    logger.warning("%s%s", where or "a group failed: ", exc)
                    failures.append(f"{where}{exc}")
        elif pending:
            common = {
                "model": os.fspath(model),
                "train": os.fspath(train),
                "means": None if means is None else str(means),  # a path: objects are refused above
                "eval_sets": [os.fspath(d) for d in eval_sets],
                "task": task,
                "max_train_examples": max_train_examples,
                "max_eval_examples": max_eval_examples,
                "reference_logits_path": str(ref_path),
                "full_accuracy": full,
                "progress": False,
                "device": device,
            }
            size = group_size or 1
            groups = [pending[i : i + size] for i in range(0, len(pending), size)]
            failures = _run_with_ray(
                groups, common, ray_address, num_cpus_per_run, num_gpus_per_run
            )

        for r in runs:  # finished before: their eval sets as asked for now (sizes included)
            if is_complete(r.run_dir):
                finished_mask(r.run_dir, read_json(r.run_dir / "metrics.json"), means_obj, r.config)
                refresh_run_metrics(model_obj, means_obj, r.config, r.run_dir, evals, full)
        table = collect_subnetworks(runs, eval_names)
        write_csv(sweep_dir / "subnetworks.csv", table)
        from mi_core.viz.figures import subnetworks_figure, write_figure_html

        figure = subnetworks_figure(
            table,
            eval_names,
            full,
            n={d.name: len(d) for d in evals},
            chance={d.name: d.chance_accuracy for d in evals},
        )
        write_figure_html(figure, sweep_dir / "subnetworks.html")
        incomplete = [str(r.run_dir) for r in runs if not is_complete(r.run_dir)]
        if incomplete:
            first = failures[0] if failures else incomplete[0]
            raise TrainingError(
                f"{len(incomplete)} of {len(runs)} sweep runs did not finish (first: {first}); "
                "subnetworks.csv lists the finished ones; re-run the sweep to retry the rest"
            )
        return table
