"""Every result of one heuristic-core experiment, read back by one typed loader.

The stages write their tables through :class:`~.layout.ExperimentLayout`; the report, the
findings and :class:`~.pipeline.HeuristicCoreResult` read them through
:meth:`ExperimentTables.load`, the inverse of those writers, so a file is parsed in one place
and with one set of options (tables whose cells are names, such as ``"None"`` head sets, keep
them as strings). A stage that has not run leaves its field None.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from mi_core.errors import ConfigError
from mi_core.io import read_json
from mi_core.methods.heuristic_core.comparison import COMPARISON_FILES, SubnetworkComparison
from mi_core.methods.heuristic_core.layout import ExperimentLayout

__all__ = ["ExperimentTables", "pruning_runs"]


def _table(path: Path, names: bool = False) -> pd.DataFrame | None:
    """The CSV at ``path`` (None when missing); with ``names`` no cell is read as NaN."""
    if not path.is_file():
        return None
    return pd.read_csv(path, keep_default_na=False) if names else pd.read_csv(path)


def _json(path: Path) -> dict[str, Any] | None:
    return read_json(path) if path.is_file() else None


def _older(path: Path, lacks: str, rerun: str) -> ConfigError:
    """The one line refusing a file of an older mi_core (it has no ``lacks``)."""
    return ConfigError(f"{path} was written by an older mi_core (it has no {lacks}): {rerun}")


def _refuse_older(layout: ExperimentLayout, stage: str, path: Path, found: Any, needs: str) -> None:
    """Refuse ``found``, what ``stage`` wrote at ``path`` (None: the stage has not run), when it
    has no ``needs``: an older mi_core wrote it; the line names the stage to re-run."""
    if found is not None and needs not in found:
        marker = layout.stage_marker(stage)
        rerun = f"re-run the {stage} stage (delete {marker} and run mi-core heuristic-core again)"
        raise _older(path, needs, rerun)


def _run_folders(runs: pd.DataFrame | None, sweep: Path | None) -> list[tuple[str, Path]]:
    """Each sweep run's name and folder: under ``sweep`` (the report directory's own copy,
    wherever it was moved or copied to) when it is there, else the ``run_dir`` the sweep
    recorded. Runs with neither are left out."""
    if runs is None or runs.empty:
        return []
    from mi_core.pruning.sweeps import run_dir_for

    found = []
    for _, run in runs.iterrows():
        folder = None
        if sweep is not None and "sparsity" in runs and "seed" in runs:
            here = run_dir_for(sweep, float(run["sparsity"]), int(run["seed"]))
            folder = here if here.is_dir() else None
        if folder is None and "run_dir" in runs and isinstance(run["run_dir"], str):
            folder = Path(run["run_dir"])
        if folder is not None:
            name = str(run["subnetwork"]) if "subnetwork" in runs else folder.name
            found.append((name, folder))
    return found


def _run_metrics(runs: pd.DataFrame | None, sweep: Path | None = None) -> dict[str, Any]:
    """The ``metrics.json`` of the first of the sweep's runs that has one (empty without)."""
    for _, folder in _run_folders(runs, sweep):
        metrics = _json(folder / "metrics.json")
        if metrics is not None:
            return metrics
    return {}


def pruning_runs(
    runs: pd.DataFrame | None, sweep: Path | None = None
) -> tuple[pd.DataFrame | None, pd.DataFrame | None]:
    """The sweep's pruning logs (``log.csv`` rows with a ``run`` column: the subnetwork's
    name) and one row per run from its ``metrics.json``: did its sparsity meet the target, and
    where its sampled and expected sparsity ended. (None, None) without run folders. A run of
    an older mi_core (a log without the sampled sparsity, metrics without ``reached_target``)
    is refused."""
    if runs is None or runs.empty:
        return None, None
    logs, rows = [], []
    for name, folder in _run_folders(runs, sweep):
        rerun = f"delete {folder} and run the sweep again"
        log = _table(folder / "log.csv")
        if log is not None and not log.empty:
            from mi_core.viz.figures import PRUNING_LOG_COLUMNS  # what the report draws

            lacks = [c for c in PRUNING_LOG_COLUMNS if c != "run" and c not in log]
            if lacks:
                raise _older(folder / "log.csv", ", ".join(lacks), rerun)
            logs.append(log.assign(run=name))
        metrics = _json(folder / "metrics.json")
        if metrics is not None:
            if "reached_target" not in metrics:
                raise _older(folder / "metrics.json", "reached_target", rerun)
            rows.append(
                {
                    "subnetwork": name,
                    "steps": metrics.get("steps"),
                    "target_sparsity": metrics.get("target_sparsity"),
                    "reached_target": metrics.get("reached_target"),
                    "final_sampled_sparsity": metrics.get("final_sampled_sparsity"),
                    "final_expected_sparsity": metrics.get("final_expected_sparsity"),
                    "final_kl": metrics.get("final_kl"),
                }
            )
    return (
        pd.concat(logs, ignore_index=True) if logs else None,
        pd.DataFrame(rows) if rows else None,
    )


@dataclass
class ExperimentTables:
    """The stages' results under one report directory (None: the stage has not run)."""

    root: Path
    config: dict[str, Any] | None = None
    """``experiment.json``: the config the experiment ran with."""
    stages: list[dict[str, Any]] = field(default_factory=list)
    """One record per finished stage (``stages/<name>.json``: stage, seconds, finished)."""
    finetune_metrics: pd.DataFrame | None = None
    """``step, dataset, accuracy`` of the full model during fine-tuning."""
    runs: pd.DataFrame | None = None
    """The sweep's subnetworks: sparsity, seed, achieved sparsity, ``acc_<set>``,
    ``full_acc_<set>``, run folder."""
    comparison: SubnetworkComparison | None = None
    """Frequencies, cores, chance levels and Spearman of the sweep's subnetworks."""
    pruning_logs: pd.DataFrame | None = None
    """The sweep's runs' ``log.csv`` rows, with ``run`` naming each run's subnetwork (built in
    memory without it, the report reads them from :attr:`runs`' ``run_dir``)."""
    pruning_summary: pd.DataFrame | None = None
    """One row per sweep run: steps, target, whether its sparsity met the target, and its
    final sampled and expected sparsity and KL (from its ``metrics.json``)."""
    grid_runs: pd.DataFrame | None = None
    """The subnetworks of the sparsity x seed grid (Figure 4), as :attr:`runs`."""
    attention_classes: pd.DataFrame | None = None
    """One row per chosen head: its attention mass per key class and its pattern class."""
    ablation: pd.DataFrame | None = None
    """The core's ablation table in numbers (``kind``, ``ablated``, ``<set>``, changes)."""
    ablation_display: pd.DataFrame | None = None
    """The same table as the report shows it (percent, changes in points)."""
    ablation_examples: dict[str, int] = field(default_factory=dict)
    """Examples per data set the ablation table was measured on."""
    ablation_note: str | None = None
    """What the ablation stage said about its table (e.g. no core to ablate)."""
    effective_size: pd.DataFrame | None = None
    """Effective size per checkpoint step and target (``step, target, effective_size``)."""
    full_accuracy: pd.DataFrame | None = None
    """The full model's accuracy per checkpoint step and data set."""
    core_before: dict[str, Any] | None = None
    """The core-before-generalisation summary (rise step, checkpoint, cores)."""
    core_edges: pd.DataFrame | None = None
    """Sum of ``|edge score|`` into / out of / within the core, per subnetwork."""
    findings: pd.DataFrame | None = None
    """The findings table the last report wrote (``finding, paper, this run, verdict``)."""
    eval_examples: dict[str, int] = field(default_factory=dict)
    """Examples per evaluation set, as the sweep's runs recorded them (empty without a run)."""
    chance_accuracy: dict[str, float] = field(default_factory=dict)
    """Chance accuracy per evaluation set (1 / classes scored), as the runs recorded it."""

    @property
    def layout(self) -> ExperimentLayout:
        return ExperimentLayout(self.root)

    @classmethod
    def load(cls, root: str | os.PathLike[str]) -> ExperimentTables:
        """Read every result the stages under ``root`` have written."""
        layout = ExperimentLayout(root)
        try:
            comparison = SubnetworkComparison.load(layout.analysis)
        except ConfigError:  # the analysis stage has not run
            comparison = None
        note = layout.ablation_file("note")
        stages = [read_json(p) for p in sorted(layout.stages.glob("*.json"))]
        runs = _table(layout.analysis / COMPARISON_FILES["subnetworks"])
        meta = _run_metrics(runs, layout.sweep)
        pruning_logs, pruning_summary = pruning_runs(runs, layout.sweep)
        core_before = _json(layout.core_before_summary)
        _refuse_older(layout, "core_before", layout.core_before_summary, core_before, "ood_floor")
        core_edges = _table(layout.core_edges_summary)
        _refuse_older(layout, "core_edges", layout.core_edges_summary, core_edges, "fill")
        return cls(
            root=layout.root,
            config=_json(layout.config),
            stages=stages,
            finetune_metrics=_table(layout.finetune_metrics),
            runs=runs,
            comparison=comparison,
            pruning_logs=pruning_logs,
            pruning_summary=pruning_summary,
            grid_runs=_table(layout.grid / COMPARISON_FILES["subnetworks"]),
            attention_classes=_table(layout.attention_classes),
            ablation=_table(layout.ablation_file("table"), names=True),
            ablation_display=_table(layout.ablation_file("display"), names=True),
            ablation_note=note.read_text(encoding="utf-8") if note.is_file() else None,
            ablation_examples=_json(layout.ablation_file("examples")) or {},
            effective_size=_table(layout.effective_size_file("effective_size")),
            full_accuracy=_table(layout.effective_size_file("full_accuracy")),
            core_before=core_before,
            core_edges=core_edges,
            findings=_table(layout.findings, names=True),
            eval_examples={k: int(v) for k, v in meta.get("eval_examples", {}).items()},
            chance_accuracy={k: float(v) for k, v in meta.get("chance_accuracy", {}).items()},
        )
