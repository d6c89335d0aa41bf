"""One intervention abstraction: plain data that hooks a model, saves, loads and combines.

An intervention says *where* it acts (hook points of a TransformerLens model) and *what*
replaces the parts it removes (zero, a mean activation, a mean offset). Every kind implements
:class:`Intervention`; :func:`apply` puts any number of them on a model for a ``with`` block::

    subnetwork = Subnetwork.load("runs/sweep/s0.50/seed1/subnetwork.safetensors")
    neurons = PruneMasks.load("runs/separability/masks.safetensors")
    with apply(model, subnetwork, neurons):
        logits = model(**batch)

The kinds: :class:`~mi_core.interventions.subnetwork.Subnetwork` (heads and MLPs removed from
a :class:`~mi_core.interventions.mask.ComponentMask`, filled with a means file's activations
or zero; the heuristic-core paper's unit) and :class:`~mi_core.interventions.neurons.PruneMasks`
(MLP neurons and attention pre-out neurons, each with its own offset; the separability
report's unit) and :class:`~mi_core.interventions.edges.EdgeMask` (edges between components,
filled with a corrupted run's activations, a mean or zero; the unit of circuits). Each saves
as safetensors whose metadata carries ``kind`` and a format version, so
:func:`load_intervention` reads any of them back.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from safetensors import SafetensorError

from mi_core.errors import InterventionError
from mi_core.interventions.ablation import removal_claims
from mi_core.interventions.edges import EDGE_MASK_KIND, EdgeMask
from mi_core.interventions.subnetwork import SUBNETWORK_KIND, Subnetwork
from mi_core.io import read_safetensors
from mi_core.models.hook_context import prepended_hooks

if TYPE_CHECKING:
    from mi_core.models.types import HookedModel

__all__ = ["Intervention", "apply", "intervention_hooks", "load_intervention"]

Hook = tuple[str, Callable[..., Any]]


@runtime_checkable
class Intervention(Protocol):
    """What every intervention provides."""

    def hooks(self, model: HookedModel) -> list[Hook]:
        """Forward hooks ``(hook name, fn)`` that apply it to ``model`` (checked to fit)."""
        ...

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write it (safetensors with ``kind`` and format version), atomically."""
        ...


def _prepared(
    model: HookedModel, intervention: Intervention
) -> contextlib.AbstractContextManager[Any]:
    """The model switches an intervention needs (its optional ``prepare(model)``), or none."""
    prepare = getattr(intervention, "prepare", None)
    return prepare(model) if prepare is not None else contextlib.nullcontext(model)


def intervention_hooks(model: HookedModel, interventions: Sequence[Intervention]) -> list[Hook]:
    """The hooks of ``interventions`` in the order they act (the first one acts first)."""
    hooks: list[Hook] = []
    for intervention in interventions:
        if not isinstance(intervention, Intervention):
            raise InterventionError(
                f"{type(intervention).__name__} is not an intervention (it needs hooks(model) "
                "and save(path)); wrap a ComponentMask as Subnetwork(mask, ablation, means)"
            )
        hooks += intervention.hooks(model)
    return hooks


@contextlib.contextmanager
def apply(model: HookedModel, *interventions: Intervention) -> Iterator[Any]:
    """Context manager: inside it, ``model`` runs with every intervention applied.

    An intervention may switch on what it needs for the span of the block (its optional
    ``prepare(model)``: an edge mask turns on per-head query / key / value inputs). The hooks
    of subnetworks and neuron masks go before any hook already on the model (so
    ``run_with_cache`` and later hooks see the intervened activations); at a shared hook point
    the first intervention acts first. An edge mask's hooks go *after* every hook already
    there, whatever the order or nesting (``run_with_cache`` inside the block still sees its
    effect):
    it reads each sender's output and the residual stream as the model computes them, so a
    subnetwork applied with it (in the same call or around it) and hooks already on the model
    (``model.add_hook``, an enclosing ``hooks()`` block) act first. Hooks added inside the
    block (``run_with_hooks``) act after it has read them. Leaving the block removes exactly
    these hooks.
    """
    # prepending reverses the order at a hook point, so add the last intervention first
    with contextlib.ExitStack() as claims:
        for intervention in interventions:  # switches first: hooks may depend on them
            if isinstance(intervention, Intervention):
                claims.enter_context(_prepared(model, intervention))
        edges = [i for i in interventions if isinstance(i, EdgeMask)]
        nodes = [i for i in interventions if not isinstance(i, EdgeMask)]
        hooks = intervention_hooks(model, nodes)
        for intervention in interventions:
            if isinstance(intervention, Subnetwork):  # one fill per removed component
                claims.enter_context(removal_claims(model, intervention.mask, intervention.fill))
        appended = intervention_hooks(model, edges)
        with prepended_hooks(model, list(reversed(hooks)), appended):
            yield model


def load_intervention(path: str | os.PathLike[str]) -> Intervention:
    """Read any saved intervention, by the ``kind`` in its file's metadata."""
    from mi_core.interventions.neurons import PruneMasks, is_neuron_masks

    try:
        _, metadata = read_safetensors(path)
    except FileNotFoundError:
        raise InterventionError(f"no intervention file at {path}") from None
    except (SafetensorError, OSError, ValueError) as exc:
        raise InterventionError(f"{path} is not a safetensors file ({exc})") from None
    kind = metadata.get("kind")
    if kind == SUBNETWORK_KIND:
        return Subnetwork.load(path)
    if is_neuron_masks(metadata):
        return PruneMasks.load(path)
    if kind == EDGE_MASK_KIND:
        return EdgeMask.load(path)
    raise InterventionError(
        f"{path} holds no intervention mi_core knows (kind {kind!r}); a component mask alone is "
        "read with ComponentMask.load and applied as Subnetwork(mask, ablation, means)"
    )
