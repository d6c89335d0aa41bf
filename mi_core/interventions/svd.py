"""Rewrite each attention head's value and output weights in the basis of its OV circuit's SVD.

For a head with value weights ``W_V [d_model, d_head]`` (bias ``b_V``) and output weights
``W_O [d_head, d_model]``, the OV circuit ``W_V @ W_O`` has rank ``d_head``; with its thin SVD
``U S V^T``, the rewrite is ``W_V' = W_V R``, ``b_V' = b_V R``, ``W_O' = R^-1 W_O`` where ``R``
is the change of basis with ``W_V R = U`` (so ``W_O' = S V^T``). Every pre-out activation
becomes ``z' = z R`` and every output ``z' W_O' = z W_O`` is unchanged, bias included; the
pre-out neurons are now the singular directions, ordered by singular value.

Grouped-query attention shares ``W_V`` and ``b_V`` among the heads of a key-value group, so one
shared ``R`` is used per group: the SVD of ``W_V @ [W_O(h1) | W_O(h2) | ...]``, the group's
concatenated OV circuits. For a model without GQA each group is one head and this is exactly the
per-head SVD. Computed in float64 through QR factors (no ``d_model x d_model`` products).

``combine_biases=True`` (the reference code's ``svd_combine_biases`` option, which its runs left
unwired) first folds every head's value bias into the output bias, ``b_O += sum_h b_V(h) W_O(h)``,
and sets ``b_V = 0``: exact, because each row of an attention pattern sums to 1. The pre-out
activations then carry no bias, which changes their statistics (and what a mean offset restores).
"""

from __future__ import annotations

import torch
from transformer_lens import HookedTransformer

from mi_core.errors import ConfigError
from mi_core.interventions.neurons import is_grouped_query


def _ov_basis(w_v: torch.Tensor, w_o_cat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(R, R^-1)`` for ``W_V [d_model, d_head]`` and ``W_O [d_head, n * d_model]``."""
    q_v, r_v = torch.linalg.qr(w_v)  # W_V = Q_v R_v
    _, r_o = torch.linalg.qr(w_o_cat.T)  # W_O^T = Q_o R_o
    u_core, _, _ = torch.linalg.svd(r_v @ r_o.T)  # W_V W_O = Q_v (R_v R_o^T) Q_o^T
    # fix each singular direction's sign (largest entry of U = Q_v U_core positive), so that
    # applying the rewrite twice changes nothing
    u = q_v @ u_core
    signs = torch.sign(u.gather(0, u.abs().argmax(dim=0, keepdim=True))).squeeze(0)
    u_core = u_core * torch.where(signs == 0, 1.0, signs)
    # W_V R = Q_v U_core = U  =>  R = R_v^-1 U_core,  R^-1 = U_core^T R_v
    diag = torch.diagonal(r_v).abs()
    if diag.min() <= 1e-10 * diag.max().clamp(min=1e-300):
        raise ConfigError(
            "cannot SVD an attention head whose W_V is rank-deficient (some value directions "
            "are zero, e.g. after pruning); apply svd_attention to the unpruned model"
        )
    r = torch.linalg.solve_triangular(r_v, u_core, upper=True)
    r_inv = u_core.T @ r_v
    return r, r_inv


@torch.no_grad()
def combine_value_biases(model: HookedTransformer) -> HookedTransformer:
    """Fold every head's ``b_V`` into ``b_O`` (``b_O += sum_h b_V(h) W_O(h)``; ``b_V = 0``).

    Exact for softmax attention, whose pattern rows sum to 1. In place; returns ``model``.
    """
    cfg = model.cfg
    grouped = is_grouped_query(model)
    group = cfg.n_heads // cfg.n_key_value_heads if grouped else 1
    for block in model.blocks:
        attn = block.attn
        bias = attn._b_V if grouped else attn.b_V  # [groups or heads, d_head]
        per_head = bias.double().repeat_interleave(group, dim=0)  # [n_heads, d_head]
        attn.b_O += torch.einsum("hd,hdm->m", per_head, attn.W_O.double()).to(attn.b_O.dtype)
        bias.zero_()
    return model


@torch.no_grad()
def svd_attention(model: HookedTransformer, combine_biases: bool = False) -> HookedTransformer:
    """Rewrite every head's ``W_V``, ``b_V``, ``W_O`` in its OV-circuit SVD basis, in place.

    The model's outputs are unchanged (to float rounding). Works with grouped-query attention
    (one shared basis per key-value group, see the module docstring). ``combine_biases`` first
    folds the value biases into the output bias (:func:`combine_value_biases`).
    """
    cfg = model.cfg
    grouped = is_grouped_query(model)
    group = cfg.n_heads // cfg.n_key_value_heads if grouped else 1
    if combine_biases:
        combine_value_biases(model)
    for block in model.blocks:
        attn = block.attn
        w_v = (attn._W_V if grouped else attn.W_V).double()  # [groups, d_model, d_head]
        b_v = (attn._b_V if grouped else attn.b_V).double()  # [groups, d_head]
        w_o = attn.W_O.double()  # [n_heads, d_head, d_model]
        new_w_v, new_b_v, new_w_o = (
            torch.empty_like(w_v),
            torch.empty_like(b_v),
            torch.empty_like(w_o),
        )
        for g in range(w_v.shape[0]):
            heads = slice(g * group, (g + 1) * group)
            w_o_cat = torch.cat(list(w_o[heads]), dim=1)  # [d_head, group * d_model]
            r, r_inv = _ov_basis(w_v[g], w_o_cat)
            new_w_v[g] = w_v[g] @ r
            new_b_v[g] = b_v[g] @ r
            new_w_o[heads] = torch.einsum("ij,hjm->him", r_inv, w_o[heads])
        target_v = attn._W_V if grouped else attn.W_V
        target_b = attn._b_V if grouped else attn.b_V
        target_v.copy_(new_w_v.to(target_v.dtype))
        target_b.copy_(new_b_v.to(target_b.dtype))
        attn.W_O.copy_(new_w_o.to(attn.W_O.dtype))
    return model
