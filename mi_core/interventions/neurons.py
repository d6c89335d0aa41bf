"""Which neurons are pruned, and two equivalent ways of removing them from a model.

A :class:`PruneMasks` records, for every MLP neuron ``[n_layers, d_mlp]`` and every attention
pre-out neuron ``[n_layers, n_heads, d_head]``, the pruning step that removed it (0: kept) and
its fill, the value that replaces its activation (0 for a zero fill; its mean activation on the
*focus* data set, measured on the model as it was when the neuron was removed, for a mean fill
-- the reference code uses the focus mean, the data set whose performance is to be kept). The
fills are saved as the tensors ``ff_offset`` and ``attn_offset`` (format 1).

Removal either

- by hooks (:meth:`PruneMasks.hooks`): ``x -> keep * x + (1 - keep) * fill`` on
  ``mlp.hook_post`` and ``attn.hook_z``; the model's weights are untouched; or
- by editing the weights (:func:`zero_pruned_weights`), for export: an MLP neuron loses its
  ``W_in`` column, ``b_in`` entry and ``W_out`` row; a pre-out neuron loses its ``W_V`` column,
  ``b_V`` entry and ``W_O`` row. A mean fill is folded into ``b_out`` / ``b_O`` as
  ``fill * W_out[neuron]`` / ``fill * W_O[head, neuron]``. With grouped-query attention the
  value weights are shared by the heads of a key-value group, so a pre-out neuron is removed by
  its ``W_O`` row alone (the same outputs), and the shared ``W_V`` column and ``b_V`` entry are
  zeroed only once every head of the group has lost that neuron.

Both give the same logits (up to float rounding); the tests check it.

A pre-out neuron's fill is in the coordinates of ``hook_z`` with the value bias in (how the
separability job loads models). On a model whose value biases were folded into ``b_O``
(:mod:`mi_core.models.value_biases`) both ways take the folded bias off the fill, so a zero
fill still means the neuron writes nothing and a mean fill writes its mean.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import torch
from jaxtyping import Bool, Float, Int
from transformer_lens import HookedTransformer

from mi_core.errors import InterventionError
from mi_core.interventions.kinds import register_kind
from mi_core.io import read_safetensors, write_safetensors
from mi_core.models.hook_context import prepended_hooks
from mi_core.models.hooks import act_name
from mi_core.models.value_biases import head_zero_values

#: The kind written into the metadata of saved masks (with ``format_version``), as every
#: intervention file has.
NEURON_MASKS_KIND = "mi_core.PruneMasks"
_FORMAT_VERSION = "1"
#: The tag masks files of an older mi_core carried instead of ``kind`` / ``format_version``:
#: such a file is refused with one line that says to write it again.
FORMAT = "mi_core.interventions.neurons/1"


def is_neuron_masks(metadata: dict[str, str]) -> bool:
    """Whether a safetensors file's metadata says it holds :class:`PruneMasks` (of this
    mi_core, or of an older one, which :meth:`PruneMasks.load` refuses)."""
    return metadata.get("kind") == NEURON_MASKS_KIND or metadata.get("format") == FORMAT


@dataclass(eq=False)
class PruneMasks:
    """Pruned MLP and attention pre-out neurons, the step each was pruned at, and their fills."""

    ff_step: Int[torch.Tensor, "n_layers d_mlp"]
    attn_step: Int[torch.Tensor, "n_layers n_heads d_head"]
    ff_fill: Float[torch.Tensor, "n_layers d_mlp"]
    attn_fill: Float[torch.Tensor, "n_layers n_heads d_head"]

    #: Its hooks act before any hook already on the model, so that caches and later hooks see
    #: the pruned activations.
    hook_position: ClassVar[str] = "first"

    @classmethod
    def empty(cls, model: HookedTransformer) -> PruneMasks:
        """Masks that keep every neuron of ``model``."""
        cfg = model.cfg
        return cls(
            ff_step=torch.zeros(cfg.n_layers, cfg.d_mlp, dtype=torch.long),
            attn_step=torch.zeros(cfg.n_layers, cfg.n_heads, cfg.d_head, dtype=torch.long),
            ff_fill=torch.zeros(cfg.n_layers, cfg.d_mlp),
            attn_fill=torch.zeros(cfg.n_layers, cfg.n_heads, cfg.d_head),
        )

    def clone(self) -> PruneMasks:
        """An independent copy."""
        return PruneMasks(
            self.ff_step.clone(),
            self.attn_step.clone(),
            self.ff_fill.clone(),
            self.attn_fill.clone(),
        )

    @property
    def ff_keep(self) -> Bool[torch.Tensor, "n_layers d_mlp"]:
        """``True`` for MLP neurons still in the model."""
        return self.ff_step == 0

    @property
    def attn_keep(self) -> Bool[torch.Tensor, "n_layers n_heads d_head"]:
        """``True`` for attention pre-out neurons still in the model."""
        return self.attn_step == 0

    @property
    def n_ff_pruned(self) -> int:
        """Number of MLP neurons removed."""
        return int((self.ff_step > 0).sum())

    @property
    def n_attn_pruned(self) -> int:
        """Number of attention pre-out neurons removed."""
        return int((self.attn_step > 0).sum())

    @property
    def n_heads_pruned(self) -> int:
        """Number of attention heads with every pre-out neuron removed."""
        return int((self.attn_step > 0).all(dim=-1).sum())

    @property
    def n_steps(self) -> int:
        """The last pruning step recorded."""
        return int(max(self.ff_step.max(), self.attn_step.max()))

    def prune(
        self,
        step: int,
        ff: Bool[torch.Tensor, "n_layers d_mlp"] | None = None,
        attn: Bool[torch.Tensor, "n_layers n_heads d_head"] | None = None,
        ff_fill: Float[torch.Tensor, "n_layers d_mlp"] | None = None,
        attn_fill: Float[torch.Tensor, "n_layers n_heads d_head"] | None = None,
    ) -> None:
        """Mark the neurons selected by ``ff`` / ``attn`` as removed at ``step`` (in place).

        Neurons already removed keep their step and fill. ``*_fill`` give the replacement
        value of every neuron (only the newly removed entries are used); ``None`` means zero.
        """
        if step < 1:
            raise InterventionError(f"pruning steps are numbered from 1, got {step}")
        for selected, steps, fills, new_fills in (
            (ff, self.ff_step, self.ff_fill, ff_fill),
            (attn, self.attn_step, self.attn_fill, attn_fill),
        ):
            if selected is None:
                continue
            if selected.shape != steps.shape:
                raise InterventionError(
                    f"selection of shape {tuple(selected.shape)} does not fit masks of shape "
                    f"{tuple(steps.shape)}"
                )
            new = selected.cpu().bool() & (steps == 0)
            steps[new] = step
            if new_fills is not None:
                fills[new] = new_fills.detach().cpu().to(fills.dtype)[new]

    # --------------------------------------------------------------------------- combine
    def _check_combinable(self, other: PruneMasks) -> None:
        if not isinstance(other, PruneMasks):
            raise InterventionError(f"cannot combine neuron masks with {type(other).__name__}")
        if (self.ff_step.shape, self.attn_step.shape) != (
            other.ff_step.shape,
            other.attn_step.shape,
        ):
            raise InterventionError("cannot combine neuron masks of different models (shapes)")

    def _merged(self, other: PruneMasks, removed_if_both: bool) -> PruneMasks:
        """Neurons removed where both (``removed_if_both``) or either mask removes them; each
        at the earlier of its removal steps, with that removal's fill."""
        self._check_combinable(other)
        parts = []
        for a_step, b_step, a_fill, b_fill in (
            (self.ff_step, other.ff_step, self.ff_fill, other.ff_fill),
            (self.attn_step, other.attn_step, self.attn_fill, other.attn_fill),
        ):
            a_on, b_on = a_step > 0, b_step > 0
            removed = (a_on & b_on) if removed_if_both else (a_on | b_on)
            from_a = a_on & (~b_on | (a_step <= b_step))
            step = torch.where(from_a, a_step, b_step)
            fill = torch.where(from_a, a_fill, b_fill)
            parts += [
                torch.where(removed, step, torch.zeros_like(step)),
                torch.where(removed, fill, torch.zeros_like(fill)),
            ]
        ff_step, ff_fill, attn_step, attn_fill = parts
        return PruneMasks(ff_step, attn_step, ff_fill, attn_fill)

    def union(self, other: PruneMasks) -> PruneMasks:
        """Keep what either keeps: a neuron stays removed only where both masks remove it."""
        return self._merged(other, removed_if_both=True)

    def intersection(self, other: PruneMasks) -> PruneMasks:
        """Keep what both keep: a neuron is removed where either mask removes it."""
        return self._merged(other, removed_if_both=False)

    def difference(self, other: PruneMasks) -> PruneMasks:
        """Keep what this mask keeps and ``other`` does not: a neuron is removed where this mask
        removes it (at its step, with its fill) or where ``other`` keeps it. A neuron kept by
        both has no removal of its own to take a step and fill from: it is removed one step
        after this mask's last, with a zero fill."""
        self._check_combinable(other)
        after = self.n_steps + 1
        parts = []
        for a_step, b_step, a_fill in (
            (self.ff_step, other.ff_step, self.ff_fill),
            (self.attn_step, other.attn_step, self.attn_fill),
        ):
            added = (a_step == 0) & (b_step == 0)
            parts += [
                torch.where(added, torch.full_like(a_step, after), a_step),
                torch.where(added, torch.zeros_like(a_fill), a_fill),
            ]
        ff_step, ff_fill, attn_step, attn_fill = parts
        return PruneMasks(ff_step, attn_step, ff_fill, attn_fill)

    __or__ = union
    __and__ = intersection
    __sub__ = difference

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PruneMasks):
            return NotImplemented
        return all(
            torch.equal(a, b)
            for a, b in zip(self.tensors().values(), other.tensors().values(), strict=True)
        )

    def __str__(self) -> str:
        return (
            f"PruneMasks({self.n_ff_pruned} MLP neurons and {self.n_attn_pruned} attention "
            f"pre-out neurons removed over {self.n_steps} steps; {self.n_heads_pruned} whole heads)"
        )

    def _check_fits(self, model: HookedTransformer) -> None:
        cfg = model.cfg
        expected = ((cfg.n_layers, cfg.d_mlp), (cfg.n_layers, cfg.n_heads, cfg.d_head))
        got = (tuple(self.ff_step.shape), tuple(self.attn_step.shape))
        if got != expected:
            raise InterventionError(
                f"masks of shapes {got} do not fit this model (expected {expected}); they were "
                "made for another model"
            )

    def hooks(self, model: HookedTransformer) -> list[tuple[str, Callable]]:
        """Forward hooks that remove the pruned neurons (for ``model.run_with_hooks``).

        Layers with nothing pruned get no hook.
        """
        self._check_fits(model)
        device, dtype = model.cfg.device, model.cfg.dtype
        hooks: list[tuple[str, Callable]] = []
        for layer in range(model.cfg.n_layers):
            for name, steps, fills in (
                (act_name("post", layer), self.ff_step[layer], self.ff_fill[layer]),
                (act_name("z", layer), self.attn_step[layer], _attn_fills(model, self, layer)),
            ):
                removed = steps > 0
                if not removed.any():
                    continue
                keep = (~removed).to(device=device, dtype=dtype)
                shift = torch.where(removed, fills, torch.zeros_like(fills)).to(
                    device=device, dtype=dtype
                )
                hooks.append((name, _masking_hook(keep, shift if shift.any() else None)))
        return hooks

    def claims(self, model: HookedTransformer) -> dict[Hashable, str]:
        """None: each neuron carries its own fill, and neurons are not checked against other
        interventions."""
        return {}

    def save(self, path: str | os.PathLike[str], metadata: dict[str, str] | None = None) -> Path:
        """Write the masks as safetensors (atomically)."""
        meta = {**(metadata or {}), "kind": NEURON_MASKS_KIND, "format_version": _FORMAT_VERSION}
        return write_safetensors(
            path,
            {
                "ff_step": self.ff_step,
                "attn_step": self.attn_step,
                "ff_offset": self.ff_fill,
                "attn_offset": self.attn_fill,
            },
            metadata=meta,
        )

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> PruneMasks:
        """Read masks written by :meth:`save`."""
        try:
            tensors, metadata = read_safetensors(path)
        except FileNotFoundError as exc:
            raise InterventionError(f"no masks file at {path}") from exc
        if not is_neuron_masks(metadata):
            raise InterventionError(
                f"{path} is not a separability masks file (kind {NEURON_MASKS_KIND})"
            )
        if metadata.get("kind") is None:
            raise InterventionError(
                f"{path} is a masks file of an older mi_core (format tag {FORMAT}, no "
                "format_version): re-run mi-core separability to write it again"
            )
        if metadata.get("format_version") != _FORMAT_VERSION:
            raise InterventionError(
                f"{path}: masks format {metadata.get('format_version')!r} is not "
                f"{_FORMAT_VERSION!r}; it was written by another mi_core version"
            )
        return cls.from_tensors(tensors)

    @classmethod
    def from_tensors(cls, tensors: dict[str, torch.Tensor], prefix: str = "") -> PruneMasks:
        """Masks from the tensors of :meth:`tensors` (optionally with a key prefix)."""
        return cls(
            ff_step=tensors[prefix + "ff_step"].long(),
            attn_step=tensors[prefix + "attn_step"].long(),
            ff_fill=tensors[prefix + "ff_offset"].float(),
            attn_fill=tensors[prefix + "attn_offset"].float(),
        )

    def tensors(self, prefix: str = "") -> dict[str, torch.Tensor]:
        """The masks as a flat tensor dict (the fills under their file names, ``*_offset``)."""
        return {
            prefix + "ff_step": self.ff_step,
            prefix + "attn_step": self.attn_step,
            prefix + "ff_offset": self.ff_fill,
            prefix + "attn_offset": self.attn_fill,
        }

    def listing(self) -> dict:
        """A JSON-ready listing: per step and layer, the indices of the neurons removed.

        ``attn`` entries are ``[head, d_head]`` pairs; ``heads`` lists heads with every pre-out
        neuron removed.
        """
        steps = []
        for step in range(1, self.n_steps + 1):
            ff, attn = {}, {}
            for layer in range(self.ff_step.shape[0]):
                ff_idx = torch.nonzero(self.ff_step[layer] == step).flatten().tolist()
                attn_idx = torch.nonzero(self.attn_step[layer] == step).tolist()
                if ff_idx:
                    ff[str(layer)] = ff_idx
                if attn_idx:
                    attn[str(layer)] = attn_idx
            steps.append({"step": step, "ff": ff, "attn": attn})
        heads = torch.nonzero((self.attn_step > 0).all(dim=-1)).tolist()
        return {
            "n_ff_pruned": self.n_ff_pruned,
            "n_attn_pruned": self.n_attn_pruned,
            "heads_fully_pruned": heads,
            "steps": steps,
        }

    def save_listing(self, path: str | os.PathLike[str]) -> Path:
        """Write :meth:`listing` as JSON (atomically), compact enough for large models."""
        from mi_core.io import write_text

        return write_text(path, json.dumps(self.listing()) + "\n")


@dataclass(eq=False)
class NeuronGates:
    """Gate values in [0, 1] for every MLP neuron and attention pre-out neuron, as a learned
    neuron mask trains them (:data:`~mi_core.pruning.mask_kinds.NEURONS`): the soft, trainable
    counterpart of :class:`PruneMasks`, with the same units and fills.

    Inside :meth:`applied` a unit's activation ``x`` becomes ``z * x + (1 - z) * fill`` at
    ``mlp.hook_post`` / ``attn.hook_z`` (``fill`` 0 for a zero fill: on a model whose value
    biases were folded the pre-out fill takes the folded bias off, as :class:`PruneMasks`
    does, so zero means the neuron writes nothing). The hooks read ``ff`` / ``attn`` when they
    run, so a training step assigns new samples without reinstalling them. ``ff`` /
    ``attn`` may hold one row per example (``[batch, ...]``): example ``i`` sees row ``i``.
    """

    ff: Float[torch.Tensor, "*batch n_layers d_mlp"]
    attn: Float[torch.Tensor, "*batch n_layers n_heads d_head"]
    ff_fill: Float[torch.Tensor, "n_layers d_mlp"]
    attn_fill: Float[torch.Tensor, "n_layers n_heads d_head"]

    @classmethod
    def ones(
        cls,
        model: HookedTransformer,
        device: torch.device | str | None = None,
        fills: PruneMasks | None = None,
    ) -> NeuronGates:
        """Gates that keep every neuron of ``model`` (fills: ``fills``' where given, else 0)."""
        base = PruneMasks.empty(model) if fills is None else fills
        base._check_fits(model)
        return cls(
            torch.ones(base.ff_fill.shape, device=device),
            torch.ones(base.attn_fill.shape, device=device),
            base.ff_fill.to(device),
            base.attn_fill.to(device),
        )

    @property
    def n_gates(self) -> int:
        """Gates of one mask: every MLP neuron, then every pre-out neuron."""
        return self.ff_fill.numel() + self.attn_fill.numel()

    def assign(self, z: Float[torch.Tensor, "*batch gates"]) -> None:
        """Put flat gate values (MLP neurons first, then pre-out neurons, each row-major; one
        row per example or one for all) into ``ff`` / ``attn``."""
        n_ff = self.ff_fill.numel()
        lead = z.shape[:-1]
        self.ff = z[..., :n_ff].reshape(*lead, *self.ff_fill.shape)
        self.attn = z[..., n_ff:].reshape(*lead, *self.attn_fill.shape)

    @contextmanager
    def kept_all(self) -> Iterator[None]:
        """Every gate at 1 inside the block (the full model), the values restored after."""
        ff, attn = self.ff, self.attn
        self.ff, self.attn = torch.ones_like(self.ff_fill), torch.ones_like(self.attn_fill)
        try:
            yield
        finally:
            self.ff, self.attn = ff, attn

    def removed(self, keep: Bool[torch.Tensor, " gates"], step: int = 1) -> PruneMasks:
        """The :class:`PruneMasks` that removes the units ``keep`` (flat, as :meth:`assign`)
        leaves out, at ``step``, with these gates' fills."""
        n_ff = self.ff_fill.numel()
        keep = keep.cpu().bool()
        masks = PruneMasks(
            torch.zeros(self.ff_fill.shape, dtype=torch.long),
            torch.zeros(self.attn_fill.shape, dtype=torch.long),
            torch.zeros(self.ff_fill.shape),
            torch.zeros(self.attn_fill.shape),
        )
        masks.prune(
            step,
            ~keep[:n_ff].reshape(self.ff_fill.shape),
            ~keep[n_ff:].reshape(self.attn_fill.shape),
            self.ff_fill.cpu(),
            self.attn_fill.cpu(),
        )
        return masks

    @contextmanager
    def applied(self, model: HookedTransformer) -> Iterator[HookedTransformer]:
        """Inside the block ``model`` runs with these gates (hooks before any other)."""
        fills = PruneMasks(
            torch.zeros(self.ff_fill.shape, dtype=torch.long),
            torch.zeros(self.attn_fill.shape, dtype=torch.long),
            self.ff_fill.cpu(),
            self.attn_fill.cpu(),
        )
        fills._check_fits(model)
        device, dtype = model.cfg.device, model.cfg.dtype
        hooks: list[tuple[str, Callable]] = []
        for layer in range(model.cfg.n_layers):
            attn_fill = _attn_fills(model, fills, layer).to(device=device, dtype=dtype)
            ff_fill = self.ff_fill[layer].to(device=device, dtype=dtype)
            hooks.append((act_name("post", layer), self._gate_hook("ff", layer, ff_fill)))
            hooks.append((act_name("z", layer), self._gate_hook("attn", layer, attn_fill)))
        with prepended_hooks(model, hooks):
            yield model

    def _gate_hook(self, site: str, layer: int, fill: torch.Tensor) -> Callable:
        unit_dims = 1 if site == "ff" else 2  # d_mlp, or heads x d_head
        filled = bool(fill.any())

        def hook(activation: torch.Tensor, hook: object) -> torch.Tensor:
            values = getattr(self, site)
            if values.ndim == unit_dims + 1:  # one mask for every example
                z = values[layer]
            else:  # one row per example: [batch, layers, ...] -> [batch, 1 (pos), ...]
                z = values[:, layer].unsqueeze(1)
            z = z.to(activation.dtype)
            return z * activation + (1 - z) * fill if filled else z * activation

        return hook


def _masking_hook(keep: torch.Tensor, shift: torch.Tensor | None) -> Callable:
    def hook(activation: torch.Tensor, hook: object) -> torch.Tensor:
        out = activation * keep
        return out if shift is None else out + shift

    return hook


def is_grouped_query(model: HookedTransformer) -> bool:
    """Whether the model's attention shares value weights across heads (GQA)."""
    n_kv = getattr(model.cfg, "n_key_value_heads", None)
    return n_kv is not None and n_kv != model.cfg.n_heads


def _attn_fills(
    model: HookedTransformer, masks: PruneMasks, layer: int
) -> Float[torch.Tensor, "head d_head"]:
    """The fills of ``layer``'s pre-out neurons in ``model``'s ``hook_z`` coordinates: as
    recorded, less the value bias where it was folded out of ``hook_z``."""
    fills = masks.attn_fill[layer]
    zero = head_zero_values(model, layer, fills)
    return fills if zero is None else fills + zero


@torch.no_grad()
def zero_pruned_weights(model: HookedTransformer, masks: PruneMasks) -> HookedTransformer:
    """Remove the pruned neurons from ``model``'s weights, in place (see the module docstring).

    Gives the same outputs as running ``model`` with :meth:`PruneMasks.hooks`, for zero and for
    mean fills (a mean fill is folded into the output bias).
    """
    masks._check_fits(model)
    grouped = is_grouped_query(model)
    for layer, block in enumerate(model.blocks):
        ff_removed = (masks.ff_step[layer] > 0).to(model.cfg.device)
        if ff_removed.any():
            mlp = block.mlp
            fill = masks.ff_fill[layer].to(mlp.W_out.device, torch.float64) * ff_removed
            mlp.b_out += (fill @ mlp.W_out.double()).to(mlp.b_out.dtype)
            mlp.W_in[:, ff_removed] = 0
            mlp.b_in[ff_removed] = 0
            mlp.W_out[ff_removed, :] = 0

        attn_removed = (masks.attn_step[layer] > 0).to(model.cfg.device)
        if attn_removed.any():
            attn = block.attn
            fill = _attn_fills(model, masks, layer).to(attn.W_O.device, torch.float64)
            fill = fill * attn_removed
            attn.b_O += torch.einsum("hd,hdm->m", fill, attn.W_O.double()).to(attn.b_O.dtype)
            attn.W_O[attn_removed] = 0
            if grouped:
                group = model.cfg.n_heads // model.cfg.n_key_value_heads
                shared = attn_removed.reshape(-1, group, model.cfg.d_head).all(dim=1)
                attn._W_V.transpose(1, 2)[shared] = 0
                attn._b_V[shared] = 0
            else:
                attn.W_V.transpose(1, 2)[attn_removed] = 0
                attn.b_V[attn_removed] = 0
    return model


register_kind(NEURON_MASKS_KIND, PruneMasks.load)
#: A file of an older mi_core carries the format tag instead of a kind: PruneMasks.load refuses
#: it with one line that says what to re-run.
register_kind(FORMAT, PruneMasks.load)
