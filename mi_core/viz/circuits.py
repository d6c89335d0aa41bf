"""Circuits as pictures: the edge graph (interactive, offline) and faithfulness curves.

:func:`circuit_graph_figure` lays the graph out by layer (input at the bottom, each layer's
heads in a row, its MLP in a column of its own to the right, the output at the top) and draws
the circuit's edges, wider for larger ``|score|``, blue where removing the edge lowers the
metric and red where it raises it; hovering an edge or a node names it. Edges into a head's
query, key or value input end at the head and are dotted, dashed or solid respectively.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any

import plotly.graph_objects as go
import torch

from mi_core.interventions.edges import EdgeMask, Graph

__all__ = ["circuit_graph_figure", "circuit_graph_html", "faithfulness_figure"]

_DASH = {"q": "dot", "k": "dash", "v": "solid", "": "solid"}


def _node_xy(graph: Graph) -> dict[str, tuple[float, float]]:
    spread = max(graph.n_heads - 1, 1)
    xy = {"input": (spread / 2, -1.0), "output": (spread / 2, 2.0 * graph.n_layers)}
    for layer in range(graph.n_layers):
        for head in range(graph.n_heads):
            xy[graph.senders[graph.head_sender(layer, head)]] = (float(head), 2.0 * layer)
        xy[graph.senders[graph.mlp_sender(layer)]] = (graph.n_heads + 0.5, 2.0 * layer + 1)
    return xy


#: How far an edge bows out of the straight line, as a fraction of its length: edges between
#: nodes in one column (a head's index in two layers, MLP to MLP) would otherwise lie on top
#: of each other; bowed by length, each layer gap gets its own arc.
_BOW = 0.12
_CURVE_POINTS = 9
#: The largest upward offset of a near-horizontal edge's control point (half of it at the
#: curve's middle): less than a layer's height.
_FLAT_BOW = 1.2


def _curve(
    start: tuple[float, float], end: tuple[float, float]
) -> tuple[list[float], list[float], tuple[float, float]]:
    """An edge drawn as a quadratic Bezier curve bowed to the right of its direction: the
    points' x, y and the curve's midpoint (where its hover marker goes)."""
    (x0, y0), (x1, y1) = start, end
    dx, dy = x1 - x0, y1 - y0
    ox, oy = _BOW * dy * 2, -_BOW * dx * 2  # the control point's offset from the midpoint
    if abs(dx) > abs(dy):
        # a near-horizontal edge (a head into its own layer's MLP) bows up, a little, away
        # from the row of heads it starts in, instead of running through its neighbours
        ox, oy = 0.0, min(abs(oy), _FLAT_BOW)
    cx, cy = (x0 + x1) / 2 + ox, (y0 + y1) / 2 + oy  # control point
    ts = [i / (_CURVE_POINTS - 1) for i in range(_CURVE_POINTS)]
    xs = [(1 - t) ** 2 * x0 + 2 * (1 - t) * t * cx + t**2 * x1 for t in ts]
    ys = [(1 - t) ** 2 * y0 + 2 * (1 - t) * t * cy + t**2 * y1 for t in ts]
    return xs, ys, (xs[_CURVE_POINTS // 2], ys[_CURVE_POINTS // 2])


def circuit_graph_figure(
    graph: Graph,
    scores: torch.Tensor,
    circuit: EdgeMask | None = None,
    max_edges: int = 400,
    title: str | None = None,
    gates: bool = False,
) -> go.Figure:
    """The circuit's edges (at most ``max_edges``, the largest ``|score|`` first) on the graph.
    ``gates``: ``scores`` are edge-pruning gates (log_alpha), which say kept or not and no
    direction: one colour and one width, the gate in the hover text."""
    kept = circuit.weights > 0.5 if circuit is not None else torch.ones(graph.n_edges, dtype=bool)
    index = kept.nonzero().flatten()
    order = torch.argsort(scores[index].abs(), descending=True, stable=True)[:max_edges]
    chosen = index[order].tolist()
    xy = _node_xy(graph)
    top = float(scores[chosen].abs().max()) if chosen else 1.0
    fig = go.Figure()
    used: set[str] = set()
    mids_x, mids_y, mids_text = [], [], []
    # one trace per (sign, input kind, width bin): few traces, so large circuits stay fast
    groups: dict[tuple[bool, str, int], tuple[list, list]] = {}
    for edge in chosen:
        name = graph.edge_names[edge]
        sender, receiver = name.split("->")
        kind = receiver.rsplit(".", 1)[1] if receiver.endswith((".q", ".k", ".v")) else ""
        node = receiver[:-2] if kind else receiver
        used.update((sender, node))
        curve_x, curve_y, (mid_x, mid_y) = _curve(xy[sender], xy[node])
        value = float(scores[edge])
        width_bin = 2 if gates else (min(3, int(4 * abs(value) / top)) if top > 0 else 0)
        xs, ys = groups.setdefault((value < 0 and not gates, kind, width_bin), ([], []))
        xs += [*curve_x, None]
        ys += [*curve_y, None]
        mids_x.append(mid_x)
        mids_y.append(mid_y)
        mids_text.append(f"{name}<br>{'gate log_alpha' if gates else 'score'} {value:+.4g}")
    for (negative, kind, width_bin), (xs, ys) in sorted(groups.items()):
        fig.add_trace(
            go.Scatter(
                x=xs, y=ys, mode="lines", hoverinfo="skip", showlegend=False,
                line={"width": 0.6 + 1.6 * width_bin, "dash": _DASH[kind],
                      "color": "rgba(44,160,44,0.6)" if gates
                      else "rgba(31,119,180,0.6)" if negative else "rgba(214,39,40,0.6)"},
            )
        )  # fmt: skip
    fig.add_trace(
        go.Scatter(
            x=mids_x, y=mids_y, mode="markers", text=mids_text, hoverinfo="text",
            marker={"size": 6, "opacity": 0.0}, showlegend=False, name="edges",
        )
    )  # fmt: skip
    names = list(xy)
    fig.add_trace(
        go.Scatter(
            x=[xy[n][0] for n in names],
            y=[xy[n][1] for n in names],
            mode="markers+text",
            text=[n if n in used and ("H" not in n or graph.n_heads <= 12) else "" for n in names],
            textposition="middle right",
            textfont={"size": 9},
            hovertext=names,
            hoverinfo="text",
            marker={
                "size": [11 if n in used else 6 for n in names],
                "color": ["#333" if n in used else "#ccc" for n in names],
                "symbol": ["square" if n.endswith("MLP") else "circle" for n in names],
            },
            showlegend=False,
            name="nodes",
        )
    )
    shown = len(chosen)
    total = int(kept.sum())
    count = f"{shown} of {total} kept edges shown ({graph.n_edges} in the graph)"
    if title and shown < total:  # a caller's title still says that edges are left out
        title = f"{title}<br><sup>{count}: the {shown} largest |score|</sup>"
    fig.update_layout(
        title=title or f"Circuit: {count}",
        xaxis={"visible": False},
        yaxis={
            "title": "layer",
            "tickvals": [-1, *[2 * l for l in range(graph.n_layers)], 2 * graph.n_layers],
            "ticktext": ["input", *[f"L{l}" for l in range(graph.n_layers)], "output"],
        },
        height=max(650, 80 * graph.n_layers + 250),  # a layer's heads, MLP and edges legible
        width=1100,
        plot_bgcolor="white",
    )
    return fig


def circuit_graph_html(
    graph: Graph,
    scores: torch.Tensor,
    circuit: EdgeMask | None = None,
    title: str = "circuit",
    max_edges: int = 400,
    gates: bool = False,
    curve: Sequence[Any] | None = None,
) -> str:
    """A standalone offline HTML page (plotly.js inlined) with the circuit graph and a key
    (``gates``: ``scores`` are edge-pruning log_alpha; see :func:`circuit_graph_figure`), and
    below it the faithfulness ``curve`` (:class:`~mi_core.circuits.CircuitScore` rows) with
    its error bars, when given."""
    fig = circuit_graph_figure(graph, scores, circuit, max_edges, title=title, gates=gates)
    body = fig.to_html(include_plotlyjs=True, full_html=False)
    if curve:
        body += faithfulness_figure({"top-k circuits": curve}).to_html(
            include_plotlyjs=False, full_html=False
        )
    meaning = (
        "Edges kept by edge pruning (a gate says kept or not, not a direction)"
        if gates
        else "Edge width: |score|. Blue: removing the edge lowers the metric; red: raises it"
    )
    key = (
        f"<p>{meaning}. Into a head: dotted = query, dashed = key, solid = value input. Hover "
        "an edge for its name and value, a node for its name.</p>"
    )
    return (
        f"<!DOCTYPE html>\n<html>\n<head>\n<meta charset='utf-8'>\n<title>{html.escape(title)}"
        f"</title>\n</head>\n<body>\n<h2>{html.escape(title)}</h2>\n{key}\n{body}\n</body>\n"
        "</html>\n"
    )


def faithfulness_figure(
    curves: Mapping[str, Sequence[Any]], title: str = "Faithfulness against circuit size"
) -> go.Figure:
    """One line per method: faithfulness of its top-k circuits against the fraction of edges
    kept (log axis), with error bars of one standard error (``faithfulness_se``, from the
    held-out examples), and the full model (1) and the empty circuit (0) marked."""
    fig = go.Figure()
    for name, rows in curves.items():
        rows = sorted((r for r in rows if r.fraction > 0), key=lambda r: r.fraction)
        errors = [getattr(r, "faithfulness_se", float("nan")) for r in rows]
        fig.add_trace(
            go.Scatter(
                x=[r.fraction for r in rows],
                y=[r.faithfulness for r in rows],
                error_y={"type": "data", "array": errors, "visible": True},
                mode="lines+markers",
                name=name,
                hovertext=[
                    f"{r.n_edges} edges, KL {r.kl:.3g}, standard error {e:.3g}"
                    for r, e in zip(rows, errors, strict=True)
                ],
            )
        )
    for level, label in ((1.0, "full model"), (0.0, "empty circuit")):
        fig.add_hline(y=level, line_dash="dot", line_color="grey", annotation_text=label)
    fig.update_layout(
        title=title,
        xaxis={"title": "fraction of edges kept", "type": "log"},
        yaxis={"title": "faithfulness (fraction of the metric recovered)"},
        width=900,
        height=500,
    )
    return fig
