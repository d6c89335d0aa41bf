"""One name for a head or an MLP, everywhere: ``L2.H5`` (head 5 of layer 2) and ``L7.MLP``.

:class:`Component` is the only type that builds or reads these names; masks, circuits (whose
nodes add ``.q`` / ``.k`` / ``.v`` for a head's inputs), tables and figures all go through it.
Names are zero-based, as in TransformerLens (``L2.H5`` is ``blocks.2.attn.hook_z[:, :, 5]``).
It sits in the bottom layer so that models, data and figures can use it too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from mi_core.errors import InterventionError

__all__ = ["Component"]

_NAME = re.compile(r"^L(\d+)\.(?:H(\d+)|(MLP))$", re.IGNORECASE)


@dataclass(frozen=True, order=True)
class Component:
    """One attention head (``head`` set) or one MLP layer (``head`` None)."""

    layer: int
    head: int | None = None

    @property
    def is_mlp(self) -> bool:
        """True for an MLP layer, False for an attention head."""
        return self.head is None

    def __str__(self) -> str:
        return f"L{self.layer}.MLP" if self.head is None else f"L{self.layer}.H{self.head}"

    @classmethod
    def parse(cls, name: str) -> Component:
        """Parse ``L2.H5`` (head 5 of layer 2) or ``L7.MLP`` (the MLP of layer 7)."""
        match = _NAME.match(name.strip())
        if not match:
            raise InterventionError(
                f"cannot parse component {name.strip()!r}; expected L<layer>.H<head> "
                "(e.g. L2.H5) or L<layer>.MLP (e.g. L7.MLP)"
            )
        layer, head, _ = match.groups()
        return cls(int(layer), None if head is None else int(head))

    def check(self, n_layers: int, n_heads: int) -> Component:
        """Return self if it exists in a model of ``n_layers`` x ``n_heads``, else raise."""
        if self.layer >= n_layers:
            raise InterventionError(
                f"component {self} does not exist: the model has {n_layers} layers "
                f"(L0-L{n_layers - 1})"
            )
        if self.head is not None and self.head >= n_heads:
            raise InterventionError(
                f"component {self} does not exist: the model has {n_heads} heads per layer "
                f"(H0-H{n_heads - 1})"
            )
        return self
