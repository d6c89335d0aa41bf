"""Read a finished pruning sweep from disk and compare its subnetworks (paper section 4).

A sweep directory (``mi-core sweep``, :func:`mi_core.pruning.sweeps.run_sweep`) holds one run per
(sparsity, seed) in ``SWEEP/s{sparsity}/seed{seed}/`` with ``mask.safetensors`` (or
``mask.json``) and ``metrics.json``. :func:`load_sweep` gathers every finished run;
:func:`compare_subnetworks` computes, with :mod:`mi_core.analysis.subnetworks`, the per-sparsity
head frequencies, the heads every subnetwork keeps (per sparsity and across all: the heuristic
core), the chance level of such an intersection, Spearman's rho between the frequencies of every
two sparsities and the Figure 5 heatmaps; :func:`write_comparison` saves it all as CSV.
"""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import torch
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
from mi_core.io import write_csv
from mi_core.pruning.sweeps import SweepResult, group_name

__all__ = ["COMPARISON_FILES", "SubnetworkComparison", "compare_subnetworks", "write_comparison"]

#: The files :func:`write_comparison` writes and :meth:`SubnetworkComparison.load` reads, by
#: role (plus one ``heatmap_<a>_vs_<b>.csv`` per pair of sparsities).
COMPARISON_FILES = {
    "subnetworks": "subnetworks.csv",
    "head_frequency": "head_frequency.csv",
    "core_heads": "core_heads.csv",
    "core_summary": "core_summary.csv",
    "spearman": "spearman.csv",
}
_HEATMAP = re.compile(r"^heatmap_(.+)_vs_(.+)\.csv$")


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

    @classmethod
    def load(cls, folder: str | os.PathLike[str]) -> SubnetworkComparison:
        """Read a comparison back from the folder :func:`write_comparison` wrote."""
        folder = Path(folder)
        paths = {role: folder / name for role, name in COMPARISON_FILES.items()}
        missing = [p.name for p in paths.values() if not p.is_file()]
        if missing:
            raise ConfigError(f"{folder} holds no comparison of subnetworks (missing {missing})")
        core_table = pd.read_csv(paths["core_summary"], keep_default_na=False)
        core_table["group"] = core_table["group"].astype(str)
        cores = {
            row.group: str(row.core_heads).split() for row in core_table.itertuples(index=False)
        }
        heatmaps = {}
        for path in sorted(folder.glob("heatmap_*_vs_*.csv")):
            a, b = _HEATMAP.match(path.name).groups()
            frame = pd.read_csv(path)
            heatmaps[(a, b)] = torch.tensor(frame.iloc[:, 1:].to_numpy())
        return cls(
            frequency=pd.read_csv(paths["head_frequency"]),
            cores=cores,
            core_table=core_table,
            spearman=pd.read_csv(paths["spearman"]),
            heatmaps=heatmaps,
        )

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
    results: SweepResult, pairs: Sequence[tuple[float, float]] | None = None
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
    results: SweepResult, comparison: SubnetworkComparison, out: str | os.PathLike[str]
) -> dict[str, Path]:
    """Write ``subnetworks.csv``, ``head_frequency.csv``, ``core_heads.csv`` (one row per head
    of a core), ``core_summary.csv``, ``spearman.csv`` and ``heatmap_<a>_vs_<b>.csv``."""
    out = Path(out)
    tables = {
        "subnetworks": results.runs,
        "head_frequency": comparison.frequency,
        "core_heads": comparison.core_heads_table(),
        "core_summary": comparison.core_table,
        "spearman": comparison.spearman,
    }
    paths = {role: write_csv(out / COMPARISON_FILES[role], t) for role, t in tables.items()}
    for (a, b), counts in comparison.heatmaps.items():
        paths[f"heatmap_{a}_vs_{b}"] = write_csv(
            out / f"heatmap_{a}_vs_{b}.csv", heatmap_frame(counts, a, b)
        )
    return paths
