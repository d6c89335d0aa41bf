"""Reading circuits: edges that touch a set of heads, and how much two circuits share."""

from __future__ import annotations

from collections.abc import Iterable

import pandas as pd

from mi_core.circuits.attribution import EdgeScores
from mi_core.errors import InterventionError
from mi_core.interventions.edges import EdgeMask

__all__ = ["circuit_overlap", "edges_touching"]


def _node(name: str) -> str:
    """The node of a sender or receiver name (``L2.H5.q`` -> ``L2.H5``)."""
    return name[:-2] if name.endswith((".q", ".k", ".v")) else name


def edges_touching(
    scores: EdgeScores, nodes: Iterable[str], top: int | None = None
) -> pd.DataFrame:
    """Every edge into or out of ``nodes`` (e.g. the heuristic core's heads), largest ``|score|``
    first: ``edge``, ``sender``, ``receiver``, ``direction`` (``into``, ``out of`` or
    ``within``) and ``score``."""
    wanted = set(nodes)
    known = set(scores.graph.senders) | {"output"}
    unknown = sorted(wanted - known)
    if unknown:
        raise InterventionError(f"no node {unknown[0]!r} in {scores.graph}")
    rows = []
    for i, name in enumerate(scores.graph.edge_names):
        sender, receiver = name.split("->")
        into, out = _node(receiver) in wanted, sender in wanted
        if into or out:
            direction = "within" if into and out else ("into" if into else "out of")
            rows.append((name, sender, receiver, direction, float(scores.scores[i])))
    frame = pd.DataFrame(rows, columns=["edge", "sender", "receiver", "direction", "score"])
    frame = frame.reindex(frame["score"].abs().sort_values(ascending=False).index)
    return frame.reset_index(drop=True).head(top) if top else frame.reset_index(drop=True)


def circuit_overlap(a: EdgeMask, b: EdgeMask) -> dict[str, float]:
    """Edges kept by both circuits, by either, and their Jaccard index."""
    if a.graph != b.graph:
        raise InterventionError(f"the circuits are of different graphs ({a.graph} vs {b.graph})")
    kept_a, kept_b = a.weights > 0.5, b.weights > 0.5
    both, either = int((kept_a & kept_b).sum()), int((kept_a | kept_b).sum())
    return {
        "a": int(kept_a.sum()),
        "b": int(kept_b.sum()),
        "shared": both,
        "jaccard": both / either if either else float("nan"),
        "expected_shared_at_random": float(kept_a.sum() * kept_b.sum() / a.graph.n_edges),
    }
