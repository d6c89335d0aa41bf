"""A subnetwork as an intervention: a component mask with the fill of what it removes.

:class:`Subnetwork` pairs a :class:`~mi_core.interventions.mask.ComponentMask` (heads and
MLPs kept or removed) with its fill: zero, or the mean activations of a means file. The means
travel with it: :meth:`Subnetwork.save` writes the mask, the means' tensors and their identity
(the model name and weight fingerprint they were computed for, the data set, the token count)
into one safetensors file, so a saved subnetwork re-applies bit-identically to a fresh model
from that file alone::

    sub = Subnetwork(mask, "mean", means)
    sub.save("subnetwork.safetensors")
    with apply(model, Subnetwork.load("subnetwork.safetensors")):
        logits = model(**batch)

Subnetworks of one model combine on their *kept* components: ``a | b`` keeps what either keeps,
``a & b`` what both keep, ``a - b`` what ``a`` keeps and ``b`` does not (binary masks only;
the fills must agree).

The file's metadata names the fill ``ablation`` (format 1).
"""

from __future__ import annotations

import os
from collections.abc import Hashable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from mi_core.errors import InterventionError
from mi_core.interventions.ablation import Fill, fill_name, mask_hooks, removed_components
from mi_core.interventions.kinds import read_kind, register_kind
from mi_core.interventions.mask import ComponentMask
from mi_core.interventions.means import AVERAGING, ComponentMeans
from mi_core.io import write_safetensors

if TYPE_CHECKING:
    from mi_core.models.types import HookedModel

__all__ = ["SUBNETWORK_KIND", "Subnetwork"]

SUBNETWORK_KIND = "mi_core.Subnetwork"
_FORMAT_VERSION = "1"


@dataclass(eq=False)
class Subnetwork:
    """Heads and MLPs kept (``mask``) and what replaces the removed ones (``fill``,
    ``means``)."""

    mask: ComponentMask
    fill: Fill | str = Fill.MEAN
    means: ComponentMeans | None = None

    #: Its hooks act before any hook already on the model, so that caches and later hooks see
    #: the subnetwork's activations.
    hook_position: ClassVar[str] = "first"

    def __post_init__(self) -> None:
        self.fill = Fill.parse(self.fill)
        if self.fill is Fill.MEAN and self.means is None:
            raise InterventionError(
                "a mean-filled subnetwork needs its means (from mi-core means), or fill='zero'"
            )
        if self.fill is Fill.ZERO:
            self.means = None
        elif self.means is not None and self.means.n_layers != self.mask.n_layers:
            raise InterventionError(
                f"the means have {self.means.n_layers} layers but the mask {self.mask.n_layers}"
            )

    # ------------------------------------------------------------------------ intervention
    def hooks(self, model: HookedModel) -> list[tuple[str, Any]]:
        """Hooks that replace every removed head's ``hook_z`` and MLP's ``hook_mlp_out``."""
        self.mask.check_model(model)
        if self.means is not None:
            self.means.check_model(model)
        return mask_hooks(model, self.mask, self.means, self.fill)

    def claims(self, model: HookedModel) -> dict[Hashable, str]:
        """Every component it removes, each filled with :attr:`fill_name`."""
        return dict.fromkeys(removed_components(self.mask), self.fill_name)

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write mask, fill and means (with their identity) as one ``.safetensors`` file."""
        if Path(path).suffix.lower() != ".safetensors":
            raise InterventionError(f"cannot save a subnetwork as {path}: use .safetensors")
        mask = self.mask.detach()
        tensors = {"heads": mask.heads.contiguous(), "mlps": mask.mlps.contiguous()}
        metadata = {
            "kind": SUBNETWORK_KIND,
            "format_version": _FORMAT_VERSION,
            "ablation": self.fill.value,
        }
        if self.means is not None:
            tensors |= {f"means.{k}": v for k, v in self.means.tensors().items()}
            metadata |= {
                f"means.{key}": value
                for key, value in self.means.metadata().items()
                if key not in ("kind", "format_version")
            }
        return write_safetensors(path, tensors, metadata)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Subnetwork:
        """Read a subnetwork written by :meth:`save`."""
        tensors, metadata = read_kind(
            path, SUBNETWORK_KIND, "subnetwork", _FORMAT_VERSION,
            "; a mask alone is read with ComponentMask.load",
        )  # fmt: skip
        means = None
        if "means.z" in tensors:
            try:
                means = ComponentMeans.from_tensors(tensors, metadata, prefix="means.")
            except InterventionError as exc:
                raise InterventionError(f"{path}: {exc}") from None
        return cls(ComponentMask(tensors["heads"], tensors["mlps"]), metadata["ablation"], means)

    @property
    def fill_name(self) -> str:
        """What replaces a removed component, in words (``zero`` or the means' identity)."""
        return fill_name(self.fill, self.means)

    # ------------------------------------------------------------------------- comparing
    def same_fill(self, other: Subnetwork) -> bool:
        """Whether the two replace removed components by the same values."""
        if self.fill is not other.fill:
            return False
        if self.means is None or other.means is None:
            return self.means is other.means
        return (
            self.means.fingerprint == other.means.fingerprint
            and self.means.tensors().keys() == other.means.tensors().keys()
            and all(
                torch.equal(mine, other.means.tensors()[name])
                for name, mine in self.means.tensors().items()
            )
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Subnetwork):
            return NotImplemented
        return self.mask == other.mask and self.same_fill(other)

    def __str__(self) -> str:
        fill = (
            "zero"
            if self.means is None
            else f"mean over {self.means.dataset or '?'} ({AVERAGING}; weights "
            f"{self.means.fingerprint})"
        )
        return f"Subnetwork({self.mask}; removed parts filled with {fill})"

    # ------------------------------------------------------------------------- combining
    def _combine(self, other: Subnetwork, op: str) -> Subnetwork:
        if not isinstance(other, Subnetwork):
            return NotImplemented
        if not self.same_fill(other):
            raise InterventionError(
                f"cannot combine subnetworks with different fills ({self.fill.value} vs "
                f"{other.fill.value}, or other means)"
            )
        return Subnetwork(getattr(self.mask, op)(other.mask), self.fill, self.means)

    def __or__(self, other: Subnetwork) -> Subnetwork:
        return self._combine(other, "union")

    def __and__(self, other: Subnetwork) -> Subnetwork:
        return self._combine(other, "intersection")

    def __sub__(self, other: Subnetwork) -> Subnetwork:
        return self._combine(other, "difference")


register_kind(SUBNETWORK_KIND, Subnetwork.load)
