"""Edges into and out of the core heads (circuits), in subnetworks that generalise and that do not.

The sweep's subnetworks are ranked by their mean accuracy over the out-of-domain sets; for the
``per_group`` best ("generalising") and worst ("not generalising"), each applied to the model
(mean-ablated), every edge is scored by edge attribution on circuit pairs (HANS minimal pairs)
and the edges touching the chosen heads are kept. Per subnetwork the circuit's full metric and
its empty circuit's are measured too, so the report can say when the fill does not move a
subnetwork at all (then its edge scores describe noise). With the ``mean`` fill a removed edge
carries its sender's mean output over training pairs, taken with the subnetwork applied.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING

import pandas as pd

from mi_core.circuits import (
    Graph,
    attribute,
    circuit_baselines,
    edges_touching,
    gap_is_small,
    sender_means,
)
from mi_core.circuits.job import load_circuit_pairs, pair_forward_batches
from mi_core.interventions import ComponentMeans, Subnetwork, apply
from mi_core.methods.heuristic_core.config import CoreEdgesSettings

if TYPE_CHECKING:
    from mi_core.models.types import HookedModel
    from mi_core.pruning.sweeps import SweepResult

__all__ = ["choose_subnetworks", "run_core_edges"]


def choose_subnetworks(
    runs: pd.DataFrame, ood: Sequence[str], per_group: int
) -> tuple[pd.DataFrame, list[tuple[int, str]]]:
    """``runs`` (a sweep's, in order) with their ``ood_accuracy`` (the mean over the columns
    ``acc_<name>`` of ``ood``), and the rows chosen: ``(row, "generalising")`` for the
    ``per_group`` best, then ``(row, "not generalising")`` for as many of the worst that are
    not among the best (ties keep the sweep's order)."""
    runs = runs.assign(ood_accuracy=runs[[f"acc_{n}" for n in ood]].mean(axis=1)).reset_index(
        drop=True
    )
    order = runs.sort_values("ood_accuracy", ascending=False, kind="stable").index.tolist()
    best = order[:per_group]
    chosen = [(i, "generalising") for i in best]
    chosen += [(i, "not generalising") for i in order[::-1][:per_group] if i not in best]
    return runs, chosen


def run_core_edges(
    model: HookedModel,
    sweep: SweepResult,
    means: ComponentMeans,
    heads: Sequence[str],
    settings: CoreEdgesSettings,
    *,
    ood_names: Collection[str],
    heads_chosen_as: str,
    mean_data: str,
    max_length: int = 128,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The edges touching ``heads`` in the chosen subnetworks of ``sweep`` (see the module
    docstring), as ``(edges, summary)``.

    ``edges``: one row per edge and subnetwork (``subnetwork, group, ood_accuracy,
    heads_chosen_as`` and :func:`~mi_core.circuits.edges_touching`'s columns); ``summary``: per
    subnetwork and direction, the sum of ``|score|`` with the subnetwork's full and empty
    metric (``full, empty, gap_se, small_gap``). ``means`` mean-ablate the subnetworks;
    ``ood_names`` are the out-of-domain sets by name (none among the sweep's: every set);
    ``mean_data`` the pair data (``max_length`` tokens) the ``mean`` fill averages over.
    """
    e = settings
    ood = [n for n in sweep.eval_names if n in ood_names] or sweep.eval_names
    runs, chosen = choose_subnetworks(sweep.runs, ood, e.per_group)
    pairs = load_circuit_pairs(model, e.data, max(2, e.n_examples))
    pairs = pairs.to(next(model.parameters()).device)
    graph = Graph.from_model(model)
    mean_batches = []  # the training pairs the means are taken over, tokenised once
    if e.fill == "mean":
        mean_batches = pair_forward_batches(model, mean_data, e.mean_examples, e.batch_size,
                                            max_length)  # fmt: skip
    tables, gaps = [], []
    for index, group in chosen:
        row = runs.iloc[index]
        subnetwork = Subnetwork(sweep.masks[index], "mean", means)
        with apply(model, subnetwork):
            # each subnetwork's own means: the masked model's senders
            fill_means = sender_means(model, graph, mean_batches) if mean_batches else None
            scores = attribute(model, pairs, e.method, steps=e.steps, batch_size=e.batch_size,
                               fill=e.fill, means=fill_means, progress=False,
                               ig_rule=e.ig_rule)  # fmt: skip
            full, empty, se = circuit_baselines(model, graph, e.fill, fill_means, pairs,
                                                batch_size=e.batch_size)  # fmt: skip
        gaps.append({"subnetwork": row["subnetwork"], "fill": e.fill, "full": full,
                     "empty": empty, "gap_se": se,
                     "small_gap": gap_is_small(full, empty, se)})  # fmt: skip
        table = edges_touching(scores, heads)
        table.insert(0, "ood_accuracy", float(row["ood_accuracy"]))
        table.insert(0, "group", group)
        table.insert(0, "subnetwork", row["subnetwork"])
        tables.append(table)
    edges = pd.concat(tables, ignore_index=True)
    edges.insert(3, "heads_chosen_as", heads_chosen_as)
    summary = (
        edges.assign(abs_score=edges["score"].abs())
        .groupby(["subnetwork", "group", "ood_accuracy", "direction"], sort=False)["abs_score"]
        .sum()
        .reset_index()
        .merge(pd.DataFrame(gaps), on="subnetwork", how="left")
    )
    return edges, summary
