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


#: The reference code's epsilon of each ratio scoring (``cripple / (focus + eps)``): 1e-3 for
#: ``freq`` (a frequency), 1e-6 for the others (nickypro/separability, ``scoring.py``).
REFERENCE_EPS: dict[str, float] = {"freq": 1e-3}
DEFAULT_EPS = 1e-6

#: Scorings that compare the two data sets by a difference instead of a ratio.
DIFFERENCE_SCORINGS = ("mean_diff",)


#: Head aggregations of pre-out neuron scores.
HEAD_AGGREGATIONS: tuple[str, ...] = ("mean", "median")


#: How a step's fraction is counted: of all units (the report) or of the remaining ones.
SCHEDULES = ("total", "remaining")
