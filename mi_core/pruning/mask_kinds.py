"""What a learned mask gates: one :class:`MaskKind` per kind of unit, for the one pruning loop.

The loop (:mod:`~mi_core.pruning.loop`, :mod:`~mi_core.pruning.step`) learns a flat tensor of
hard-concrete gates, one per unit, with one Lagrangian, schedule and checkpoint format; the
kind says how many gates there are, what object carries their values into the model, how that
object is applied, and how a sample is put into it:

- :data:`COMPONENTS`: one gate per attention head and per MLP (the heuristic-core paper's
  units; :class:`~mi_core.interventions.ComponentMask` inside
  :func:`~mi_core.interventions.ablate`, a removed component mean- or zero-filled).
- :data:`NEURONS`: one gate per MLP neuron and per attention pre-out neuron (the separability
  report's units, as :class:`~mi_core.interventions.neurons.PruneMasks` names them;
  :class:`~mi_core.interventions.neurons.NeuronGates`, zero- or mean-filled).

Edges are learned by :func:`~mi_core.circuits.prune_edges` on the fused edge engine, with the
same gates, Lagrangian, objectives and checkpoint format.

Both mask objects have ``kept_all()`` (every gate at 1 inside the block: how an objective
computes the full model's distributions in the step).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from jaxtyping import Float
from transformer_lens import HookedTransformer

from mi_core.errors import ConfigError
from mi_core.interventions import ComponentMask, ablate
from mi_core.interventions.components import model_dims
from mi_core.interventions.neurons import NeuronGates, PruneMasks
from mi_core.pruning.discretize import make_gates, unflatten_components
from mi_core.pruning.hard_concrete import HardConcrete
from mi_core.seeding import derive_seed

if TYPE_CHECKING:
    from mi_core.interventions import ComponentMeans
    from mi_core.models.types import HookedModel
    from mi_core.pruning.profiles import PruneConfig

__all__ = ["COMPONENTS", "MASK_KINDS", "NEURONS", "Components", "MaskKind", "Neurons"]


class MaskKind(ABC):
    """One kind of learned unit (see the module docstring)."""

    name: ClassVar[str]

    @abstractmethod
    def n_gates(self, model: HookedModel) -> int:
        """The number of gates of one mask on ``model``."""

    def gates(self, cfg: PruneConfig, model: HookedModel) -> HardConcrete:
        """A run's fresh gates, initialised from its seed as ``cfg`` says."""
        generator = torch.Generator().manual_seed(derive_seed("prune", "init", cfg.seed, 0))
        return HardConcrete(
            self.n_gates(model),
            cfg.beta,
            init_mean=cfg.log_alpha_init,
            init_std=cfg.log_alpha_init_std,
            generator=generator,
        )

    @abstractmethod
    def blank(self, model: HookedModel, device: torch.device, fills: Any = None) -> Any:
        """The mask object, every gate at 1, on ``device``."""

    @abstractmethod
    def assign(self, mask: Any, z: Float[torch.Tensor, "*batch gates"]) -> None:
        """Put flat gate values (one row, or one per example) into ``mask``."""

    @abstractmethod
    def applied(
        self, model: HookedModel, mask: Any, means: ComponentMeans | None, fill: str
    ) -> AbstractContextManager[Any]:
        """The block inside which ``model`` runs under ``mask``."""


class Components(MaskKind):
    """Heads and MLPs: flat gates heads first (layer-major), then one per MLP."""

    name = "components"

    def n_gates(self, model):
        dims = model_dims(model)
        return dims.n_layers * dims.n_heads + dims.n_layers

    def gates(self, cfg, model):
        """In eval mode these give the run's own subnetwork (:func:`make_gates`)."""
        dims = model_dims(model)
        return make_gates(cfg, dims.n_layers, dims.n_heads)

    def blank(self, model, device, fills=None):
        return ComponentMask.ones(model, device=device)

    def assign(self, mask, z):
        mask.heads, mask.mlps = unflatten_components(z, mask.n_layers, mask.n_heads)

    def applied(self, model, mask, means, fill):
        return ablate(model, mask, means, fill, skip_unmasked=False)


class Neurons(MaskKind):
    """MLP neurons and attention pre-out neurons: flat gates every MLP neuron first
    (``[n_layers, d_mlp]`` row-major), then every pre-out neuron (``[n_layers, n_heads,
    d_head]``). ``fills``: a :class:`PruneMasks` whose fills replace a removed neuron (its
    focus mean, say); none: zero."""

    name = "neurons"

    def n_gates(self, model):
        return _neuron_model(model).n_gates

    def blank(self, model, device, fills: PruneMasks | None = None):
        return NeuronGates.ones(_neuron_model(model).model, device=device, fills=fills)

    def assign(self, mask, z):
        mask.assign(z)

    def applied(self, model, mask, means, fill):
        return mask.applied(model)


@dataclass(frozen=True)
class _NeuronModel:
    model: HookedTransformer
    n_gates: int


def _neuron_model(model: HookedModel) -> _NeuronModel:
    """``model`` as neuron masks take it (a decoder with dense MLPs), and its gate count."""
    if not isinstance(model, HookedTransformer):
        raise ConfigError(
            f"neuron masks gate a decoder's MLP and pre-out neurons; {type(model).__name__} is "
            "not one: learn head and MLP masks"
        )
    cfg = model.cfg
    if getattr(cfg, "num_experts", None) or cfg.d_mlp is None:
        raise ConfigError(
            "a mixture-of-experts MLP has no neurons shared by every token to gate; learn head "
            "and MLP masks"
        )
    return _NeuronModel(model, cfg.n_layers * (cfg.d_mlp + cfg.n_heads * cfg.d_head))


COMPONENTS = Components()
NEURONS = Neurons()
#: Every kind of unit the pruning loop learns, by name.
MASK_KINDS: dict[str, MaskKind] = {k.name: k for k in (COMPONENTS, NEURONS)}
