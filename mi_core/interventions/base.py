"""One intervention abstraction: plain data that hooks a model, saves, loads and combines.

An intervention says *where* it acts (hook points of a TransformerLens model, and whether its
hooks go before or after those already there) and *what* replaces the parts it removes (its
fill: zero, a mean activation, a corrupted run's). Every kind implements :class:`Intervention`;
:func:`apply` puts any number of them on a model for a ``with`` block::

    subnetwork = Subnetwork.load("runs/sweep/s0.50/seed1/subnetwork.safetensors")
    neurons = PruneMasks.load("runs/separability/masks.safetensors")
    with apply(model, subnetwork, neurons):
        logits = model(**batch)

The kinds: :class:`~mi_core.interventions.subnetwork.Subnetwork` (heads and MLPs removed from
a :class:`~mi_core.interventions.mask.ComponentMask`, filled with a means file's activations
or zero; the heuristic-core paper's unit) and :class:`~mi_core.interventions.neurons.PruneMasks`
(MLP neurons and attention pre-out neurons, each with its own fill; the separability
report's unit) and :class:`~mi_core.interventions.edges.EdgeMask` (edges between components,
filled with a corrupted run's activations, a mean or zero; the unit of circuits) and
:class:`~mi_core.interventions.edges.OutputMask` (dimensions of each component's output, with
the same fills; MIB's neuron level). Each saves
as safetensors whose metadata carries ``kind`` and a format version, and registers its kind
(:func:`~mi_core.interventions.kinds.register_kind`), so :func:`load_intervention` reads any of
them back.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from safetensors import SafetensorError

# mi_core's own kinds, imported so that each registers its kind for load_intervention
import mi_core.interventions.edges.mask  # noqa: F401
import mi_core.interventions.edges.output_mask  # noqa: F401
import mi_core.interventions.neurons  # noqa: F401
import mi_core.interventions.subnetwork  # noqa: F401
from mi_core.errors import InterventionError
from mi_core.interventions.claims import claimed
from mi_core.interventions.kinds import kind_loader
from mi_core.io import read_safetensors
from mi_core.models.hook_context import prepended_hooks

if TYPE_CHECKING:
    from mi_core.models.types import HookedModel

__all__ = ["HOOK_POSITIONS", "Intervention", "apply", "intervention_hooks", "load_intervention"]

Hook = tuple[str, Callable[..., Any]]

#: Where an intervention's hooks go at their hook points: ``first``, before every hook already
#: on the model (caches and later hooks see what it wrote), or ``last``, after every one (it
#: reads what the model, its hooks and the interventions acting first computed).
HOOK_POSITIONS = ("first", "last")


@runtime_checkable
class Intervention(Protocol):
    """What every intervention provides.

    Besides these two methods an intervention may declare (:func:`apply` reads them, with the
    default in brackets): ``hook_position``, one of :data:`HOOK_POSITIONS` [``first``];
    ``claims(model)``, the units it removes (components, ...), each with the identity of its
    fill, checked against every other intervention on the model [none]; and
    ``prepare(model)``, a context manager that switches on what its hooks need [none].
    """

    def hooks(self, model: HookedModel) -> list[Hook]:
        """Forward hooks ``(hook name, fn)`` that apply it to ``model`` (checked to fit)."""
        ...

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write it (safetensors with ``kind`` and format version), atomically."""
        ...


def _checked(intervention: Any) -> Intervention:
    if not isinstance(intervention, Intervention):
        raise InterventionError(
            f"{type(intervention).__name__} is not an intervention (it needs hooks(model) "
            "and save(path)); wrap a ComponentMask as Subnetwork(mask, fill, means)"
        )
    return intervention


def _prepared(
    model: HookedModel, intervention: Intervention
) -> contextlib.AbstractContextManager[Any]:
    """The model switches an intervention needs (its optional ``prepare(model)``), or none."""
    prepare = getattr(intervention, "prepare", None)
    return prepare(model) if prepare is not None else contextlib.nullcontext(model)


def _position(intervention: Intervention) -> str:
    """Where its hooks go (its optional ``hook_position``; ``first`` without one)."""
    position = getattr(intervention, "hook_position", "first")
    if position not in HOOK_POSITIONS:
        raise InterventionError(
            f"{type(intervention).__name__}.hook_position is {position!r}; expected one of "
            f"{HOOK_POSITIONS}"
        )
    return position


def _claims(model: HookedModel, intervention: Intervention) -> Mapping[Hashable, str]:
    """The units it removes with their fills (its optional ``claims(model)``), or none."""
    claims = getattr(intervention, "claims", None)
    return claims(model) if claims is not None else {}


def intervention_hooks(model: HookedModel, interventions: Sequence[Intervention]) -> list[Hook]:
    """The hooks of ``interventions`` in the order they act (the first one acts first)."""
    hooks: list[Hook] = []
    for intervention in interventions:
        hooks += _checked(intervention).hooks(model)
    return hooks


@contextlib.contextmanager
def apply(model: HookedModel, *interventions: Intervention) -> Iterator[Any]:
    """Context manager: inside it, ``model`` runs with every intervention applied.

    An intervention may switch on what it needs for the span of the block (its optional
    ``prepare(model)``: an edge mask turns on per-head query / key / value inputs). The hooks
    of an intervention whose ``hook_position`` is ``first`` (subnetworks, neuron masks) go
    before any hook already on the model (so ``run_with_cache`` and later hooks see the
    intervened activations); at a shared hook point the first intervention acts first. The
    hooks of one whose position is ``last`` (an edge mask) go *after* every hook already there,
    whatever the order or nesting (``run_with_cache`` inside the block still sees its effect):
    an edge mask reads each sender's output and the residual stream as the model computes
    them, so a subnetwork applied with it (in the same call or around it) and hooks already on
    the model (``model.add_hook``, an enclosing ``hooks()`` block) act first. Hooks added
    inside the block (``run_with_hooks``) act after it has read them.

    Every unit an intervention claims (its optional ``claims(model)``) is checked against the
    claims of the others, in this call and enclosing ones: one unit removed with two different
    fills is refused. Leaving the block removes exactly these hooks and claims.
    """
    for intervention in interventions:
        _checked(intervention)
    positions = [_position(intervention) for intervention in interventions]
    with contextlib.ExitStack() as stack:
        for intervention in interventions:  # switches first: hooks may depend on them
            stack.enter_context(_prepared(model, intervention))
        first = [i for i, at in zip(interventions, positions, strict=True) if at == "first"]
        last = [i for i, at in zip(interventions, positions, strict=True) if at == "last"]
        hooks = intervention_hooks(model, first)
        for intervention in interventions:
            stack.enter_context(claimed(model, _claims(model, intervention)))
        appended = intervention_hooks(model, last)
        # prepending reverses the order at a hook point, so add the last intervention first
        with prepended_hooks(model, list(reversed(hooks)), appended):
            yield model


def load_intervention(path: str | os.PathLike[str]) -> Intervention:
    """Read any saved intervention, by the ``kind`` in its file's metadata (a kind registered
    with :func:`~mi_core.interventions.kinds.register_kind`)."""
    try:
        _, metadata = read_safetensors(path)
    except FileNotFoundError:
        raise InterventionError(f"no intervention file at {path}") from None
    except (SafetensorError, OSError, ValueError) as exc:
        raise InterventionError(f"{path} is not a safetensors file ({exc})") from None
    kind = metadata.get("kind")
    # a file of an older mi_core carries a format tag of its kind's module instead
    load = kind_loader(kind) or kind_loader(metadata.get("format"))
    if load is None:
        raise InterventionError(
            f"{path} holds no intervention mi_core knows (kind {kind!r}); a component mask alone "
            "is read with ComponentMask.load and applied as Subnetwork(mask, fill, means)"
        )
    return load(path)
