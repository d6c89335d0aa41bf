"""What the active interventions of a model replace, and by what: one fill per unit.

An intervention claims the units it removes (components, neurons, ...), each with the
identity of its fill (``zero``, or which means). While it is applied, the claims are recorded
on the model; a unit claimed again with another fill is refused, because nested mean and zero
ablation of one unit would give whichever hook happens to run last. The same fill nests.
"""

from __future__ import annotations

import contextlib
from collections.abc import Hashable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from mi_core.errors import InterventionError

if TYPE_CHECKING:
    from mi_core.models.types import HookedModel

__all__ = ["claimed"]

#: Per model, the fill of every unit that an active intervention claims (and how many claim it).
_CLAIMS = "_mi_core_removed_fills"


@contextlib.contextmanager
def claimed(model: HookedModel, claims: Mapping[Hashable, str]) -> Iterator[None]:
    """For a ``with`` block, record that ``claims[unit]`` fills each ``unit`` on ``model``.

    A unit that an active intervention already claims with another fill is refused.
    """
    active: dict[Any, list] = model.__dict__.setdefault(_CLAIMS, {})
    clash = [unit for unit, fill in claims.items() if unit in active and active[unit][0] != fill]
    if clash:
        names = ", ".join(str(unit) for unit in clash)
        fill = claims[clash[0]]
        raise InterventionError(
            f"{names} already removed with {active[clash[0]][0]} fill by an enclosing "
            f"intervention; nesting {fill} fill of the same unit would depend on the order of "
            "the hooks: remove it from one of the masks"
        )
    for unit, fill in claims.items():
        active.setdefault(unit, [fill, 0])[1] += 1
    try:
        yield
    finally:
        for unit in claims:
            active[unit][1] -= 1
            if active[unit][1] == 0:
                del active[unit]
