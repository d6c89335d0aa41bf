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

- Edges (:class:`mi_core.circuits.prune.Edges`, made per graph by
  :func:`~mi_core.circuits.prune_edges`): one gate per edge of the fused edge engine, and one
  per sender after them where node masks are learned too. A removed edge carries the
  counterfactual prompt's activation, which a step records for its batch first, so that kind
  takes its own step (:attr:`MaskKind.own_step`) inside the same loop, checkpoint and
  schedules.

A kind also says what it learns from: the objective's resolution, the data order
(:class:`Schedule` by default), the per-example targets, the
Lagrangian controller (a second term where a kind has two gate sets) and the checkpoint's
file name. Both node mask objects have ``kept_all()`` (every gate at 1 inside the block: how
an objective computes the full model's distributions in the step).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from jaxtyping import Float
from transformer_lens import HookedTransformer

from mi_core.data.batches import PairBatches, TokenizedPairs
from mi_core.errors import ConfigError
from mi_core.interventions import ComponentMask, ablate
from mi_core.interventions.components import model_dims
from mi_core.interventions.neurons import NeuronGates, PruneMasks
from mi_core.pruning.discretize import make_gates, unflatten_components
from mi_core.pruning.hard_concrete import HardConcrete
from mi_core.pruning.lagrangian import LagrangianController
from mi_core.pruning.objectives import Objective, Targets, resolve_objective
from mi_core.seeding import derive_seed

if TYPE_CHECKING:
    from mi_core.interventions import ComponentMeans
    from mi_core.models.types import HookedModel

__all__ = [
    "COMPONENTS",
    "MASK_KINDS",
    "NEURONS",
    "Components",
    "MaskKind",
    "Neurons",
    "Schedule",
]


class Schedule:
    """Which examples micro-batch ``k`` holds: a function of the seed and ``k`` only."""

    def __init__(self, tokenized: TokenizedPairs, batch_size: int, seed: int) -> None:
        self.batches = PairBatches(
            tokenized, batch_size, shuffle=True, seed=seed, drop_last=True, sort_by_length=True
        )
        self._epoch = -1
        self._order: list[list[int]] = []

    def indices(self, k: int) -> list[int]:
        if not self._order:
            self._epoch, self._order = 0, self._batches(0)
        epoch, position = divmod(k, len(self._order))
        if epoch != self._epoch:
            self._epoch, self._order = epoch, self._batches(epoch)
        return self._order[position]

    def _batches(self, epoch: int) -> list[list[int]]:
        return self.batches.batch_indices(epoch)


class MaskKind(ABC):
    """One kind of learned unit (see the module docstring)."""

    name: ClassVar[str]
    own_step: ClassVar[bool] = False
    """Whether the loop calls the kind's :meth:`step` (else the shared batched step of
    :mod:`~mi_core.pruning.step`)."""
    checkpoint_file: ClassVar[str] = "checkpoint.safetensors"
    """The checkpoint's name in a run's folder."""

    @abstractmethod
    def n_gates(self, model: HookedModel) -> int:
        """The number of gates of one mask on ``model``."""

    def gates(self, cfg: Any, model: HookedModel) -> HardConcrete:
        """A run's fresh gates, initialised from its seed as ``cfg`` (the kind's recipe: a
        :class:`~mi_core.pruning.profiles.PruneConfig` for node masks) says."""
        generator = torch.Generator().manual_seed(derive_seed("prune", "init", cfg.seed, 0))
        return HardConcrete(
            self.n_gates(model),
            cfg.beta,
            init_mean=cfg.log_alpha_init,
            init_std=cfg.log_alpha_init_std,
            generator=generator,
        )

    def controller(self) -> LagrangianController:
        """A run's fresh Lagrangian controller (its lambdas)."""
        return LagrangianController()

    def objective(self, name: str, data: Any) -> Objective:
        """The objective ``name`` resolved and checked for ``data`` (one line if it is not
        defined on it)."""
        return resolve_objective(name, data)

    def schedule(self, data: Any, batch_size: int, seed: int) -> Any:
        """The data order: ``indices(k)``, the examples of micro-batch ``k``."""
        return Schedule(data, batch_size, seed)

    def targets(
        self, model: HookedModel, objective: Objective, data: Any, reference: torch.Tensor | None
    ) -> Targets:
        """What the objective compares each training example with."""
        return objective.targets(data, reference)

    def step(
        self,
        model: HookedModel,
        mask: Any,
        member: Any,
        data: Any,
        indices: list[list[int]],
        targets: Targets,
        objective: Objective,
        precision: str,
    ) -> dict[str, float]:
        """One run's step on the micro-batches ``indices`` of ``data`` (kinds with
        :attr:`own_step`): the sample, the masked forward, the loss and its backward, and the
        step's log values as :func:`~mi_core.pruning.step.pruning_step` returns them."""
        raise NotImplementedError(f"{self.name} masks take the shared pruning step")

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
