"""The core's ablation table (paper Tables 3/4): each core head, and head sets, removed at once.

Glue over :func:`mi_core.interventions.ablation_table.ablation_table`: the joint sets of a
config (``"core"``: every chosen head at once; ``"top3"``: the three heads whose single
ablation changes the out-of-domain accuracy most; or explicit lists of head labels) are
resolved, the table is built and saved under ``out`` as ``ablation_table.csv`` (accuracy,
change and std per data set, in percent), ``ablation_display.csv`` (the paper's layout),
``ablation_table.md`` and a one-line ``note.md``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mi_core.data import PairDataset
from mi_core.errors import ConfigError
from mi_core.interventions import Component
from mi_core.interventions.ablation_table import AblationTable, ablation_table, head_set_name
from mi_core.io import write_csv, write_json, write_text
from mi_core.methods.heuristic_core.layout import ABLATION_FILES

if TYPE_CHECKING:
    from mi_core.models.types import HookedModel

__all__ = ["resolve_joint_sets", "run_core_ablation", "top_heads_by_drop"]

_WHY = {
    "core": "the heads every subnetwork keeps (the core)",
    "most frequent": "the most frequently kept heads (no head is in every subnetwork)",
    "config": "the heads named in the config",
}


def top_heads_by_drop(single_drops: dict[str, float], k: int = 3) -> list[str]:
    """The ``k`` heads with the largest effect, ``|drop|`` (the paper's top heads all lower the
    accuracy; a head whose removal raises it matters as much), ties by layer, then head."""
    ranked = sorted(single_drops.items(), key=lambda kv: (-abs(kv[1]), Component.parse(kv[0])))
    return [label for label, _ in ranked[:k]]


def resolve_joint_sets(
    entries: Sequence[Any], heads: Sequence[str], single_drops: dict[str, float] | None = None
) -> list[tuple[str, ...]]:
    """Head sets from config entries, in order, without duplicates or single heads:
    ``"core"`` -> all ``heads``; ``"top3"`` -> :func:`top_heads_by_drop`; lists as given."""
    sets: list[tuple[str, ...]] = []
    for entry in entries:
        if entry == "core":
            chosen = list(heads)
        elif entry == "top3":
            if single_drops is None:
                raise ConfigError("'top3' needs the single-head ablations first")
            chosen = top_heads_by_drop(single_drops, 3)
        else:
            chosen = [str(Component.parse(h)) for h in entry]
        key = tuple(sorted(set(chosen), key=Component.parse))
        if len(key) >= 2 and key not in sets:
            sets.append(key)
    return sets


def _components(labels: Sequence[str]) -> tuple[Component, ...]:
    return tuple(Component.parse(h) for h in labels)


def run_core_ablation(
    model: HookedModel,
    datasets: Sequence[PairDataset],
    heads: Sequence[str],
    joint_sets: Sequence[Any] = ("core", "top3"),
    *,
    means: Any = None,
    fill: str = "mean",
    others: bool = True,
    batch_size: int = 64,
    out: str | os.PathLike[str] | None = None,
    heads_chosen_as: str = "core",
    progress: bool = False,
) -> AblationTable:
    """The ablation table of ``heads`` on ``datasets`` (in-domain first) with the joint rows of
    ``joint_sets``, and (``others``) the average over every other head; written to ``out``.

    ``"top3"`` ranks the heads by the size of their mean single-ablation drop over the
    out-of-domain sets (the in-domain set when there is no other), so its joint row is computed
    in a second pass.
    """
    if not heads:
        raise ConfigError("no heads to ablate")
    run = dict(means=means, fill=fill, batch_size=batch_size, progress=progress)
    fixed = [e for e in joint_sets if e != "top3"]
    first_joints = resolve_joint_sets(fixed, heads)
    table = ablation_table(
        model,
        datasets,
        list(_components(heads)),
        [_components(s) for s in first_joints],
        others=others,
        **run,
    )
    if "top3" in joint_sets:
        ood = table.datasets[1:] or table.datasets[:1]
        drops = {
            str(c): sum(table.drop(table.singles[c])[d] for d in ood) / len(ood)
            for c in _components(heads)
        }
        wanted = resolve_joint_sets(joint_sets, heads, drops)
        missing = [_components(s) for s in wanted if _components(s) not in table.joints]
        if missing:
            extra = ablation_table(model, datasets, [], missing, others=False, **run)
            table.joints.update(extra.joints)
            table.joints = {_components(s): table.joints[_components(s)] for s in wanted}
    if out is not None:
        out = Path(out)
        write_csv(out / ABLATION_FILES["table"], table.frame())
        write_csv(out / ABLATION_FILES["display"], table.display_frame())
        write_text(out / ABLATION_FILES["markdown"], table.markdown())
        write_json(out / ABLATION_FILES["examples"], table.n_examples)
        joints = "; ".join(head_set_name(s) for s in table.joints) or "none"
        write_text(
            out / ABLATION_FILES["note"],
            f"Ablated heads: {_WHY.get(heads_chosen_as, heads_chosen_as)}. Fill: {fill}. "
            f"Joint sets: {joints}.\n",
        )
    return table
