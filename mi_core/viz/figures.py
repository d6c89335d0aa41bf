"""Plotly figures for the paper's plots. Each function takes tidy data and returns a
``plotly.graph_objects.Figure``; :func:`write_figure_html` saves one as standalone HTML (plotly.js
embedded by default, so it opens offline).

=========================================  =================================================
:func:`id_vs_ood_scatter`                  Figure 2: ID vs OOD accuracy, one dot per subnetwork
:func:`subcase_bars`                       Figure 3: per-subcase accuracy per subnetwork
:func:`accuracy_vs_sparsity`               Figure 4: mean +- std over seeds vs sparsity
:func:`frequency_heatmap_figure`           Figure 5: head-frequency heatmap
:func:`effective_size_over_training`       Figure 6: accuracy and effective size over steps
:func:`attention_class_chart`              Figure 9: attention-class masses of chosen heads
:func:`training_dynamics`                  ID vs OOD accuracy over fine-tuning steps
:func:`pruning_dynamics`                   pruning runs' sparsity and subnetwork accuracy
:func:`circuit_stability_figure`           bootstrap Jaccard of circuits at each size
=========================================  =================================================
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import plotly.express as px
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from mi_core.errors import ConfigError
from mi_core.io import write_text

__all__ = [
    "id_vs_ood_scatter",
    "subcase_bars",
    "accuracy_vs_sparsity",
    "frequency_heatmap_figure",
    "effective_size_over_training",
    "attention_class_chart",
    "training_dynamics",
    "pruning_dynamics",
    "write_figure_html",
    "add_chance_lines",
    "with_n",
]


def _need(frame: pd.DataFrame, columns: Sequence[str], what: str) -> None:
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise ConfigError(f"{what}: missing columns {missing}; have {list(frame.columns)}")


def _step_col(frame: pd.DataFrame, step_col: str | None) -> str:
    if step_col:
        return step_col
    for name in ("step", "checkpoint"):
        if name in frame.columns:
            return name
    raise ConfigError(f"need a 'step' or 'checkpoint' column; have {list(frame.columns)}")


#: Per data set, a number (the same for every data set) or nothing.
PerSet = Mapping[str, float] | float | None


def _per_set(values: PerSet, name: str) -> float | None:
    if values is None:
        return None
    if isinstance(values, Mapping):
        value = values.get(name)
        return None if value is None else float(value)
    return float(values)


def with_n(name: str, n: Mapping[str, int] | int | None) -> str:
    """``name (n=300)``: a data set's name with its number of examples, when known."""
    count = _per_set(n, name)
    return str(name) if count is None else f"{name} (n={int(count):,})"


def _chance_text(value: float) -> str:
    k = round(1 / value) if value > 0 else 0
    return f"chance 1/{k}" if k and abs(1 / k - value) < 1e-9 else f"chance {value:.3g}"


def add_chance_lines(
    fig: go.Figure,
    chance: PerSet,
    names: Sequence[str],
    *,
    axis: str = "y",
    percent: bool = False,
) -> go.Figure:
    """Grey lines at the chance accuracy of ``names`` (1 / the classes a data set is scored on;
    one line per distinct level), horizontal for ``axis="y"`` and vertical for ``"x"``."""
    levels: dict[float, list[str]] = {}
    for name in names:
        value = _per_set(chance, name)
        if value is not None:
            levels.setdefault(value, []).append(str(name))
    for value, sets in sorted(levels.items()):
        where = value * (100.0 if percent else 1.0)
        text = _chance_text(value)
        if len(levels) > 1:  # several levels: say whose each one is
            text += f" ({', '.join(sets)})"
        style = dict(line_dash="dashdot", line_color="grey", line_width=1)
        if axis == "y":
            fig.add_hline(y=where, annotation_text=text, annotation_position="bottom right",
                          **style)  # fmt: skip
        else:
            fig.add_vline(x=where, annotation_text=text, annotation_position="top left",
                          **style)  # fmt: skip
    return fig


def _is_percent(*values: Any) -> bool:
    finite = [float(v) for v in np.concatenate([np.ravel(v) for v in values]) if np.isfinite(v)]
    return bool(finite) and max(finite) > 1.0


def _accuracy_range(*values: Any) -> list[float]:
    """The whole accuracy scale, fractions or percent, so that a small change looks small."""
    finite = [float(v) for v in np.concatenate([np.ravel(v) for v in values]) if np.isfinite(v)]
    top = 100.0 if finite and max(finite) > 1.0 else 1.0
    return [0.0, top * 1.02]


def _say_if_empty(fig: go.Figure, values: Any, what: str = "accuracy") -> go.Figure:
    """A figure whose every value is missing (NaN) says so in the middle instead of showing
    empty axes under a full legend."""
    array = np.asarray(values, dtype=float)
    if array.size == 0 or not np.isfinite(array).any():
        fig.add_annotation(
            text=f"no {what} to show: every value is missing (NaN)", showarrow=False,
            xref="paper", yref="paper", x=0.5, y=0.5, font={"size": 14},
        )  # fmt: skip
    return fig


def id_vs_ood_scatter(
    subnetworks_df: pd.DataFrame,
    full_model_acc: Mapping[str, float] | None,
    id_col: str,
    ood_cols: str | Sequence[str],
    *,
    label_col: str | None = None,
    title: str | None = None,
    n: Mapping[str, int] | int | None = None,
    chance: PerSet = None,
) -> go.Figure:
    """Figure 2: one marker trace per OOD column (x = ID accuracy, y = OOD accuracy, one dot per
    row/subnetwork); the full model's ID accuracy as a vertical dashed line and each OOD accuracy
    as a horizontal dotted line (layout shapes). ``n`` (examples per data set) goes into the axis
    title and the legend; ``chance`` (accuracy per data set) draws the chance lines."""
    ood_cols = [ood_cols] if isinstance(ood_cols, str) else list(ood_cols)
    _need(subnetworks_df, [id_col, *ood_cols], "id_vs_ood_scatter")
    text = subnetworks_df[label_col].astype(str) if label_col else None
    fig = go.Figure()
    for col in ood_cols:
        fig.add_trace(
            go.Scatter(
                x=subnetworks_df[id_col],
                y=subnetworks_df[col],
                mode="markers",
                name=with_n(col, n),
                text=text,
                hovertemplate=f"{id_col}=%{{x:.3f}}<br>{col}=%{{y:.3f}}<br>%{{text}}<extra></extra>",
            )
        )
    if full_model_acc:
        if id_col in full_model_acc:
            fig.add_vline(
                x=full_model_acc[id_col], line_dash="dash", annotation_text=f"full {id_col}"
            )
        for col in ood_cols:
            if col in full_model_acc:
                fig.add_hline(y=full_model_acc[col], line_dash="dot", annotation_text=f"full {col}")
    values = (subnetworks_df[[id_col, *ood_cols]].to_numpy(), list((full_model_acc or {}).values()))
    scale = _accuracy_range(*values)
    add_chance_lines(fig, chance, [id_col], axis="x", percent=_is_percent(*values))
    add_chance_lines(fig, chance, ood_cols, axis="y", percent=_is_percent(*values))
    fig.update_layout(
        title=title or "In-domain vs out-of-domain accuracy of subnetworks",
        xaxis_title=f"{with_n(id_col, n)} accuracy (in-domain)",
        yaxis_title="out-of-domain accuracy",
        xaxis_range=scale,
        yaxis_range=scale,
        showlegend=True,
    )
    return _say_if_empty(fig, subnetworks_df[[id_col, *ood_cols]].to_numpy())


def subcase_bars(
    df: pd.DataFrame,
    *,
    subnetwork_col: str = "subnetwork",
    subcase_col: str = "subcase",
    value_col: str = "accuracy",
    full_model_acc: Mapping[str, float] | None = None,
    title: str | None = None,
    n: Mapping[str, int] | int | None = None,
    chance: PerSet = None,
) -> go.Figure:
    """Figure 3: grouped bars, x = subcase, one bar trace per subnetwork (tidy input: one row
    per subnetwork and subcase), plus a "full model" trace when ``full_model_acc`` (subcase ->
    accuracy) is given. ``n`` labels each subcase with its examples; ``chance`` draws the
    chance lines."""
    _need(df, [subnetwork_col, subcase_col, value_col], "subcase_bars")
    subcases = list(dict.fromkeys(df[subcase_col]))
    labels = [with_n(s, n) for s in subcases]
    fig = go.Figure()
    for name, group in df.groupby(subnetwork_col, sort=False):
        values = group.set_index(subcase_col)[value_col].reindex(subcases)
        fig.add_trace(go.Bar(x=labels, y=values.to_numpy(), name=f"{subnetwork_col} {name}"))
    if full_model_acc:
        fig.add_trace(
            go.Bar(
                x=labels,
                y=[full_model_acc.get(s, np.nan) for s in subcases],
                name="full model",
                marker_color="black",
            )
        )
    add_chance_lines(fig, chance, subcases, percent=_is_percent(df[value_col].to_numpy(), [0.0]))
    fig.update_layout(
        barmode="group",
        title=title or "Accuracy per subcase",
        xaxis_title=subcase_col,
        yaxis_title=value_col,
        yaxis_range=_accuracy_range(
            df[value_col].to_numpy(), list((full_model_acc or {}).values())
        ),
    )
    return fig


def accuracy_vs_sparsity(
    df: pd.DataFrame,
    *,
    sparsity_col: str = "sparsity",
    dataset_col: str = "dataset",
    value_col: str = "accuracy",
    full_model_acc: Mapping[str, float] | None = None,
    title: str | None = None,
    n: Mapping[str, int] | int | None = None,
    chance: PerSet = None,
) -> go.Figure:
    """Figure 4: per dataset, the mean over seeds (rows) at each sparsity with std error bars;
    the full model's accuracy per dataset as horizontal dotted lines when given; ``n`` in each
    data set's name, ``chance`` as chance lines."""
    _need(df, [sparsity_col, dataset_col, value_col], "accuracy_vs_sparsity")
    fig = go.Figure()
    for name, group in df.groupby(dataset_col, sort=False):
        stats = group.groupby(sparsity_col)[value_col].agg(["mean", "std", "count"]).sort_index()
        fig.add_trace(
            go.Scatter(
                x=stats.index.to_numpy(),
                y=stats["mean"].to_numpy(),
                # one seed has no spread: no bar (a bar of 0 would read as seeds that agree)
                error_y={"type": "data", "array": stats["std"].to_numpy()},
                mode="lines+markers",
                name=with_n(str(name), n),
                customdata=stats["count"].to_numpy(),
                hovertemplate="sparsity %{x}: %{y:.3f} (%{customdata} seeds)<extra></extra>",
            )
        )
    for name, acc in (full_model_acc or {}).items():
        fig.add_hline(y=acc, line_dash="dot", annotation_text=f"full {name}")
    add_chance_lines(
        fig, chance, [str(d) for d in dict.fromkeys(df[dataset_col])],
        percent=_is_percent(df[value_col].to_numpy(), [0.0]),
    )  # fmt: skip
    single = (df.groupby([dataset_col, sparsity_col])[value_col].count() == 1).any()
    top = 1.0 if float(df[sparsity_col].max()) <= 1 else 100.0
    fig.update_layout(
        title=title or "Accuracy vs sparsity (mean ± std over seeds)",
        xaxis_title="sparsity (points from a single seed have no error bar)"
        if single
        else "sparsity",
        xaxis_range=[0, top],  # one sparsity alone: no negative sparsities on the axis
        yaxis_title=value_col,
        yaxis_range=_accuracy_range(
            df[value_col].to_numpy(), list((full_model_acc or {}).values())
        ),
        showlegend=True,  # a single evaluation set keeps its name
    )
    return _say_if_empty(fig, df[value_col].to_numpy())


def frequency_heatmap_figure(
    heatmap: Any,
    *,
    label_a: str = "sparsity A",
    label_b: str = "sparsity B",
    title: str | None = None,
) -> go.Figure:
    """Figure 5: ``heatmap[i, j]`` (from :func:`mi_core.analysis.frequency_heatmap`) as a
    heatmap with the counts written in the cells; y = i (subnetworks at A), x = j (at B)."""
    z = np.asarray(heatmap.cpu() if hasattr(heatmap, "cpu") else heatmap)
    if z.ndim != 2:
        raise ConfigError(f"heatmap must be 2-D; got shape {z.shape}")
    k_a, k_b = z.shape[0] - 1, z.shape[1] - 1
    fig = go.Figure(
        go.Heatmap(
            z=z,
            x=list(range(k_b + 1)),
            y=list(range(k_a + 1)),
            text=z,
            texttemplate="%{text}",
            colorscale="Blues",
            colorbar={"title": "heads"},
            hovertemplate=f"{label_a}: %{{y}}/{k_a}<br>{label_b}: %{{x}}/{k_b}"
            "<br>heads: %{z}<extra></extra>",
        )
    )
    fig.update_layout(
        title=title or "Number of heads by frequency in two groups of subnetworks",
        # whole subnetworks only (plotly would tick 0.5 on a 3 x 3 grid)
        xaxis={"title": f"subnetworks at {label_b} keeping the head (of {k_b})",
               "tickmode": "array", "tickvals": list(range(k_b + 1))},
        yaxis={"title": f"subnetworks at {label_a} keeping the head (of {k_a})",
               "tickmode": "array", "tickvals": list(range(k_a + 1))},
    )  # fmt: skip
    return fig


def effective_size_over_training(
    accuracy_df: pd.DataFrame,
    effective_df: pd.DataFrame,
    *,
    step_col: str | None = None,
    title: str | None = None,
) -> go.Figure:
    """Figure 6: top, the full model's accuracy per dataset over steps (``accuracy_df``:
    step/checkpoint, dataset, accuracy); bottom, effective size per target over steps
    (``effective_df`` as returned by :func:`mi_core.analysis.effective_size`)."""
    acc_step = _step_col(accuracy_df, step_col)
    eff_step = _step_col(effective_df, step_col)
    _need(accuracy_df, [acc_step, "dataset", "accuracy"], "effective_size_over_training")
    _need(effective_df, [eff_step, "target", "effective_size"], "effective_size_over_training")
    fig = make_subplots(
        rows=2, cols=1, shared_xaxes=True, subplot_titles=("Accuracy", "Effective size")
    )
    for name, group in accuracy_df.groupby("dataset", sort=False):
        group = group.sort_values(acc_step)
        fig.add_trace(
            go.Scatter(x=group[acc_step], y=group["accuracy"], mode="lines+markers", name=name),
            row=1,
            col=1,
        )
    for name, group in effective_df.groupby("target", sort=False):
        group = group.sort_values(eff_step)
        fig.add_trace(
            go.Scatter(
                x=group[eff_step],
                y=group["effective_size"],
                mode="lines+markers",
                name=f"effective size ({name})",
                line_dash="dash",
            ),
            row=2,
            col=1,
        )
    # the whole scales, as the other accuracy figures (a flat curve stays flat), whole steps
    fig.update_yaxes(
        title_text="accuracy", range=_accuracy_range(accuracy_df["accuracy"].to_numpy()),
        row=1, col=1,
    )  # fmt: skip
    fig.update_yaxes(title_text="effective size (%)", range=[0, 102], row=2, col=1)
    fig.update_xaxes(tickformat="d")
    fig.update_xaxes(title_text="training step", row=2, col=1)
    fig.update_layout(title=title or "Accuracy and effective size over training", height=640)
    return fig


def attention_class_chart(
    df: pd.DataFrame,
    heads: Sequence[str] | None = None,
    *,
    classes: Sequence[str] | None = None,
    show_uniform: bool = False,
    title: str | None = None,
) -> go.Figure:
    """Figure 9: grouped bars, x = head label, one bar trace per class with the mean attention
    mass (``df`` from :func:`mi_core.analysis.classify_heads`). ``show_uniform`` adds the uniform
    baseline of each class as markers."""
    from mi_core.analysis.attention_patterns import ALL_CLASSES

    _need(df, ["label"], "attention_class_chart")
    if classes is None:
        classes = [c for c in ALL_CLASSES if f"{c}_mass" in df.columns]
    _need(df, [f"{c}_mass" for c in classes], "attention_class_chart")
    rows = df.set_index("label")
    if heads is not None:
        unknown = [h for h in heads if h not in rows.index]
        if unknown:
            raise ConfigError(f"heads {unknown} are not in the attention-pattern table")
        rows = rows.loc[list(heads)]
    labels = list(rows.index)
    fig = go.Figure()
    palette = px.colors.qualitative.Plotly
    for i, c in enumerate(classes):
        colour = palette[i % len(palette)]
        fig.add_trace(
            go.Bar(x=labels, y=rows[f"{c}_mass"].to_numpy(), name=c, marker_color=colour,
                   offsetgroup=c, legendgroup=c)
        )  # fmt: skip
        if show_uniform and f"{c}_uniform" in rows.columns:
            # a black tick over its own class's bar (scattermode "group"); one legend entry
            fig.add_trace(
                go.Scatter(
                    x=labels,
                    y=rows[f"{c}_uniform"].to_numpy(),
                    mode="markers",
                    marker={"symbol": "line-ew-open", "size": 16, "color": "black",
                            "line": {"width": 3}},
                    offsetgroup=c,
                    legendgroup="uniform",
                    legendrank=2000,  # after the classes
                    showlegend=not any(t.legendgroup == "uniform" for t in fig.data),
                    name="a uniform pattern's mass",
                    hovertemplate=f"{c}, uniform pattern: %{{y:.3f}}<extra></extra>",
                )
            )  # fmt: skip
    fig.update_layout(
        scattermode="group",
        barmode="group",
        title=title or "Attention mass by token class",
        xaxis_title="head",
        yaxis_title="mean attention mass",
    )
    return fig


def training_dynamics(
    metrics_df: pd.DataFrame,
    *,
    id_datasets: Sequence[str] | None = None,
    step_col: str | None = None,
    value_col: str = "accuracy",
    title: str | None = None,
    n: Mapping[str, int] | int | None = None,
    chance: PerSet = None,
) -> go.Figure:
    """Accuracy per dataset over fine-tuning steps (a metrics.csv with step, dataset,
    accuracy): one line per dataset; with ``id_datasets``, names get "(ID)"/"(OOD)" and OOD lines
    are dashed; ``n`` in the names, ``chance`` as chance lines; the whole accuracy scale."""
    step = _step_col(metrics_df, step_col)
    _need(metrics_df, [step, "dataset", value_col], "training_dynamics")
    fig = go.Figure()
    for name, group in metrics_df.groupby("dataset", sort=False):
        group = group.dropna(subset=[value_col]).sort_values(step)
        label, dash = with_n(str(name), n), "solid"
        if id_datasets is not None:
            in_domain = name in id_datasets
            label = f"{label} ({'ID' if in_domain else 'OOD'})"
            dash = "solid" if in_domain else "dash"
        fig.add_trace(
            go.Scatter(
                x=group[step], y=group[value_col], mode="lines+markers", name=label, line_dash=dash
            )
        )
    values = metrics_df[value_col].to_numpy()
    add_chance_lines(
        fig, chance, [str(d) for d in dict.fromkeys(metrics_df["dataset"])],
        percent=_is_percent(values, [0.0]),
    )  # fmt: skip
    fig.update_layout(
        title=title or "In-domain and out-of-domain accuracy during fine-tuning",
        xaxis_title="training step",
        yaxis_title=value_col,
        yaxis_range=_accuracy_range(values, [0.0]),
        showlegend=True,
    )
    return fig


#: The ``log.csv`` columns :func:`pruning_dynamics` needs.
PRUNING_LOG_COLUMNS = ("run", "step", "sampled_sparsity", "expected_sparsity", "target_sparsity")
#: Points drawn per run and line at most (long runs are thinned evenly; the last step is kept).
_MAX_POINTS = 400


def _thin(frame: pd.DataFrame, limit: int = _MAX_POINTS) -> pd.DataFrame:
    if len(frame) <= limit:
        return frame
    keep = np.unique(np.linspace(0, len(frame) - 1, limit).round().astype(int))
    return frame.iloc[keep]


#: From this many runs on, :func:`pruning_dynamics` draws one set of panels per run.
SMALL_MULTIPLES_FROM = 5
#: Runs per row of those panels.
DYNAMICS_PER_ROW = 4


def _dynamics_grid(
    logs: pd.DataFrame,
    probed: bool,
    full_accuracy: float | None,
    eval_name: str | None,
    title: str | None,
) -> go.Figure:
    """:func:`pruning_dynamics` as small multiples: per run, its sparsity panel (sampled
    solid, expected dotted, target grey) and below it, when probed, its accuracy panel."""
    runs = list(logs.groupby("run", sort=False))
    per_run = 2 if probed else 1
    cols = min(DYNAMICS_PER_ROW, len(runs))
    grid = -(-len(runs) // cols)
    titles = []
    for row in range(grid):
        names = [str(r) for r, _ in runs[row * cols : (row + 1) * cols]]
        titles += names + [""] * (cols - len(names))
        if probed:
            titles += [""] * cols
    fig = make_subplots(
        rows=grid * per_run, cols=cols, shared_xaxes=True, subplot_titles=titles,
        vertical_spacing=0.25 / (grid * per_run), horizontal_spacing=0.05,
    )  # fmt: skip
    kinds = (("sampled_sparsity", "solid", "#1f77b4"), ("expected_sparsity", "dot", "#1f77b4"),
             ("target_sparsity", "solid", "grey"))  # fmt: skip
    where = f" on {eval_name}" if eval_name else ""
    values = logs["eval_accuracy"].dropna().to_numpy() if probed else np.array([])
    if probed and full_accuracy is not None:
        values = np.append(values, full_accuracy)
    for k, (_, group) in enumerate(runs):
        row, col = (k // cols) * per_run + 1, k % cols + 1
        drawn = _thin(group.sort_values("step"))
        for column, dash, color in kinds:
            fig.add_trace(
                go.Scatter(
                    x=drawn["step"], y=drawn[column], mode="lines",
                    line={"dash": dash, "color": color, "width": 1 if color == "grey" else 2},
                    name=column.replace("_", " "), legendgroup=column, showlegend=k == 0,
                ),
                row=row, col=col,
            )  # fmt: skip
        fig.update_yaxes(
            range=[0, 1], row=row, col=col, title_text="sparsity" if col == 1 else None
        )
        if probed:
            points = _thin(group.dropna(subset=["eval_accuracy"]).sort_values("step"))
            fig.add_trace(
                go.Scatter(
                    x=points["step"], y=points["eval_accuracy"], mode="lines+markers",
                    line={"color": "#d62728"}, marker={"size": 4},
                    name=f"subnetwork accuracy{where}", legendgroup="accuracy",
                    showlegend=k == 0,
                ),
                row=row + 1, col=col,
            )  # fmt: skip
            if full_accuracy is not None:
                fig.add_hline(y=full_accuracy, line_dash="dash", line_color="black",
                              row=row + 1, col=col)  # fmt: skip
            fig.update_yaxes(range=_accuracy_range(values), row=row + 1, col=col,
                             title_text="accuracy" if col == 1 else None)  # fmt: skip
    fig.update_xaxes(tickformat="d")
    full = (
        f"; full model {full_accuracy:.3f} (dashed)" if probed and full_accuracy is not None else ""
    )
    fig.update_layout(
        title=(title or "Pruning runs: sparsity and subnetwork accuracy over steps")
        + f"<br><sup>{len(runs)} runs, one per panel{full}</sup>",
        height=140 + 230 * grid * per_run,
    )
    return fig


def pruning_dynamics(
    logs: pd.DataFrame,
    *,
    full_accuracy: float | None = None,
    eval_name: str | None = None,
    title: str | None = None,
) -> go.Figure:
    """Pruning runs over their steps (``logs``: the runs' ``log.csv`` rows with a ``run``
    column). Top: each run's sampled (solid) and expected (dotted) sparsity and its target
    (grey); where the two part, the run met its target with half-open gates. Bottom, when the
    logs have ``eval_accuracy``: each run's subnetwork as it stood every ``eval_every`` steps,
    with the full model's accuracy (``full_accuracy``, dashed) on the set ``eval_name``. Runs
    longer than 400 steps are drawn from 400 evenly spaced steps; one target line per schedule.
    From :data:`SMALL_MULTIPLES_FROM` runs on, each run gets its own panels (small multiples,
    :data:`DYNAMICS_PER_ROW` to a row), where a dozen overlaid runs could not be told apart."""
    _need(logs, list(PRUNING_LOG_COLUMNS), "pruning_dynamics")
    probed = "eval_accuracy" in logs.columns and logs["eval_accuracy"].notna().any()
    if logs["run"].nunique() >= SMALL_MULTIPLES_FROM:
        return _dynamics_grid(logs, probed, full_accuracy, eval_name, title)
    rows = 2 if probed else 1
    where = f" on {eval_name}" if eval_name else ""
    fig = make_subplots(
        rows=rows, cols=1, shared_xaxes=True, vertical_spacing=0.1,
        subplot_titles=("Sparsity", f"Subnetwork accuracy{where}")[:rows],
    )  # fmt: skip
    palette = px.colors.qualitative.Plotly
    schedules = set()
    for k, (run, group) in enumerate(logs.groupby("run", sort=False)):
        group = group.sort_values("step")
        drawn = _thin(group)
        color = palette[k % len(palette)]
        for column, dash in (("sampled_sparsity", "solid"), ("expected_sparsity", "dot")):
            fig.add_trace(
                go.Scatter(
                    x=drawn["step"], y=drawn[column], mode="lines", line={"dash": dash},
                    line_color=color, legendgroup=str(run),
                    name=f"{run}: {column.split('_')[0]}",
                ),
                row=1, col=1,
            )  # fmt: skip
        schedule = tuple(group["target_sparsity"].round(6))
        if schedule not in schedules:
            fig.add_trace(
                go.Scatter(
                    x=drawn["step"], y=drawn["target_sparsity"], mode="lines",
                    line={"color": "grey", "width": 1}, legendgroup="target", name="target",
                    showlegend=not schedules,
                ),
                row=1, col=1,
            )  # fmt: skip
            schedules.add(schedule)
        if probed:
            points = _thin(group.dropna(subset=["eval_accuracy"]))
            fig.add_trace(
                go.Scatter(
                    x=points["step"], y=points["eval_accuracy"], mode="lines+markers",
                    line_color=color, legendgroup=str(run), name=f"{run}: accuracy",
                ),
                row=2, col=1,
            )  # fmt: skip
    fig.update_yaxes(title_text="sparsity", range=[0, 1], row=1, col=1)
    if probed:
        values = logs["eval_accuracy"].dropna().to_numpy()
        if full_accuracy is not None:
            fig.add_hline(
                y=full_accuracy, line_dash="dash", line_color="black", row=2, col=1,
                annotation_text=f"full model {full_accuracy:.3f}",
                annotation_position="bottom right",
            )  # fmt: skip
            values = np.append(values, full_accuracy)
        fig.update_yaxes(title_text="accuracy", range=_accuracy_range(values), row=2, col=1)
    fig.update_xaxes(tickformat="d")
    fig.update_xaxes(title_text="pruning step", row=rows, col=1)
    fig.update_layout(
        title=title or "Pruning runs: sparsity and subnetwork accuracy over steps",
        height=420 + 300 * (rows - 1),
    )
    return fig


def write_figure_html(
    fig: go.Figure,
    path: str | os.PathLike[str],
    include_plotlyjs: bool | str = True,
    *,
    title: str | None = None,
    **kwargs: Any,
) -> Path:
    """Write ``fig`` as a standalone HTML page, atomically. ``include_plotlyjs=True`` (default)
    embeds plotly.js (~3.5 MB) so the page works offline; ``"cdn"`` links it instead. The
    page's ``<title>`` is ``title``, else the figure's title, else the file's name."""
    import html

    page = fig.to_html(include_plotlyjs=include_plotlyjs, full_html=True, **kwargs)
    name = title or fig.layout.title.text or Path(path).stem.replace("_", " ")
    # a figure title's subtitle (after <br>) and markup stay out of the page's title
    name = re.sub(r"<[^>]*>", "", re.split(r"<br\s*/?>", name)[0]).strip() or name
    heading = f"<title>{html.escape(name)}</title>"
    page = page.replace("<head>", f"<head>\n    {heading}", 1)
    return write_text(path, page)


def subnetworks_figure(
    table: pd.DataFrame,
    eval_names: Sequence[str],
    full: Mapping[str, float],
    *,
    n: Mapping[str, int] | None = None,
    chance: Mapping[str, float] | None = None,
) -> go.Figure:
    """Figure 2 (ID vs OOD accuracy per subnetwork) when there are >= 2 eval sets; with one, its
    accuracy against sparsity; with none, the achieved sparsity against the target. ``n`` and
    ``chance`` (per eval set) label the sets and draw the chance lines."""
    if len(eval_names) >= 2:
        frame = table.rename(columns={f"acc_{n}": n for n in eval_names})
        frame["run"] = [
            f"s={s:g} seed={seed}" for s, seed in zip(frame.sparsity, frame.seed, strict=True)
        ]
        return id_vs_ood_scatter(
            frame, dict(full), eval_names[0], list(eval_names[1:]), label_col="run", n=n,
            chance=chance,
        )  # fmt: skip
    if len(eval_names) == 1:
        long = pd.DataFrame(
            {
                "sparsity": table["sparsity"],
                "dataset": eval_names[0],
                "accuracy": table[f"acc_{eval_names[0]}"],
            }
        )
        return accuracy_vs_sparsity(long, full_model_acc=dict(full), n=n, chance=chance)
    fig = go.Figure(go.Scatter(x=table["sparsity"], y=table["achieved_sparsity"], mode="markers"))
    return fig.update_layout(
        title="Achieved vs target sparsity (no eval sets given)",
        xaxis_title="target sparsity",
        yaxis_title="achieved sparsity",
    )


def circuit_stability_figure(stability: Mapping[str, Any], title: str = "") -> go.Figure:
    """The bootstrap agreement of a method's circuits (``CircuitStability.to_dict()``): at each
    circuit size (share of the edges, log axis), the mean pairwise Jaccard index of the
    resamples' circuits and the share of a circuit that is in every resample's; sizes too small
    to hold an edge are left out."""
    rows = [(100 * p, j, len(s) / n) for p, j, s, n in zip(
        stability["percentages"], stability["jaccard"], stability["shared"],
        stability["n_edges"], strict=True) if n > 0]  # fmt: skip
    pct, agreement, shared = ([r[i] for r in rows] for i in range(3))
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=pct, y=agreement, mode="lines+markers",
                             name="mean pairwise Jaccard"))  # fmt: skip
    fig.add_trace(go.Scatter(x=pct, y=shared, mode="lines+markers", line={"dash": "dot"},
                             name="share of a circuit in every resample"))  # fmt: skip
    heading = f"Circuit stability over {stability['n_resamples']} bootstrap resamples"
    fig.update_layout(
        title=f"{heading}<br><sup>{title}</sup>" if title else heading,
        xaxis={"title": "circuit size (% of edges)", "type": "log", "tickvals": pct,
               "ticktext": [f"{p:g}" for p in pct]},
        yaxis={"title": "agreement", "range": [0, 1.05]},
        template="plotly_white", legend={"x": 0.01, "y": 0.99},
    )  # fmt: skip
    return fig
