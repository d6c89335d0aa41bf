"""Value biases folded into the output bias, and what a head's "zero" is then.

TransformerLens's habit (and :func:`~mi_core.models.load_model`'s default for causal LMs) is
to fold each head's value bias ``b_V`` into its layer's output bias: ``b_O += sum_h b_V[h] @
W_O[h]``, ``b_V = 0``. The logits stay the same only where every attention row sums to one,
so the fold is skipped on families whose heads attend to a learnt sink (GPT-OSS), which takes
part of each row's mass (:func:`value_biases_foldable`).

After the fold ``hook_z`` carries ``z - b_V``: the head's output without its bias. Zeroing
``hook_z`` then leaves ``b_V @ W_O`` in the residual stream, where a researcher who
zero-ablates a head (and Hugging Face, zeroing the head's slice of the output projection's
input) means the head writes nothing. The folded biases are therefore kept on the model
(:func:`folded_value_biases`), and every zero fill of a head is the head's zero point in
``hook_z``'s coordinates, ``-b_V`` (:func:`head_zero_values`); a mean fill needs nothing, as
means are taken in the same coordinates.
"""

from __future__ import annotations

from typing import Any

import torch
from jaxtyping import Float

__all__ = [
    "fold_value_biases",
    "folded_value_biases",
    "head_zero_values",
    "set_folded_value_biases",
    "value_biases_foldable",
]

#: The model attribute that holds the folded biases, ``[n_layers, n_heads, d_head]``.
_FOLDED = "folded_value_biases"


def value_biases_foldable(cfg: Any) -> bool:
    """Whether folding value biases leaves ``cfg``'s model's outputs unchanged: every
    attention row sums to one (no attention sinks)."""
    return not getattr(cfg, "use_attention_sinks", False)


def fold_value_biases(model: Any) -> Float[torch.Tensor, "layer head d_head"] | None:
    """Fold every head's value bias of ``model`` (a processed ``HookedTransformer``) into its
    layer's output bias, in place, as TransformerLens's ``fold_value_biases`` does; record the
    folded biases on the model and return them (``None``, and nothing changed, when they are
    all zero)."""
    blocks = list(model.blocks)
    with torch.no_grad():
        biases = [block.attn.b_V.detach().clone() for block in blocks]  # [head, d_head] each
        if not any(bool(b.abs().max() > 0) for b in biases if b.numel()):
            set_folded_value_biases(model, None)
            return None
        for block, b_v in zip(blocks, biases, strict=True):
            attn = block.attn
            w_o = attn.W_O.detach()
            attn.b_O.add_(torch.einsum("hd,hdm->m", b_v.to(w_o), w_o))
            (attn._b_V if hasattr(attn, "_b_V") else attn.b_V).zero_()
    folded = torch.stack([b.to(biases[0].device) for b in biases])
    set_folded_value_biases(model, folded)
    return folded


def set_folded_value_biases(model: Any, folded: torch.Tensor | None) -> None:
    """Record on ``model`` the value biases folded out of its ``hook_z`` (``None``: none), and
    ``model.value_biases_folded``, whether there are any."""
    model.__dict__[_FOLDED] = folded
    model.value_biases_folded = folded is not None


def folded_value_biases(model: Any) -> Float[torch.Tensor, "layer head d_head"] | None:
    """The value biases folded out of ``model``'s ``hook_z`` (``None`` when none were)."""
    return model.__dict__.get(_FOLDED)


def head_zero_values(
    model: Any, layer: int, like: torch.Tensor
) -> Float[torch.Tensor, "head d_head"] | None:
    """What ``hook_z`` of ``layer``'s heads holds when a head writes nothing: ``-b_V`` where
    the value biases were folded, else zero (``None``); on ``like``'s device and dtype."""
    folded = folded_value_biases(model)
    if folded is None:
        return None
    return -folded[layer].to(like.device, like.dtype)
