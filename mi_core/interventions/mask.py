"""Component masks: one value in [0, 1] per attention head and per MLP layer.

A mask is plain data (pyvene style): save it, load it, print it, apply it to a fresh model::

    mask = ComponentMask.from_removed(model, "L2.H5,L3.H7")
    mask.save("mask.json")                      # or .safetensors
    with ablate(model, ComponentMask.load("mask.json"), means): ...

Entry 1 keeps a component, 0 removes it (replaces its output by the fill, see
:mod:`mi_core.interventions.ablation`), values in between interpolate. The tensors may require
grad: a pruning loop sets them to hard-concrete samples and gradients reach them.

A mask may also hold one mask per example (``heads [batch, n_layers, n_heads]``, ``mlps
[batch, n_layers]``): :meth:`ComponentMask.stack` builds one from several masks, and inside
:func:`~mi_core.interventions.ablation.ablate` example ``i`` of the batch sees row ``i``. Many
subnetworks then run in one forward pass over the repeated inputs (what a batched pruning sweep
does)::

    per_example = ComponentMask.stack([mask_a, mask_b], sizes=[8, 8])
    with ablate(model, per_example, means):
        logits = model(**batch_of_16)          # rows 0-7 under mask_a, rows 8-15 under mask_b
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from jaxtyping import Float
from safetensors import SafetensorError

from mi_core.errors import InterventionError
from mi_core.interventions.components import (
    Component,
    ModelDims,
    format_components,
    model_dims,
    parse_components,
)
from mi_core.io import read_json, read_safetensors, write_json, write_safetensors

MASK_KIND = "mi_core.ComponentMask"
_FORMAT_VERSION = "1"
#: The most layers or heads a mask file may declare: far above any model's, far below a size
#: whose allocation would exhaust memory.
MAX_MASK_SIDE = 4096


@dataclass(eq=False)
class ComponentMask:
    """Per-head values ``heads[layer, head]`` and per-MLP values ``mlps[layer]`` in [0, 1]."""

    heads: Float[torch.Tensor, "*batch n_layers n_heads"]
    mlps: Float[torch.Tensor, "*batch n_layers"]

    def __post_init__(self) -> None:
        self.heads = _as_float(self.heads, "heads")
        self.mlps = _as_float(self.mlps, "mlps")
        if (
            self.heads.ndim not in (2, 3)
            or self.mlps.ndim != self.heads.ndim - 1
            or self.mlps.shape != self.heads.shape[:-1]
        ):
            raise InterventionError(
                f"mask shapes do not fit: heads {list(self.heads.shape)} and mlps "
                f"{list(self.mlps.shape)}; expected heads [n_layers, n_heads] and mlps [n_layers] "
                "(or one mask per example: [batch, n_layers, n_heads] and [batch, n_layers])"
            )
        for name, values in (("heads", self.heads), ("mlps", self.mlps)):
            bad = ~((values >= 0) & (values <= 1))
            if bool(bad.any()):
                index = tuple(int(i) for i in bad.nonzero()[0])
                component = Component(index[0], index[1] if name == "heads" else None)
                raise InterventionError(
                    f"mask value {float(values[index]):g} for {component} is outside [0, 1]; "
                    "every mask value must lie in [0, 1]"
                )

    # ----------------------------------------------------------------------------------- make
    @classmethod
    def ones(
        cls,
        cfg_or_model: Any,
        device: torch.device | str | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> ComponentMask:
        """The mask that keeps every component."""
        cfg = model_dims(cfg_or_model)
        return cls(
            torch.ones(cfg.n_layers, cfg.n_heads, device=device, dtype=dtype),
            torch.ones(cfg.n_layers, device=device, dtype=dtype),
        )

    @classmethod
    def from_removed(
        cls, cfg_or_model: Any, removed: str | list[str] | list[Component]
    ) -> ComponentMask:
        """Keep everything except ``removed`` (``"L2.H5,L4.H0,L7.MLP"`` or a list of names)."""
        mask = cls.ones(cfg_or_model)
        for component in parse_components(removed, cfg_or_model):
            if component.is_mlp:
                mask.mlps[component.layer] = 0.0
            else:
                mask.heads[component.layer, component.head] = 0.0
        return mask

    @classmethod
    def from_kept(cls, cfg_or_model: Any, kept: str | list[str] | list[Component]) -> ComponentMask:
        """Remove everything except ``kept`` (``"L2.H5,L7.MLP"`` or a list of names)."""
        return cls.from_removed(cfg_or_model, kept).complement()

    @classmethod
    def stack(
        cls, masks: Sequence[ComponentMask], sizes: Sequence[int] | None = None
    ) -> ComponentMask:
        """One mask per example: ``masks[k]`` repeated ``sizes[k]`` times (default once each),
        in order, along a leading batch axis. Differentiable (gradients reach each mask)."""
        if not masks:
            raise InterventionError("stack needs at least one mask")
        sizes = [1] * len(masks) if sizes is None else [int(n) for n in sizes]
        if len(sizes) != len(masks) or any(n < 0 for n in sizes):
            raise InterventionError(
                f"stack needs one non-negative size per mask; got {len(sizes)} sizes for "
                f"{len(masks)} masks"
            )
        shapes = {tuple(m.heads.shape) for m in masks}
        if len(shapes) != 1 or any(m.batch_size is not None for m in masks):
            raise InterventionError(f"stack needs single masks of one shape; got {sorted(shapes)}")
        repeats = torch.tensor(sizes, device=masks[0].heads.device)
        heads = torch.stack([m.heads for m in masks]).repeat_interleave(repeats, dim=0)
        mlps = torch.stack([m.mlps for m in masks]).repeat_interleave(repeats, dim=0)
        return cls(heads, mlps)

    def unstack(self) -> list[ComponentMask]:
        """The mask of every example of a per-example mask, in order."""
        if self.batch_size is None:
            raise InterventionError("unstack needs a per-example mask (see ComponentMask.stack)")
        return [ComponentMask(h, m) for h, m in zip(self.heads, self.mlps, strict=True)]

    # --------------------------------------------------------------------------- combine
    def _binary_pair(self, other: ComponentMask, op: str) -> tuple[torch.Tensor, ...]:
        self._single(f"the {op} of masks")
        if not isinstance(other, ComponentMask):
            raise InterventionError(f"cannot take the {op} of a mask and {type(other).__name__}")
        if self.heads.shape != other.heads.shape:
            raise InterventionError(
                f"cannot take the {op} of masks of shapes {list(self.heads.shape)} and "
                f"{list(other.heads.shape)}"
            )
        if not (self.is_binary() and other.is_binary()):
            raise InterventionError(f"the {op} of masks is defined for binary masks only")
        a, b = self.detach(), other.detach()
        return a.heads.bool(), a.mlps.bool(), b.heads.bool(), b.mlps.bool()

    def union(self, other: ComponentMask) -> ComponentMask:
        """Keep what either mask keeps."""
        ah, am, bh, bm = self._binary_pair(other, "union")
        return ComponentMask((ah | bh).float(), (am | bm).float())

    def intersection(self, other: ComponentMask) -> ComponentMask:
        """Keep what both masks keep (the heuristic core of two subnetworks)."""
        ah, am, bh, bm = self._binary_pair(other, "intersection")
        return ComponentMask((ah & bh).float(), (am & bm).float())

    def difference(self, other: ComponentMask) -> ComponentMask:
        """Keep what this mask keeps and ``other`` does not."""
        ah, am, bh, bm = self._binary_pair(other, "difference")
        return ComponentMask((ah & ~bh).float(), (am & ~bm).float())

    def complement(self) -> ComponentMask:
        """Keep what this mask removes (binary masks only)."""
        self._single("the complement")
        if not self.is_binary():
            raise InterventionError("the complement of a mask is defined for binary masks only")
        d = self.detach()
        return ComponentMask(1.0 - d.heads, 1.0 - d.mlps)

    __or__ = union
    __and__ = intersection
    __sub__ = difference
    __invert__ = complement

    # ----------------------------------------------------------------------------------- read
    @property
    def n_layers(self) -> int:
        return int(self.heads.shape[-2])

    @property
    def n_heads(self) -> int:
        return int(self.heads.shape[-1])

    @property
    def batch_size(self) -> int | None:
        """The number of examples of a per-example mask; None for one mask for every example."""
        return int(self.heads.shape[0]) if self.heads.ndim == 3 else None

    @property
    def n_components(self) -> int:
        """Heads plus MLP layers (of one mask)."""
        return self.n_layers * (self.n_heads + 1)

    def _single(self, what: str) -> None:
        if self.batch_size is not None:
            raise InterventionError(
                f"{what} is defined for one mask, not a per-example mask of {self.batch_size} "
                "examples; take one of mask.unstack()"
            )

    def removed(self) -> list[Component]:
        """Components whose value is exactly 0."""
        return [c for c, v in self._items() if v == 0.0]

    def partial(self) -> dict[Component, float]:
        """Components whose value lies strictly between 0 and 1."""
        return {c: v for c, v in self._items() if 0.0 < v < 1.0}

    @contextmanager
    def kept_all(self) -> Iterator[None]:
        """Every value at 1 inside the block (inside :func:`ablate`: the full model, each
        ablation's input left as it is, ``1 * x + 0 * fill``), the values restored after."""
        heads, mlps = self.heads, self.mlps
        self.heads, self.mlps = torch.ones_like(heads), torch.ones_like(mlps)
        try:
            yield
        finally:
            self.heads, self.mlps = heads, mlps

    def is_binary(self) -> bool:
        """True when every value is 0 or 1."""
        return not self.partial()

    def sparsity(self) -> float:
        """Fraction of components removed, counting a partial value v as 1 - v."""
        self._single("sparsity")
        total = float((1 - self.heads.detach()).sum() + (1 - self.mlps.detach()).sum())
        return total / self.n_components

    def check_model(self, cfg_or_model: Any) -> None:
        """Raise :class:`InterventionError` unless the mask's shape fits the model."""
        cfg = model_dims(cfg_or_model)
        if (self.n_layers, self.n_heads) != (cfg.n_layers, cfg.n_heads):
            raise InterventionError(
                f"mask of shape heads [{self.n_layers}, {self.n_heads}] does not fit a model with "
                f"{cfg.n_layers} layers x {cfg.n_heads} heads"
            )

    def to(self, device: torch.device | str | None = None, dtype: torch.dtype | None = None):
        """The same mask on another device or dtype (differentiable, like ``Tensor.to``)."""
        return ComponentMask(self.heads.to(device, dtype), self.mlps.to(device, dtype))

    def detach(self) -> ComponentMask:
        """A copy cut from the autograd graph, on the CPU, in float32."""
        return ComponentMask(
            self.heads.detach().float().cpu().clone(), self.mlps.detach().float().cpu().clone()
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ComponentMask):
            return NotImplemented
        return bool(
            self.heads.shape == other.heads.shape
            and torch.equal(self.heads.detach().cpu(), other.heads.detach().cpu())
            and torch.equal(self.mlps.detach().cpu(), other.mlps.detach().cpu())
        )

    def __str__(self) -> str:
        if self.batch_size is not None:
            return (
                f"ComponentMask(per example: {self.batch_size} x {self.n_layers} layers x "
                f"{self.n_heads} heads)"
            )
        removed = self.removed()
        listed = format_components(removed[:12]) + (",..." if len(removed) > 12 else "")
        text = (
            f"ComponentMask({self.n_layers} layers x {self.n_heads} heads; "
            f"{len(removed)}/{self.n_components} removed"
        )
        if removed:
            text += f": {listed}"
        partial = self.partial()
        if partial:
            text += f"; {len(partial)} partial"
        return text + ")"

    # ----------------------------------------------------------------------------------- save
    def to_json(self) -> dict[str, Any]:
        """Readable form: shape, removed components, and any value strictly between 0 and 1."""
        self._single("saving")
        out: dict[str, Any] = {
            "kind": MASK_KIND,
            "format_version": _FORMAT_VERSION,
            "n_layers": self.n_layers,
            "n_heads": self.n_heads,
            "n_removed": len(self.removed()),
            "n_components": self.n_components,
            "removed": [str(c) for c in self.removed()],
        }
        partial = self.partial()
        if partial:
            out["partial"] = {str(c): v for c, v in partial.items()}
        return out

    @classmethod
    def from_json(cls, data: Any) -> ComponentMask:
        """Inverse of :meth:`to_json`; anything else (another kind or format version, a shape
        that is not two whole numbers up to :data:`MAX_MASK_SIDE`, names that are not strings,
        values that are not numbers in [0, 1]) raises :class:`InterventionError`."""
        if not isinstance(data, dict):
            raise InterventionError("not a component mask: expected a JSON object")
        kind, version = data.get("kind", MASK_KIND), data.get("format_version", _FORMAT_VERSION)
        if kind != MASK_KIND:
            raise InterventionError(f"not a component mask: its kind is {kind!r}")
        if version != _FORMAT_VERSION:
            raise InterventionError(
                f"mask format {version!r} is not {_FORMAT_VERSION!r} (written by another mi_core "
                "version); write the mask again"
            )
        shape = [data.get("n_layers"), data.get("n_heads")]
        if not all(type(v) is int and 1 <= v <= MAX_MASK_SIDE for v in shape):
            raise InterventionError(
                f"mask n_layers and n_heads must be whole numbers from 1 to {MAX_MASK_SIDE}, "
                f"not {shape[0]!r} and {shape[1]!r}"
            )
        n_layers, n_heads = shape
        removed, partial = data.get("removed", []), data.get("partial", {})
        if not isinstance(removed, list) or not all(isinstance(n, str) for n in removed):
            raise InterventionError(
                f'mask "removed" must be a list of component names such as ["L0.H1", "L2.MLP"], '
                f"not {removed!r}"[:200]
            )
        if not isinstance(partial, dict) or not all(
            type(v) in (int, float) for v in partial.values()
        ):
            raise InterventionError(
                f'mask "partial" must map component names to numbers, not {partial!r}'[:200]
            )
        dims = ModelDims(n_layers, n_heads, d_head=0, d_model=0)  # a mask needs only these two
        mask = cls.from_removed(dims, removed)
        for name, value in partial.items():
            component = Component.parse(name).check(n_layers, n_heads)
            if component.is_mlp:
                mask.mlps[component.layer] = float(value)
            else:
                mask.heads[component.layer, component.head] = float(value)
        return cls(mask.heads, mask.mlps)

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write ``.safetensors`` (exact tensors) or ``.json`` (readable), atomically."""
        self._single("saving")
        suffix = Path(path).suffix.lower()
        if suffix == ".json":
            return write_json(path, self.to_json())
        if suffix == ".safetensors":
            detached = self.detach()
            return write_safetensors(
                path,
                {"heads": detached.heads, "mlps": detached.mlps},
                {"kind": MASK_KIND, "format_version": _FORMAT_VERSION},
            )
        raise InterventionError(f"cannot save a mask as {path}: use a .json or .safetensors name")

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> ComponentMask:
        """Read a mask written by :meth:`save` (``.safetensors`` or ``.json``)."""
        path = Path(path)
        suffix = path.suffix.lower()
        if suffix not in (".json", ".safetensors"):
            raise InterventionError(
                f"cannot read a mask from {path}: expected .json or .safetensors"
            )
        if not path.is_file():
            raise InterventionError(f"mask file {path} does not exist")
        if suffix == ".json":
            try:
                data = read_json(path)
            except (ValueError, UnicodeDecodeError) as exc:
                raise InterventionError(f"mask file {path} is not valid JSON ({exc})") from exc
            try:
                return cls.from_json(data)
            except InterventionError as exc:
                raise InterventionError(f"{path}: {exc}") from None
        try:
            tensors, metadata = read_safetensors(path)
        except (SafetensorError, OSError, ValueError) as exc:
            raise InterventionError(f"mask file {path} is not a safetensors file ({exc})") from exc
        version = metadata.get("format_version", _FORMAT_VERSION)
        if version != _FORMAT_VERSION:
            raise InterventionError(
                f"{path}: mask format {version!r} is not {_FORMAT_VERSION!r} (written by another "
                "mi_core version); write the mask again"
            )
        if metadata.get("kind", MASK_KIND) != MASK_KIND or not {"heads", "mlps"} <= set(tensors):
            raise InterventionError(
                f"{path} is not a component mask (kind {metadata.get('kind')!r}, "
                f"tensors {sorted(tensors)}); expected tensors heads and mlps"
            )
        return cls(tensors["heads"], tensors["mlps"])

    def _items(self) -> list[tuple[Component, float]]:
        self._single("listing components")
        heads = self.heads.detach().cpu().tolist()
        mlps = self.mlps.detach().cpu().tolist()
        items: list[tuple[Component, float]] = []
        for layer in range(self.n_layers):
            items += [(Component(layer, h), v) for h, v in enumerate(heads[layer])]
            items.append((Component(layer), mlps[layer]))
        return items


def _as_float(values: Any, name: str) -> torch.Tensor:
    if not isinstance(values, torch.Tensor):
        try:
            values = torch.as_tensor(values, dtype=torch.float32)
        except (TypeError, ValueError) as exc:
            raise InterventionError(f"mask {name} must be a tensor of numbers ({exc})") from exc
    if not torch.is_floating_point(values):
        values = values.to(torch.float32)
    return values
