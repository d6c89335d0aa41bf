"""Names of the prunable components: attention heads ``L2.H5`` and MLP layers ``L7.MLP``.

Every attention head and every MLP layer is one mask entry (the paper's components). Names are
zero-based, as in TransformerLens (``L2.H5`` is ``blocks.2.attn.hook_z[:, :, 5]``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from mi_core.errors import InterventionError
from mi_core.naming import Component


@dataclass(frozen=True)
class ModelDims:
    """The dimensions of a transformer that masks, means and component names depend on."""

    n_layers: int
    n_heads: int
    d_head: int
    d_model: int
    d_mlp: int | None = None
    """None for a model without MLPs."""


def model_dims(cfg_or_model: Any) -> ModelDims:
    """The dimensions of a hooked model, of its TransformerLens config, or of any object with
    ``n_layers``, ``n_heads``, ``d_head`` and ``d_model`` (and optionally ``d_mlp``)."""
    cfg = getattr(cfg_or_model, "cfg", cfg_or_model)
    if not all(hasattr(cfg, name) for name in ("n_layers", "n_heads", "d_head", "d_model")):
        raise InterventionError(
            "expected a hooked model or a HookedTransformerConfig, "
            f"got {type(cfg_or_model).__name__}"
        )
    return ModelDims(
        cfg.n_layers, cfg.n_heads, cfg.d_head, cfg.d_model, getattr(cfg, "d_mlp", None)
    )


def parse_components(
    spec: str | Iterable[str | Component | tuple[int, int]], cfg_or_model: Any | None = None
) -> list[Component]:
    """Parse ``"L2.H5,L3.H7,L4.MLP"`` (or an iterable of names, :class:`Component` s or
    TransformerLens-style ``(layer, head)`` tuples) into sorted, unique components.

    With a model or config, every component must exist in it.
    """
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    components = set()
    for item in items:
        if isinstance(item, Component):
            components.add(item)
        elif isinstance(item, str):
            if item.strip():
                components.add(Component.parse(item))
        else:
            components.add(Component(*_head_pair(item)))
    if cfg_or_model is not None:
        cfg = model_dims(cfg_or_model)
        for component in components:
            component.check(cfg.n_layers, cfg.n_heads)
    return sorted(components, key=_order)


def _head_pair(item: Any) -> tuple[int, int]:
    """A ``(layer, head)`` pair of integers: a tuple or list, its items Python, NumPy or 0-d
    torch integers (what ``argmax`` / ``topk`` / ``nonzero().tolist()`` hand back)."""
    if hasattr(item, "tolist") and not isinstance(item, list | tuple):
        item = item.tolist()  # a [2] tensor or array
    if isinstance(item, list | tuple) and len(item) == 2:
        values = [i.item() if hasattr(i, "item") and not isinstance(i, int) else i for i in item]
        if all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
            return values[0], values[1]
    raise InterventionError(
        f"a head is a (layer, head) pair of non-negative integers or a name like 'L2.H5', not "
        f"{item!r}"
    )


def all_heads(cfg_or_model: Any) -> list[Component]:
    """Every attention head of a model, layer by layer."""
    cfg = model_dims(cfg_or_model)
    return [Component(l, h) for l in range(cfg.n_layers) for h in range(cfg.n_heads)]


def format_components(components: Iterable[Component]) -> str:
    """``L2.H5,L3.H7,L4.MLP``: the inverse of :func:`parse_components`."""
    return ",".join(str(c) for c in sorted(components, key=_order))


def _order(component: Component) -> tuple[int, int]:
    # Heads of a layer first, then its MLP, as in the forward pass.
    return (component.layer, component.head if component.head is not None else 1 << 30)
