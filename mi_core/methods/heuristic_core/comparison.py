"""Read a finished pruning sweep from disk and compare its subnetworks (paper section 4).

A sweep directory (``mi-core sweep``, :func:`mi_core.pruning.run_sweep`) holds one run per
(sparsity, seed) in ``SWEEP/s{sparsity}/seed{seed}/`` with ``mask.safetensors`` (or
``mask.json``) and ``metrics.json``. :func:`load_sweep` gathers every finished run;
:func:`compare_subnetworks` computes, with :mod:`mi_core.analysis.subnetworks`, the per-sparsity
head frequencies, the heads every subnetwork keeps (per sparsity and across all: the heuristic
core), the chance level of such an intersection, Spearman's rho between the frequencies of every
two sparsities and the Figure 5 heatmaps; :func:`write_comparison` saves it all as CSV.
"""

from __future__ import annotations

import itertools
import math
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from jaxtyping import Bool
from torch import Tensor

from mi_core.analysis.subnetworks import (
    core_heads_by_group,
    expected_random_intersection,
    frequency_heatmap,
    frequency_spearman,
    frequency_table,
    head_frequency,
)
from mi_core.errors import ConfigError
from mi_core.interventions import ComponentMask
from mi_core.io import read_json, write_csv

__all__ = [
    "SubnetworkComparison",
    "SweepResults",
    "compare_subnetworks",
    "group_name",
    "load_sweep",
    "write_comparison",
]

_SEED_DIR = re.compile(r"^seed(\d+)$")


def group_name(sparsity: float) -> str:
    """The column suffix of one sparsity in the tables: ``0.5`` -> ``"0.5"``."""
    return f"{float(sparsity):g}"


@dataclass
class SweepResults:
    """Every finished run of a sweep: its metrics (one row each) and its binary mask."""

    sweep_dir: Path
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
            raise ConfigError(f"no finished runs at sparsity {sparsity} in {self.sweep_dir}")
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
) -> SweepResults:
    """Every finished run (a ``metrics.json`` beside a mask) under ``sweep_dir``, optionally only
    those of ``sparsities`` and ``seeds``.

    Runs are found as ``*/seed*/metrics.json`` (the layout of :func:`mi_core.pruning.run_dir_for`);
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
        row: dict[str, Any] = {
            "sparsity": sparsity,
            "seed": seed,
            "subnetwork": f"s={group_name(sparsity)} seed={seed}",
            "achieved_sparsity": metrics.get("achieved_sparsity", mask.sparsity()),
            "n_removed": metrics.get("n_removed", len(mask.removed())),
            "mlps_removed": int((mask.mlps.detach() < 0.5).sum()),
            "run_dir": str(run_dir),
        }
        row.update({f"acc_{k}": v for k, v in metrics.get("accuracy", {}).items()})
        rows.append(row)
        masks.append(mask)
    shapes = {(m.n_layers, m.n_heads) for m in masks}
    if len(shapes) != 1:
        raise ConfigError(f"the runs in {root} belong to different models (mask shapes {shapes})")
    columns = ["sparsity", "seed", "subnetwork", "achieved_sparsity", "n_removed", "mlps_removed"]
    columns += ["run_dir"] + [f"acc_{n}" for n in eval_names]
    runs = pd.DataFrame(rows).reindex(columns=columns)
    for name in eval_names:
        runs[f"full_acc_{name}"] = full.get(name, float("nan"))
    full = {n: full[n] for n in eval_names if n in full}
    return SweepResults(root, runs, masks, eval_names, full)


@dataclass
class SubnetworkComparison:
    """Head frequencies, cores, chance levels and rank agreement of a sweep's subnetworks."""

    frequency: pd.DataFrame
    """One row per head: ``layer, head, label``, ``count_<s>`` / ``freq_<s>`` per sparsity and
    over ``all`` subnetworks (:func:`mi_core.analysis.frequency_table`)."""
    cores: dict[str, list[str]]
    """Heads kept by every subnetwork of each sparsity, and of all of them (key ``"all"``)."""
    core_table: pd.DataFrame
    """One row per group: ``group, n_subnetworks, n_heads, mean_heads_kept, n_core,
    expected_random_intersection, core_heads``."""
    spearman: pd.DataFrame
    """One row per pair of sparsities: ``sparsity_a, sparsity_b, spearman_rho, p_value,
    n_core_a, n_core_b, n_core_both``."""
    heatmaps: dict[tuple[str, str], Tensor] = field(default_factory=dict)
    """Figure 5 counts per pair of sparsities (:func:`mi_core.analysis.frequency_heatmap`)."""

    @property
    def core(self) -> list[str]:
        """The heuristic core: heads kept by every subnetwork of every sparsity."""
        return list(self.cores["all"])

    def core_heads_table(self) -> pd.DataFrame:
        """One row per head in any core: ``label, layer, head, in_core_all, in_core_<s>`` and
        ``freq_<s>`` for every sparsity."""
        groups = [g for g in self.cores if g != "all"]
        union = sorted(
            {h for heads in self.cores.values() for h in heads},
            key=lambda h: tuple(int(x[1:]) for x in h.split(".")),
        )
        freq = self.frequency.set_index("label")
        rows = []
        for label in union:
            row = {
                "label": label,
                "layer": int(freq.loc[label, "layer"]),
                "head": int(freq.loc[label, "head"]),
                "in_core_all": label in self.cores["all"],
            }
            for g in groups:
                row[f"in_core_{g}"] = label in self.cores[g]
            for g in groups:
                row[f"freq_{g}"] = float(freq.loc[label, f"freq_{g}"])
            rows.append(row)
        columns = ["label", "layer", "head", "in_core_all"]
        columns += [f"in_core_{g}" for g in groups] + [f"freq_{g}" for g in groups]
        return pd.DataFrame(rows, columns=columns)


def _mean_kept(masks: Tensor) -> float:
    return float(masks.flatten(1).sum(dim=1).float().mean())


def compare_subnetworks(
    results: SweepResults, pairs: Sequence[tuple[float, float]] | None = None
) -> SubnetworkComparison:
    """Frequencies, cores, expected random intersections and Spearman's rho of a sweep.

    ``pairs``: the sparsities to compare (default: every two). The expected intersection of a
    group of k subnetworks keeping m heads each on average is ``n (m/n)^k``
    (:func:`mi_core.analysis.expected_random_intersection`); for ``all`` (several sparsities) it
    is the product of the per-sparsity chances, ``n * prod_s (m_s/n)^{k_s}``. That is
    ``expected_random_intersection`` (m: the heads the subnetworks actually keep, which counts
    pruned MLPs in the sparsity); ``expected_random_intersection_paper`` is the paper's figure,
    with ``m / n = 1 - target sparsity`` (144 * 0.3^12 = 7.7e-5 for 12 BERT subnetworks at 70 %).
    """
    groups = results.masks_by_sparsity()
    all_masks = torch.cat(list(groups.values()))
    frequency = frequency_table({**groups, "all": all_masks})
    cores = core_heads_by_group(groups)
    n_heads = int(all_masks[0].numel())
    targets = {group_name(s): float(s) for s in results.sparsities}
    rows = []
    chance_all = paper_all = float(n_heads)
    for g, masks in groups.items():
        m, k = _mean_kept(masks), int(masks.shape[0])
        expected = expected_random_intersection(n_heads, m, k)
        paper = expected_random_intersection(n_heads, n_heads * (1 - targets[g]), k)
        chance_all *= expected / n_heads
        paper_all *= paper / n_heads
        rows.append((g, k, m, expected, paper))
    rows.append(("all", int(all_masks.shape[0]), _mean_kept(all_masks), chance_all, paper_all))
    core_table = pd.DataFrame(
        [
            {
                "group": g,
                "n_subnetworks": k,
                "n_heads": n_heads,
                "mean_heads_kept": m,
                "n_core": len(cores[g]),
                "expected_random_intersection": expected,
                "expected_random_intersection_paper": paper,
                "core_heads": " ".join(cores[g]),
            }
            for g, k, m, expected, paper in rows
        ]
    )
    if pairs is None:
        pairs = list(itertools.combinations(results.sparsities, 2))
    spearman_rows, heatmaps = [], {}
    for a, b in pairs:
        ga, gb = group_name(a), group_name(b)
        if ga not in groups or gb not in groups:
            raise ConfigError(
                f"cannot compare sparsities {a} and {b}: the sweep has {list(groups)}"
            )
        rho, p = frequency_spearman(head_frequency(groups[ga]), head_frequency(groups[gb]))
        heatmaps[(ga, gb)] = frequency_heatmap(groups[ga], groups[gb])
        spearman_rows.append(
            {
                "sparsity_a": float(a),
                "sparsity_b": float(b),
                "spearman_rho": rho,
                "p_value": p,
                "n_core_a": len(cores[ga]),
                "n_core_b": len(cores[gb]),
                "n_core_both": len(set(cores[ga]) & set(cores[gb])),
            }
        )
    spearman = pd.DataFrame(
        spearman_rows,
        columns=[
            "sparsity_a",
            "sparsity_b",
            "spearman_rho",
            "p_value",
            "n_core_a",
            "n_core_b",
            "n_core_both",
        ],
    )
    return SubnetworkComparison(frequency, cores, core_table, spearman, heatmaps)


def heatmap_frame(counts: Tensor, group_a: str, group_b: str) -> pd.DataFrame:
    """A Figure 5 count matrix as a table: rows ``kept_at_<a>`` = i, a column per j."""
    z = counts.cpu().numpy()
    frame = pd.DataFrame(z, columns=[f"kept_at_{group_b}={j}" for j in range(z.shape[1])])
    frame.insert(0, f"kept_at_{group_a}", range(z.shape[0]))
    return frame


def write_comparison(
    results: SweepResults, comparison: SubnetworkComparison, out: str | os.PathLike[str]
) -> dict[str, Path]:
    """Write ``subnetworks.csv``, ``head_frequency.csv``, ``core_heads.csv`` (one row per head
    of a core), ``core_summary.csv``, ``spearman.csv`` and ``heatmap_<a>_vs_<b>.csv``."""
    out = Path(out)
    paths = {
        "subnetworks": write_csv(out / "subnetworks.csv", results.runs),
        "head_frequency": write_csv(out / "head_frequency.csv", comparison.frequency),
        "core_heads": write_csv(out / "core_heads.csv", comparison.core_heads_table()),
        "core_summary": write_csv(out / "core_summary.csv", comparison.core_table),
        "spearman": write_csv(out / "spearman.csv", comparison.spearman),
    }
    for (a, b), counts in comparison.heatmaps.items():
        paths[f"heatmap_{a}_vs_{b}"] = write_csv(
            out / f"heatmap_{a}_vs_{b}.csv", heatmap_frame(counts, a, b)
        )
    return paths
