"""Apply a component mask to a hooked model: ``out = z * x + (1 - z) * fill``.

``x`` is a head's ``blocks.{l}.attn.hook_z`` (per head) or a layer's ``blocks.{l}.hook_mlp_out``,
``z`` its mask value, and ``fill`` the mean activation (:attr:`Fill.MEAN`, mean ablation, the
default) or zero (:attr:`Fill.ZERO`, zero ablation: the component writes nothing, its value
bias included where it was folded out of ``hook_z``); the arithmetic is the same. Works for hooked
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
from mi_core.interventions.claims import claimed
from mi_core.interventions.mask import ComponentMask
from mi_core.interventions.means import ComponentMeans
from mi_core.models.hook_context import prepended_hooks
from mi_core.models.hooks import act_name
from mi_core.models.value_biases import head_zero_values
from mi_core.naming import Component

if TYPE_CHECKING:
    from mi_core.models.types import HookedModel

Hook = Callable[..., torch.Tensor]


class Fill(str, enum.Enum):
    """What replaces a removed component's output (an edge mask's fills: ``FILLS``)."""

    MEAN = "mean"
    ZERO = "zero"

    @classmethod
    def parse(cls, value: str | Fill) -> Fill:
        """``"mean"`` or ``"zero"`` (or a :class:`Fill`)."""
        try:
            return cls(value)
        except ValueError:
            raise InterventionError(
                f"unknown fill {value!r}; expected one of {[a.value for a in cls]}"
            ) from None


def head_fill_values(
    model: HookedModel, means: ComponentMeans | None, fill: Fill, layer: int, like: torch.Tensor
) -> Float[torch.Tensor, "*pos n_heads d_head"] | None:
    """Fill for the heads of ``layer`` of ``model``, on ``like``'s device and dtype
    (per-position means: one row per position of ``like``, see
    :meth:`~mi_core.interventions.ComponentMeans.fill_values`). The zero fill is the head
    writing nothing: ``-b_V`` where the model's value biases were folded out of ``hook_z``
    (:func:`~mi_core.models.value_biases.head_zero_values`), else zero (None)."""
    if fill is Fill.ZERO:
        return head_zero_values(model, layer, like)
    return _means_given(means).fill_values("z", layer, like)


def mlp_fill_values(
    means: ComponentMeans | None, fill: Fill, layer: int, like: torch.Tensor
) -> Float[torch.Tensor, "*pos d_model"] | None:
    """Fill for the MLP of ``layer`` (None for zero fill; per position as for heads)."""
    if fill is Fill.ZERO:
        return None
    return _means_given(means).fill_values("mlp_out", layer, like)


def _means_given(means: ComponentMeans | None) -> ComponentMeans:
    if means is None:
        raise InterventionError("mean ablation needs means: pass means or use zero ablation")
    return means


def interpolate(x: torch.Tensor, keep: torch.Tensor, fill: torch.Tensor | None) -> torch.Tensor:
    """``keep * x + (1 - keep) * fill`` (``fill`` None means zero)."""
    if fill is None:
        return x * keep
    return x * keep + (1 - keep) * fill


def mask_hooks(
    model: HookedModel,
    mask: ComponentMask,
    means: ComponentMeans | None = None,
    fill: str | Fill = Fill.MEAN,
    *,
    skip_unmasked: bool = True,
) -> list[tuple[str, Hook]]:
    """``(hook name, hook)`` pairs that apply ``mask`` (for ``run_with_hooks`` or ``hooks()``).

    ``means`` (required for the mean fill) are only checked for shape here; use
    :func:`~mi_core.interventions.means.load_means` with ``model=`` to check they are the model's.
    """
    fill = Fill.parse(fill)
    mask.check_model(model)
    if fill is Fill.MEAN:
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
            return interpolate(x, keep, head_fill_values(model, means, fill, layer, x))

        return hook

    def mlp_hook(layer: int) -> Hook:
        def hook(x: Float[torch.Tensor, "batch pos d_model"], hook: Any) -> torch.Tensor:
            values = mask.mlps
            if values.ndim == 2:  # one mask per example
                keep = _per_example(values, x)[:, layer, None, None]
            else:
                keep = values[layer].to(x.device, x.dtype)
            return interpolate(x, keep, mlp_fill_values(means, fill, layer, x))

        return hook

    hooks: list[tuple[str, Hook]] = []
    for layer in range(mask.n_layers):
        if heads_on[layer]:
            hooks.append((act_name("z", layer), head_hook(layer)))
        if mlps_on[layer]:
            hooks.append((act_name("mlp_out", layer), mlp_hook(layer)))
    return hooks


def fill_name(fill: str | Fill, means: ComponentMeans | None) -> str:
    """What replaces a removed component, in words: ``zero`` or the means' identity."""
    if Fill.parse(fill) is Fill.ZERO or means is None:
        return "zero"
    return (
        f"the mean over {means.dataset or '?'} (weights {means.fingerprint}, values "
        f"{means.values_digest})"
    )


def removed_components(mask: ComponentMask) -> list[Component]:
    """The components ``mask`` removes, for claims: for a per-example mask those any example
    removes; none while the mask is being trained (values that require grad change each step)."""
    if mask.heads.requires_grad:
        return []
    if mask.batch_size is not None:
        return list(dict.fromkeys(c for row in mask.unstack() for c in row.removed()))
    return mask.removed()


def removal_claims(
    model: HookedModel, mask: ComponentMask, fill: str
) -> contextlib.AbstractContextManager[None]:
    """For a ``with`` block, record that ``fill`` replaces each component ``mask`` removes.

    A component that an enclosing intervention already removes with another fill is refused:
    nested mean and zero ablation of one component would otherwise give whichever hook happens
    to run last. Nesting the same fill is allowed.
    """
    return claimed(model, dict.fromkeys(removed_components(mask), fill))


@contextlib.contextmanager
def ablate(
    model: HookedModel,
    mask: ComponentMask,
    means: ComponentMeans | None = None,
    fill: str | Fill = Fill.MEAN,
    *,
    skip_unmasked: bool = True,
) -> Iterator[Any]:
    """Context manager: inside it, ``model`` runs with ``mask`` applied.

    The mask's hooks go *before* any other hook at their hook points, so caches
    (``run_with_cache``) and later hooks see the ablated activations whatever the order in which
    they were added. Leaving the context removes exactly these hooks. Set ``skip_unmasked=False``
    when you will assign values other than 1 after entering with an all-ones mask.
    """
    hooks = mask_hooks(model, mask, means, fill, skip_unmasked=skip_unmasked)
    with removal_claims(model, mask, fill_name(fill, means)), prepended_hooks(model, hooks):
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
