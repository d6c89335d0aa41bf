"""Pruning trajectories and separability areas.

A trajectory follows the model's performance on the two data sets, relative to the unpruned
model, step by step: it starts at (1, 1) and heads to (0, 0) as more is pruned. Accuracies are
taken relative as ``acc / acc_unpruned``; the loss as ``exp(loss_unpruned - loss)`` (the ratio
of perplexities), which is 1 unpruned and falls to 0 as the loss grows. Values are clipped to
[0, 1] for the area (a step that beats the unpruned model counts as 1).

The report plots the *specific* task (the one being removed or kept alone) on the x axis and
the general task on the y axis, and names two procedures:

- ``mode="cripple"``: remove the cripple data set's capability and keep the focus data set's
  ("code cripple" for focus = text, cripple = code). x = cripple, y = focus. Success moves left
  first: area towards 2.
- ``mode="focus"``: keep only the focus data set's capability ("code focus" for focus = code,
  cripple = text). x = focus, y = cripple. Success moves down first: area towards 0.

The area is the trapezoid area under the trajectory, closed by a final segment to (0, 0) when
pruning stopped earlier, times 2: 1.0 for a diagonal (no separation), 2.0 for (1,1)->(0,1)->(0,0)
and 0.0 for (1,1)->(1,0)->(0,0). Separability % is ``|1 - area| * 100``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd

from mi_core.analysis.constants import MODES
from mi_core.errors import ConfigError
from mi_core.evaluation.next_token import METRICS


def relative_performance(values: Sequence[float], metric: str) -> np.ndarray:
    """Performance relative to the first (unpruned) value: accuracy ratio, or perplexity ratio."""
    v = np.asarray(values, dtype=np.float64)
    if v.size == 0:
        return v
    if metric.endswith("loss"):
        return np.exp(v[0] - v)
    if v[0] == 0 or not np.isfinite(v[0]):
        return np.full_like(v, np.nan)
    return v / v[0]


def separability_area(x: Sequence[float], y: Sequence[float]) -> float:
    """Normalised area under a trajectory of relative performances from (1, 1) to (0, 0).

    ``x`` and ``y`` start at the unpruned model (they are clipped to [0, 1]); a last point at
    the origin is added if missing. Returns 1.0 for a diagonal, 2.0 and 0.0 at the extremes.
    """
    xs = np.clip(np.asarray(x, dtype=np.float64), 0.0, 1.0)
    ys = np.clip(np.asarray(y, dtype=np.float64), 0.0, 1.0)
    if xs.shape != ys.shape or xs.ndim != 1 or xs.size == 0:
        raise ConfigError("a trajectory needs x and y sequences of the same non-zero length")
    if np.isnan(xs).any() or np.isnan(ys).any():
        return float("nan")
    xs = np.concatenate([[1.0], xs, [0.0]])
    ys = np.concatenate([[1.0], ys, [0.0]])
    # signed trapezoids along x (x decreases as pruning goes on): a line integral, so a step
    # that goes back up in performance subtracts again what it added
    area = float(np.sum((xs[:-1] - xs[1:]) * (ys[:-1] + ys[1:]) / 2.0))
    return 2.0 * area


def separability_percent(area: float) -> float:
    """``|1 - area| * 100``: 0 for no separation, 100 for a perfect one."""
    return abs(1.0 - area) * 100.0 if math.isfinite(area) else float("nan")


def trajectory_axes(
    frame: pd.DataFrame, metric: str, mode: str = "cripple"
) -> tuple[np.ndarray, np.ndarray]:
    """The ``(x, y)`` relative performances of one metric, per the ``mode``'s orientation.

    ``frame`` has one row per step (step 0 = unpruned) with ``focus_{metric}`` and
    ``cripple_{metric}`` columns.
    """
    if mode not in MODES:
        raise ConfigError(f"unknown mode {mode!r}; expected one of {list(MODES)}")
    frame = frame.sort_values("step")
    focus = relative_performance(frame[f"focus_{metric}"].to_numpy(), metric)
    cripple = relative_performance(frame[f"cripple_{metric}"].to_numpy(), metric)
    return (cripple, focus) if mode == "cripple" else (focus, cripple)


def trajectory_areas(
    frame: pd.DataFrame, mode: str = "cripple", metrics: Sequence[str] = METRICS
) -> dict[str, dict[str, float]]:
    """``{metric: {"area": ..., "separability_pct": ...}}`` for one run's trajectory."""
    out = {}
    for metric in metrics:
        x, y = trajectory_axes(frame, metric, mode)
        area = separability_area(x, y)
        out[metric] = {"area": area, "separability_pct": separability_percent(area)}
    return out
