"""The names an analysis is chosen by (a separability trajectory's mode): plain Python, so a
job's config imports no numpy or pandas."""

from __future__ import annotations

__all__ = ["MODES"]


#: The two data sets of a separability run: ``cripple`` (the capability pruned away) and
#: ``focus`` (the capability kept).
MODES: tuple[str, ...] = ("cripple", "focus")
