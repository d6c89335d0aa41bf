"""Plotly figures of separability runs: pruning trajectories and score distributions per layer."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from mi_core.analysis.trajectory import trajectory_areas, trajectory_axes
from mi_core.viz.page import PAGE_WIDTH

#: The trajectory figure fills a report page's width: three panels a row, the legend beside them.
FIGURE_WIDTH = PAGE_WIDTH
PANELS_PER_ROW = 3
#: The metrics plotted by default: the report's four accuracies and the loss.
PLOTTED_METRICS: tuple[str, ...] = ("top1", "top10", "skip50_top1", "skip50_top10", "loss")


def trajectory_figure(
    trajectory: pd.DataFrame,
    mode: str = "cripple",
    metrics: Sequence[str] = PLOTTED_METRICS,
    focus_name: str = "focus",
    cripple_name: str = "cripple",
) -> go.Figure:
    """One panel per metric: relative performance on the two data sets, one line per method.

    ``trajectory`` has ``method`` and ``step`` columns and ``focus_*``/``cripple_*`` metric
    columns (a separability run's ``trajectory``). The x axis is the specific task for
    ``mode`` (cripple data set in ``"cripple"`` mode, focus in ``"focus"``); the dashed
    diagonal is no separation. Relative: a metric over the unpruned model's (a loss as
    ``exp(loss_0 - loss)``, a perplexity ratio), so 1 is the unpruned model; the subtitle
    says so. One colour per metric and one line style per method, so each legend entry (a
    method's area on a metric) names one line; the legs that close the area to (1, 1) and
    (0, 0) are dotted, with their own legend entry.
    """
    x_name, y_name = (cripple_name, focus_name) if mode == "cripple" else (focus_name, cripple_name)
    columns = min(len(metrics), PANELS_PER_ROW)
    rows = -(-len(metrics) // columns)
    fig = make_subplots(
        rows=rows,
        cols=columns,
        subplot_titles=list(metrics),
        horizontal_spacing=0.06,
        vertical_spacing=0.16,
    )
    colours = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#7f7f7f"]
    styles = ["solid", "dash", "longdash", "dashdot"]
    fig.add_trace(  # the legend's key to the dotted legs, drawn once
        go.Scatter(x=[None], y=[None], mode="lines", name="closing legs of the area (dotted)",
                   line=dict(color="grey", dash="dot", width=1)),
        row=1, col=1,
    )  # fmt: skip
    for index, metric in enumerate(metrics):
        colour = colours[index % len(colours)]
        row, col = divmod(index, columns)
        row, col = row + 1, col + 1
        fig.add_trace(
            go.Scatter(
                x=[0, 1],
                y=[0, 1],
                mode="lines",
                line=dict(dash="dash", color="black", width=1),
                name="no separation",
                showlegend=index == 0,
                legendgroup="diag",
            ),
            row=row,
            col=col,
        )
        drawn = False
        for i, (method, frame) in enumerate(trajectory.groupby("method", sort=False)):
            x, y = trajectory_axes(frame, metric, mode)
            drawn = drawn or bool(np.isfinite(np.asarray(x, dtype=float)).any())
            area = trajectory_areas(frame, mode, [metric])[metric]["area"]
            steps = frame.sort_values("step")["step"].tolist()
            fig.add_trace(
                go.Scatter(
                    x=x,
                    y=y,
                    mode="lines+markers",
                    name=f"{method}: {metric} area {area:.2f}",
                    legendgroup=str(method),
                    legendgrouptitle_text=str(method),
                    line=dict(color=colour, dash=styles[i % len(styles)]),
                    text=[f"step {s}" for s in steps],
                    hovertemplate="%{text}: (%{x:.3f}, %{y:.3f})",
                ),
                row=row,
                col=col,
            )
            # the area closes the path from (1, 1) and to (0, 0): draw those legs, dotted
            xs, ys = [float(v) for v in x], [float(v) for v in y]
            if xs:
                fig.add_trace(
                    go.Scatter(
                        x=[1.0, xs[0], None, xs[-1], 0.0],
                        y=[1.0, ys[0], None, ys[-1], 0.0],
                        mode="lines",
                        line=dict(color=colour, dash="dot", width=1),
                        showlegend=False,
                        legendgroup=str(method),
                        hoverinfo="skip",
                        name=f"{method}: closing legs of the area",
                    ),
                    row=row,
                    col=col,
                )
        if not drawn:  # e.g. an unpruned model whose top-1 is 0: nothing to be relative to
            fig.add_annotation(
                text=f"no trajectory: the unpruned model's {metric}<br>is 0 or undefined",
                x=0.5, y=0.5, showarrow=False, row=row, col=col,
            )  # fmt: skip
        fig.update_xaxes(title_text=f"{x_name} (relative)", range=[0, 1.05], row=row, col=col)
        fig.update_yaxes(
            title_text=f"{y_name} (relative)" if col == 1 else None,
            range=[0, 1.05],
            row=row,
            col=col,
        )
    fig.update_layout(
        title=f"Pruning trajectories ({mode} mode: {cripple_name} cripple, {focus_name} focus)"
        "<br><sup>relative: each metric over the unpruned model's (a loss as exp(loss_0 - loss),"
        " a perplexity ratio); 1 = unpruned</sup>",
        height=360 * rows + 80,
        width=FIGURE_WIDTH,
    )
    return fig


def score_distribution_figure(
    scores: torch.Tensor,
    title: str = "scores",
    bins: int = 60,
    value_range: tuple[float, float] | None = None,
    difference: bool = False,
) -> go.Figure:
    """Per-layer histograms of log10 scores as a heatmap (layer x log10 ratio), as in the report.

    ``scores`` has a leading layer axis (``[n_layers, ...]``); 0 means equal use by both data
    sets, +1 a neuron used 10x as much on the cripple data set. Negative ratios (possible with the
    signed ``mean`` statistic) are plotted by their magnitude. ``difference``: the scores are
    ``|cripple - focus|`` (``mean_diff``), not ratios: the axis says so and has no "equal use"
    line. Scores of exactly 0 (neurons the cripple set never uses) and infinite or undefined
    ones have no log10: they are counted in the title, not drawn.
    """
    flat = scores.double().abs().reshape(scores.shape[0], -1)
    zeros = int((flat == 0).sum())
    logs = torch.log10(flat.masked_fill(flat == 0, float("nan")))
    finite = logs[torch.isfinite(logs)]
    left_out = int(flat.numel() - zeros - finite.numel())
    notes = [f"{zeros} scores of 0"] if zeros else []
    notes += [f"{left_out} infinite or undefined"] if left_out else []
    if notes:
        title = f"{title}<br><sup>not shown: {', '.join(notes)}</sup>"
    if value_range is None:
        lo, hi = (float(finite.min()), float(finite.max())) if finite.numel() else (-1.0, 1.0)
        if hi - lo < 1e-6:
            lo, hi = lo - 0.5, hi + 0.5
        value_range = (lo, hi)
    edges = np.linspace(value_range[0], value_range[1], bins + 1)
    counts = np.stack(
        [np.histogram(layer[torch.isfinite(layer)].numpy(), bins=edges)[0] for layer in logs]
    )
    fractions = counts / np.maximum(counts.sum(axis=1, keepdims=True), 1)
    centres = (edges[:-1] + edges[1:]) / 2
    fig = go.Figure(
        go.Heatmap(
            z=fractions,
            x=centres,
            y=list(range(scores.shape[0])),
            colorscale="Viridis",
            colorbar=dict(title="fraction of layer"),
            hovertemplate="layer %{y}, log10 score %{x:.2f}: %{z:.3f}<extra></extra>",
        )
    )
    if not difference:
        fig.add_vline(x=0.0, line=dict(color="white", dash="dash", width=1))
    fig.update_layout(
        title=dict(text=title, font=dict(size=13)),
        xaxis_title="log10 |cripple - focus|" if difference else "log10(cripple / focus)",
        yaxis_title="layer",
        height=max(320, 18 * scores.shape[0] + 140),
        width=960,
    )
    return fig
