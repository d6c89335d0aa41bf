"""The names a separability config chooses from (scorings, head aggregations, schedules): plain
Python, so a job's config imports no torch."""

from __future__ import annotations

__all__ = ["DIFFERENCE_SCORINGS", "HEAD_AGGREGATIONS", "REFERENCE_EPS", "SCHEDULES", "SCORINGS"]


#: ``--scoring`` names: the statistic each compares.
SCORINGS: dict[str, str] = {
    "freq": "freq",
    "abs": "abs",
    "sqrt": "sqrt",
    "std": "std",
    "rms": "rms",
    "mean": "mean",
    "mean_diff": "mean",
}


#: The reference's epsilon of the ratio ``cripple / (focus + eps)`` per site, whatever the
#: scoring: its pruning runs pass ``ff_eps`` 1e-3 and ``attn_eps`` 1e-4
#: (nickypro/separability ``PruningConfig`` and ``examples/prune_30.py``; the scoring
#: functions' own keyword defaults, 1e-3 for freq and 1e-6 otherwise, are not what it runs).
REFERENCE_EPS: dict[str, float] = {"mlp": 1e-3, "attn": 1e-4}
DEFAULT_EPS = 1e-6

#: Scorings that compare the two data sets by a difference instead of a ratio.
DIFFERENCE_SCORINGS = ("mean_diff",)


#: Head aggregations of pre-out neuron scores.
HEAD_AGGREGATIONS: tuple[str, ...] = ("mean", "median")


#: How a step's fraction is counted: of all units (the report) or of the remaining ones.
SCHEDULES = ("total", "remaining")
