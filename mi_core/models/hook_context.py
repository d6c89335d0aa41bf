"""Hooks that hold for the span of a ``with`` block, ahead of every hook already there."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any


@contextlib.contextmanager
def prepended_hooks(
    model: Any,
    hooks: Sequence[tuple[str, Callable]],
    appended: Sequence[tuple[str, Callable]] = (),
) -> Iterator[Any]:
    """Add ``hooks`` to a TransformerLens model *before* the hooks already at their points (and
    ``appended`` after them), at a context level of their own; leaving the block removes
    exactly these hooks."""
    model.context_level += 1
    level = model.context_level
    try:
        for name, hook in hooks:
            model.add_hook(name, hook, level=level, prepend=True)
        for name, hook in appended:
            model.add_hook(name, hook, level=level)
        yield model
    finally:
        model.reset_hooks(clear_contexts=False, including_permanent=False, level=level)
        model.context_level -= 1
