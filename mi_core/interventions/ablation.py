"""Apply a component mask to a hooked model: ``out = z * x + (1 - z) * fill``.

``x`` is a head's ``blocks.{l}.attn.hook_z`` (per head) or a layer's ``blocks.{l}.hook_mlp_out``,
``z`` its mask value, and ``fill`` the mean activation (mean ablation, the default) or zero (zero
ablation). The ablation type only chooses the fill; the arithmetic is the same. Works for hooked
encoders and decoders alike (the hook names are shared)::

    with ablate(model, ComponentMask.from_removed(model, "L2.H5"), means):
        logits = model(**batch)

Hooks read ``mask.heads`` and ``mask.mlps`` when they run, so a training loop may assign new
tensors (e.g. hard-concrete samples that require grad) to the same mask object every step and
gradients reach them. Layers whose values are all 1 and do not require grad when the hooks are
made get no hook at all.
"""

from __future__ import annotations

import contextlib
import enum
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch
from jaxtyping import Float

from mi_core.errors import InterventionError
from mi_core.interventions.mask import ComponentMask
from mi_core.interventions.means import ComponentMeans
from mi_core.models.hook_context import prepended_hooks
from mi_core.models.hooks import act_name

if TYPE_CHECKING:
    from mi_core.models.types import HookedModel

Hook = Callable[..., torch.Tensor]


class Ablation(str, enum.Enum):
    """What a removed component's output is replaced by."""

    MEAN = "mean"
    ZERO = "zero"

    @classmethod
    def parse(cls, value: str | Ablation) -> Ablation:
        """``"mean"`` or ``"zero"`` (or an :class:`Ablation`)."""
        try:
            return cls(value)
        except ValueError:
            raise InterventionError(
                f"unknown ablation {value!r}; expected one of {[a.value for a in cls]}"
            ) from None


def head_fill_values(
    means: ComponentMeans | None, ablation: Ablation, layer: int, like: torch.Tensor
) -> Float[torch.Tensor, "n_heads d_head"] | None:
    """Fill for the heads of ``layer`` (None for zero ablation), on ``like``'s device and dtype."""
    if ablation is Ablation.ZERO:
        return None
    return means.cast(like.device, like.dtype)[0][layer]


def mlp_fill_values(
    means: ComponentMeans | None, ablation: Ablation, layer: int, like: torch.Tensor
) -> Float[torch.Tensor, " d_model"] | None:
    """Fill for the MLP of ``layer`` (None for zero ablation)."""
    if ablation is Ablation.ZERO:
        return None
    return means.cast(like.device, like.dtype)[1][layer]


def interpolate(x: torch.Tensor, keep: torch.Tensor, fill: torch.Tensor | None) -> torch.Tensor:
    """``keep * x + (1 - keep) * fill`` (``fill`` None means zero)."""
    if fill is None:
        return x * keep
    return x * keep + (1 - keep) * fill


def mask_hooks(
    model: HookedModel,
    mask: ComponentMask,
    means: ComponentMeans | None = None,
    ablation: str | Ablation = Ablation.MEAN,
    *,
    skip_unmasked: bool = True,
) -> list[tuple[str, Hook]]:
    """``(hook name, hook)`` pairs that apply ``mask`` (for ``run_with_hooks`` or ``hooks()``).

    ``means`` (required for mean ablation) are only checked for shape here; use
    :func:`~mi_core.interventions.means.load_means` with ``model=`` to check they are the model's.
    """
    ablation = Ablation.parse(ablation)
    mask.check_model(model)
    if ablation is Ablation.MEAN:
        if means is None:
            raise InterventionError(
                "mean ablation needs means: pass means (from mi-core means) or use zero ablation"
            )
        means.check_model(model, fingerprint=False)
    if skip_unmasked:
        heads_on = _layers_needing_hooks(mask.heads)
        mlps_on = _layers_needing_hooks(mask.mlps[..., None])
    else:
        heads_on = mlps_on = [True] * mask.n_layers

    def head_hook(layer: int) -> Hook:
        def hook(x: Float[torch.Tensor, "batch pos n_heads d_head"], hook: Any) -> torch.Tensor:
            values = mask.heads
            if values.ndim == 3:  # one mask per example
                keep = _per_example(values, x)[:, layer, None, :, None]
            else:
                keep = values[layer].to(x.device, x.dtype)[:, None]
            return interpolate(x, keep, head_fill_values(means, ablation, layer, x))

        return hook

    def mlp_hook(layer: int) -> Hook:
        def hook(x: Float[torch.Tensor, "batch pos d_model"], hook: Any) -> torch.Tensor:
            values = mask.mlps
            if values.ndim == 2:  # one mask per example
                keep = _per_example(values, x)[:, layer, None, None]
            else:
                keep = values[layer].to(x.device, x.dtype)
            return interpolate(x, keep, mlp_fill_values(means, ablation, layer, x))

        return hook

    hooks: list[tuple[str, Hook]] = []
    for layer in range(mask.n_layers):
        if heads_on[layer]:
            hooks.append((act_name("z", layer), head_hook(layer)))
        if mlps_on[layer]:
            hooks.append((act_name("mlp_out", layer), mlp_hook(layer)))
    return hooks


#: Per model, the fill of every component that an active intervention removes (and how many).
_REMOVED = "_mi_core_removed_fills"


def fill_name(ablation: str | Ablation, means: ComponentMeans | None) -> str:
    """What replaces a removed component, in words: ``zero`` or the means' identity."""
    if Ablation.parse(ablation) is Ablation.ZERO or means is None:
        return "zero"
    return (
        f"the mean over {means.dataset or '?'} (weights {means.fingerprint}, values "
        f"{means.values_digest})"
    )


@contextlib.contextmanager
def removal_claims(model: HookedModel, mask: ComponentMask, fill: str) -> Iterator[None]:
    """For a ``with`` block, record that ``fill`` replaces each component ``mask`` removes.

    A component that an enclosing intervention already removes with another fill is refused:
    nested mean and zero ablation of one component would otherwise give whichever hook happens
    to run last. Nesting the same fill is allowed.
    """
    active: dict[Any, list] = model.__dict__.setdefault(_REMOVED, {})
    if mask.heads.requires_grad:
        removed = []
    elif mask.batch_size is not None:  # a component removed for any example
        removed = list(dict.fromkeys(c for row in mask.unstack() for c in row.removed()))
    else:
        removed = mask.removed()
    clash = [c for c in removed if c in active and active[c][0] != fill]
    if clash:
        names = ", ".join(str(c) for c in clash)
        raise InterventionError(
            f"{names} already removed with {active[clash[0]][0]} fill by an enclosing "
            f"intervention; nesting {fill} fill of the same component would depend on the "
            "order of the hooks: remove it from one of the masks"
        )
    for c in removed:
        active.setdefault(c, [fill, 0])[1] += 1
    try:
        yield
    finally:
        for c in removed:
            active[c][1] -= 1
            if active[c][1] == 0:
                del active[c]


@contextlib.contextmanager
def ablate(
    model: HookedModel,
    mask: ComponentMask,
    means: ComponentMeans | None = None,
    ablation: str | Ablation = Ablation.MEAN,
    *,
    skip_unmasked: bool = True,
) -> Iterator[Any]:
    """Context manager: inside it, ``model`` runs with ``mask`` applied.

    The mask's hooks go *before* any other hook at their hook points, so caches
    (``run_with_cache``) and later hooks see the ablated activations whatever the order in which
    they were added. Leaving the context removes exactly these hooks. Set ``skip_unmasked=False``
    when you will assign values other than 1 after entering with an all-ones mask.
    """
    hooks = mask_hooks(model, mask, means, ablation, skip_unmasked=skip_unmasked)
    with removal_claims(model, mask, fill_name(ablation, means)), prepended_hooks(model, hooks):
        yield model


def _per_example(values: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """A per-example mask's values for the batch ``x``, checked against its size."""
    if values.shape[0] != x.shape[0]:
        raise InterventionError(
            f"the per-example mask holds {values.shape[0]} masks but the batch has "
            f"{x.shape[0]} examples; stack the masks with sizes that add up to the batch"
        )
    return values.to(x.device, x.dtype)


def _layers_needing_hooks(values: Float[torch.Tensor, "*batch n_layers n"]) -> list[bool]:
    n_layers = values.shape[-2]
    if values.requires_grad:
        return [True] * n_layers
    return (values.detach() != 1).reshape(-1, n_layers, values.shape[-1]).any(dim=(0, 2)).tolist()
