"""Scratch buffers reused across batches, steps and layers.

On a CPU, a fresh buffer of tens of megabytes is memory the kernel must map and zero page by
page the first time it is written (glibc returns every freed block above 32 MiB to the
system at once), and that costs as much as the arithmetic done on it; an edge-pruning step
or an EAP pass allocates many such buffers (the figures: benchmarks/README.md, Results, the
rows on reused buffers). A :class:`Workspace` keeps them between uses.

A buffer is asked for by role (:meth:`Workspace.empty`) and is a kept one that nothing else
references any more, else a fresh one. A buffer still referenced (a view, a tensor autograd
saved, a caller's result) is never handed out again, so reuse cannot change a result: it is
checked, not promised. Two ways to reach one:

- **owned**: a loop holds a workspace and passes it down (the separability statistics,
  :meth:`Workspace.get`);
- **scoped**: code deep inside a forward or backward pass calls :func:`scratch`, which uses
  the workspace of the enclosing :func:`reusing_buffers` block (an edge-pruning run, an
  attribution over batches), and allocates fresh memory outside one.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Iterator, Sequence
from typing import Any

import torch

__all__ = ["Workspace", "reusing_buffers", "scratch", "workspace_memo"]

#: Buffers kept per role: two, so a loop that allocates the next step's buffer while the last
#: step's result is still held (``mask = mask.with_corrupted(node_outputs(...))``) alternates.
_SLOTS = 2

_storage_use_count = getattr(torch._C, "_storage_Use_Count", None)


def _unshared(buffer: torch.Tensor) -> bool:
    """Whether nothing but the workspace holds ``buffer``'s memory (no view, no saved tensor).

    The storage's use count is the kept tensor's handle plus the one this call takes; where
    torch does not expose it, nothing is reused."""
    if _storage_use_count is None:
        return False
    return _storage_use_count(buffer.untyped_storage()._cdata) <= 2


class Workspace:
    """Scratch buffers by role, reused while nothing else references them (two per role)."""

    def __init__(self) -> None:
        self._roles: dict[str, list[torch.Tensor]] = {}
        #: Values derived from a model's weights, kept while a block with ``fixed_weights``
        #: is open and dropped when the last one closes (:func:`workspace_memo`).
        self.memo: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
        self.fixed_weights = 0  # open blocks that promise the weights do not change

    def get(self, like: torch.Tensor) -> torch.Tensor:
        """A buffer with ``like``'s shape, dtype and device (contents undefined)."""
        return self.empty("", like.shape, like)

    def empty(self, role: str, shape: Sequence[int], like: torch.Tensor) -> torch.Tensor:
        """A buffer of ``shape`` with ``like``'s dtype and device (contents undefined): a kept
        one of ``role`` that nothing references any more and is large enough, else a new one
        (kept in place of the role's oldest)."""
        numel = 1
        for size in shape:
            numel *= int(size)
        kept = self._roles.setdefault(role, [])
        for flat in kept:
            if (
                flat.numel() >= numel
                and flat.dtype == like.dtype
                and flat.device == like.device
                and _unshared(flat)
            ):
                return flat[:numel].view(tuple(shape))
        flat = like.new_empty(numel)
        if len(kept) >= _SLOTS:
            kept.pop(0)
        kept.append(flat)
        return flat.view(tuple(shape))

    def clear(self) -> None:
        """Let every kept buffer (and memo) go."""
        self._roles.clear()
        self.memo.clear()


_local = threading.local()


@contextlib.contextmanager
def reusing_buffers(
    workspace: Workspace | None = None, fixed_weights: bool = False
) -> Iterator[Workspace]:
    """Within the block, :func:`scratch` reuses buffers (``workspace``, else a new one that
    is let go at the end). Nested blocks share the outermost workspace.

    ``fixed_weights``: the caller holds the model's weights fixed for the block (mi_core's run
    loops freeze them), so values derived from them may be kept (:func:`workspace_memo`) and
    are dropped when the block closes. An edit through ``.data`` does not bump a tensor's
    version, so a user's block that edits weights must not pass it."""
    outer = getattr(_local, "workspace", None)
    if outer is not None and workspace is None:
        with _fixed(outer, fixed_weights):
            yield outer
        return
    current = workspace if workspace is not None else Workspace()
    _local.workspace = current
    try:
        with _fixed(current, fixed_weights):
            yield current
    finally:
        _local.workspace = outer
        if workspace is None:
            current.clear()


def scratch(role: str, shape: Sequence[int], like: torch.Tensor) -> torch.Tensor:
    """An uninitialised buffer of ``shape`` (``like``'s dtype and device) for ``role``: reused
    inside :func:`reusing_buffers` when a kept one is free, else new."""
    workspace = getattr(_local, "workspace", None)
    if workspace is None:
        return like.new_empty(tuple(shape))
    return workspace.empty(role, shape, like)


@contextlib.contextmanager
def _fixed(workspace: Workspace, fixed_weights: bool) -> Iterator[None]:
    if not fixed_weights:
        yield
        return
    workspace.fixed_weights += 1
    try:
        yield
    finally:
        workspace.fixed_weights -= 1
        if workspace.fixed_weights == 0:
            workspace.memo.clear()


def workspace_memo() -> weakref.WeakKeyDictionary[Any, Any] | None:
    """The memo of the enclosing :func:`reusing_buffers` block opened with ``fixed_weights``
    (keyed weakly by module: what a run derives once from weights it does not change), or None
    outside one: nothing is kept past the run that made it."""
    workspace = getattr(_local, "workspace", None)
    if workspace is None or workspace.fixed_weights == 0:
        return None
    return workspace.memo
