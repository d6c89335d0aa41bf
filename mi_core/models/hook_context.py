"""Hooks that hold for the span of a ``with`` block, removed from their own points alone.

TransformerLens's ``model.hooks(...)`` removes its hooks on leaving by visiting every hook point
of the model (about 1,570 on SmolLM2, each a module attribute set: host time that a GPU waits
on; its cost: benchmarks/README.md, Results, the A / B of mi_core's hook blocks against
``model.hooks()``).
:func:`hooked` is the same block that visits only the points it hooked.

One difference: TransformerLens's sweep also removes, as a side effect, hooks that other code
left at the same context level elsewhere (``run_with_hooks(..., reset_hooks_end=False)``
leaves its hooks at level 0); mi_core's blocks leave those where they are, as they leave any
hook they did not add. ``model.reset_hooks()`` removes them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformer_lens.hook_points import HookedRootModule

HookName = str | Callable[[str], bool]


def _points(model: HookedRootModule, name: HookName) -> list[Any]:
    """The hook points ``name`` names: one name, or a filter on names (as TransformerLens)."""
    if isinstance(name, str):
        return [model.mod_dict[name]]
    return [point for point_name, point in model.hook_dict.items() if name(point_name)]


@contextlib.contextmanager
def _level(model: HookedRootModule) -> Iterator[tuple[int, dict[int, Any]]]:
    """A context level of its own; on leaving, the hooks added at it to the points collected in
    the dict are removed (those points alone), as ``reset_hooks(level=...)`` would."""
    model.context_level += 1
    touched: dict[int, Any] = {}
    try:
        yield model.context_level, touched
    finally:
        for point in touched.values():
            point.remove_hooks("both", including_permanent=False, level=model.context_level)
        model.is_caching = False  # as TransformerLens's reset
        model.context_level -= 1


@contextlib.contextmanager
def hooked(
    model: HookedRootModule, fwd_hooks: Sequence[tuple[HookName, Callable]]
) -> Iterator[Any]:
    """``model.hooks(fwd_hooks=...)`` of TransformerLens, leaving in time proportional to the
    hooks added rather than to the model's hook points. The hooks go after any already there.
    An object that only offers ``hooks()`` (no TransformerLens hook dictionary) gets its own."""
    if not all(hasattr(model, name) for name in ("mod_dict", "hook_dict", "context_level")):
        with model.hooks(fwd_hooks=list(fwd_hooks)):
            yield model
        return
    with _level(model) as (level, touched):
        for name, hook in fwd_hooks:
            for point in _points(model, name):
                touched[id(point)] = point
                point.add_hook(hook, dir="fwd", level=level)
        yield model


@contextlib.contextmanager
def prepended_hooks(
    model: HookedRootModule,
    hooks: Sequence[tuple[str, Callable]],
    appended: Sequence[tuple[str, Callable]] = (),
) -> Iterator[Any]:
    """Add ``hooks`` to a TransformerLens model *before* the hooks already at their points (and
    ``appended`` after them), at a context level of their own; leaving the block removes
    exactly these hooks."""
    placed = [(name, hook, True) for name, hook in hooks]
    placed += [(name, hook, False) for name, hook in appended]
    with _level(model) as (level, touched):
        for name, hook, prepend in placed:
            for point in _points(model, name):
                touched[id(point)] = point
            model.add_hook(name, hook, level=level, prepend=prepend)
        yield model
