"""Fused fast paths for hooked models that keep every hook working. TransformerLens computes
attention and LayerNorm step by step so that every intermediate can be hooked. When nobody
hooks those intermediates (no hook on ``hook_attn_scores`` / ``hook_pattern``, or on
``ln.hook_scale`` / ``ln.hook_normalized``), the same result comes from PyTorch's fused
kernels: ``scaled_dot_product_attention`` and ``layer_norm`` (in float32 / float64 to 1e-6; a
classifier in bfloat16 / float16 keeps the fused kernels, within a rounding step of
TransformerLens's own order and no further from a float64 run). Forward-mode derivatives
(``torch.func.jvp``, ``jacfwd``), which the fused attention lacks, take the attention written
out; second-order gradients need ``fast_paths=False`` (:func:`disable_fast_paths`). Each call
checks for hooks and falls back to TL's own code when any is attached, so ``run_with_cache``
and pattern hooks see exactly what they always see; hooks on ``hook_q/k/v``, ``hook_z`` and
everything outside these modules fire on both paths (classifiers: :func:`enable_fast_paths`).

Causal LMs (:func:`enable_lm_fast_paths`): TransformerLens's gated MLP and unembedding copy their
weights' transposes to contiguous blocks at every call (so that bfloat16 sums in Hugging Face's
order); in float32 / float64 the transposed views serve as they are, with every hook in place.
Their attention runs PyTorch's ``scaled_dot_product_attention`` where nobody hooks the scores
or the pattern (causal, with or without a padding mask, no cache, learnt / absolute or rotary
positions); the rotary hooks and every other hook fire as in TransformerLens's forward.
Grouped-query attention with its key / value heads ungrouped (what edge methods switch on, to
see each query head's key and value input) projects the shared heads once and repeats them.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from transformer_lens.components import (
    Attention,
    GatedMLP,
    GroupedQueryAttention,
    LayerNorm,
    Unembed,
)
from transformer_lens.components.abstract_attention import AbstractAttention
from transformer_lens.hook_points import HookPoint
from transformer_lens.utilities.attention import simple_attn_linear

from mi_core.models.families import family_of_model

_FULL_PRECISION = (torch.float32, torch.float64)


def _hooked(*points: HookPoint) -> bool:
    return any(
        p._forward_hooks or p._forward_pre_hooks or p._backward_hooks or p._backward_pre_hooks
        for p in points
    )


def _needs_tl(attn: AbstractAttention) -> bool:
    """Whether a switch or a hook asks for what only TransformerLens's attention forward makes:
    the attention result, per-head inputs, or the scores / pattern (switches may be turned on
    after loading: ``set_use_attn_result`` and the like)."""
    cfg = attn.cfg
    return bool(
        cfg.use_attn_result
        or cfg.use_split_qkv_input
        or cfg.use_attn_in
        or _hooked(attn.hook_attn_scores, attn.hook_pattern)
    )


def _fast_layer_norm(self: LayerNorm, x: torch.Tensor) -> torch.Tensor:
    if _hooked(self.hook_scale, self.hook_normalized) or x.dtype not in (
        torch.float32,
        torch.float64,
    ):
        return LayerNorm.forward(self, x)
    return F.layer_norm(x, (x.shape[-1],), self.w, self.b, self.eps)


def _fast_attention(
    self: AbstractAttention,
    query_input: torch.Tensor,
    key_input: torch.Tensor,
    value_input: torch.Tensor,
    past_kv_cache_entry=None,
    additive_attention_mask: torch.Tensor | None = None,
    attention_mask: torch.Tensor | None = None,
    position_bias: torch.Tensor | None = None,
) -> torch.Tensor:
    causal = (self._attention_dir_override or self.cfg.attention_dir) == "causal"
    mask = additive_attention_mask
    if past_kv_cache_entry is not None or (causal and mask is not None) or _needs_tl(self):
        return Attention.forward(
            self, query_input, key_input, value_input, past_kv_cache_entry,
            additive_attention_mask, attention_mask, position_bias,
        )  # fmt: skip
    q, k, v = self.calculate_qkv_matrices(query_input, key_input, value_input)
    return _attend(self, q, k, v, mask, causal)


def _attention_math(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    causal: bool,
    scale: float,
) -> torch.Tensor:
    """``scaled_dot_product_attention`` written out (``[batch, head, pos, d_head]``), for what
    the fused kernels do not support (forward-mode derivatives)."""
    scores = (q @ k.transpose(-1, -2)) * scale
    if causal:
        n, m = scores.shape[-2:]
        scores = scores.masked_fill(
            ~torch.ones(n, m, dtype=torch.bool, device=q.device).tril(), float("-inf")
        )
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else (
            scores + mask
        )  # fmt: skip
    return torch.softmax(scores, dim=-1) @ v


def _attend(
    self: AbstractAttention,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    causal: bool,
    empty: torch.Tensor | None = None,
) -> torch.Tensor:
    """``scaled_dot_product_attention`` of ``[batch, pos, head, d_head]`` queries, keys and
    values (one key / value head per query head), then ``hook_z`` and the output projection
    without TransformerLens's per-call copy of ``W_O``; as TransformerLens does, the keys and
    values go to the queries' device and dtype, and ``z`` to the weights'. ``mask``: additive
    (float) or which keys each query may see (bool); ``empty`` (``[batch, pos]``): queries that
    may see no key, whose ``z`` is zero (TransformerLens zeroes their NaN pattern)."""
    if mask is not None and mask.dtype != torch.bool:
        mask = mask.to(q.dtype)
    args = (
        q.transpose(1, 2),
        k.to(device=q.device, dtype=q.dtype).transpose(1, 2),
        v.to(device=q.device, dtype=q.dtype).transpose(1, 2),
    )
    try:
        z = F.scaled_dot_product_attention(
            *args, attn_mask=mask, is_causal=causal, scale=1.0 / self.attn_scale
        ).transpose(1, 2)
    except NotImplementedError:  # forward-mode AD (jvp, jacfwd): the fused kernels lack it
        z = _attention_math(*args, mask, causal, 1.0 / self.attn_scale).transpose(1, 2)
    if empty is not None:
        z = z.masked_fill(empty[:, :, None, None], 0.0)
    z = self.hook_z(z)
    w = self.W_O.reshape(self.cfg.n_heads * self.cfg.d_head, self.cfg.d_model)
    z = z.to(w.dtype)
    return F.linear(z.reshape(z.shape[0], z.shape[1], -1), w.to(z.device).T, self.b_O.to(z.device))


class FastLayerNorm(LayerNorm):
    """A :class:`LayerNorm` whose forward is :func:`_fast_layer_norm` (module-level classes,
    here and below, so that a model that has them still pickles)."""

    forward = _fast_layer_norm


class FastAttention(Attention):
    """An :class:`Attention` whose forward is :func:`_fast_attention`."""

    forward = _fast_attention


def enable_fast_paths(model: torch.nn.Module) -> None:
    """Give ``model``'s LayerNorms and attention layers hook-aware fused forwards.

    Only plain configurations get them (learnt or absolute positions, no attention result
    hooks, no layer-index scaling); anything else keeps TL's forward. The modules' classes
    become :class:`FastLayerNorm` / :class:`FastAttention`.
    """
    cfg = model.cfg
    plain_attention = (
        cfg.positional_embedding_type == "standard"
        and not cfg.use_attn_result
        and not cfg.scale_attn_by_inverse_layer_idx
        and not cfg.use_split_qkv_input
        and not cfg.use_attn_in
        and cfg.n_key_value_heads is None
        and cfg.attn_scores_soft_cap <= 0
        and not cfg.use_local_attn
    )
    for module in model.modules():
        if type(module) is LayerNorm:
            module.__class__ = FastLayerNorm
        elif type(module) is Attention and plain_attention:
            module.__class__ = FastAttention


def _fast_gated_mlp(self: GatedMLP, x: torch.Tensor) -> torch.Tensor:
    """TransformerLens's gated MLP (Llama family) without its per-call copies of the three
    weights' transposes (``W.T.contiguous()``: 10.6 MB a layer for SmolLM2, made at every
    forward so that bfloat16 sums in Hugging Face's order); the same hooks, in the same order.
    bfloat16 / float16 and the layer-norm-activation variant keep TransformerLens's code."""
    if x.dtype not in _FULL_PRECISION or self.cfg.is_layer_norm_activation():
        return GatedMLP.forward(self, x)
    if self.W_gate.device != x.device:
        x = x.to(self.W_gate.device)
    pre_act = self.hook_pre(F.linear(x, self.W_gate.T))
    pre_linear = self.hook_pre_linear(F.linear(x, self.W_in.T))
    post_act = self.hook_post((self.act_fn(pre_act) * pre_linear) + self.b_in)
    return F.linear(post_act, self.W_out.T, self.b_out)


def fast_unembed(self: Unembed, residual: torch.Tensor) -> torch.Tensor:
    """TransformerLens's unembedding without its per-call copy of ``W_U``'s transpose (113 MB
    for SmolLM2's 49,152 x 576); ``hook_in`` and ``hook_out`` fire as in its forward."""
    if residual.dtype not in _FULL_PRECISION:
        return Unembed.forward(self, residual)
    residual = self.hook_in(residual)
    return self.hook_out(F.linear(residual, self.W_U.T, self.b_U))


def _plain_lm_attention(cfg: Any) -> bool:
    """Whether a causal LM's attention is one :func:`_fast_lm_attention` computes exactly as
    TransformerLens does (no soft cap, local window, sinks, ALiBi or relative biases, log-n
    scaling, clipping or 4-bit weights), and whose family (:mod:`mi_core.models.families`)
    says its fused forward is exact (OLMoE's and OLMo-2 / 3's query / key norms across heads:
    not)."""
    family = family_of_model(cfg)
    return (
        (family is None or family.fast_paths)
        and cfg.positional_embedding_type in ("standard", "rotary")
        and not cfg.use_local_attn
        and cfg.attn_scores_soft_cap <= 0
        and not cfg.use_attention_sinks
        and not cfg.use_logn_attn
        and cfg.clip_qkv is None
        and not cfg.load_in_4bit
    )


def _fast_lm_attention(
    self: AbstractAttention,
    query_input: torch.Tensor,
    key_input: torch.Tensor,
    value_input: torch.Tensor,
    past_kv_cache_entry=None,
    additive_attention_mask: torch.Tensor | None = None,
    attention_mask: torch.Tensor | None = None,
    position_bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """A causal LM's attention through ``scaled_dot_product_attention``: the query, key and
    value from the module's own ``calculate_qkv_matrices`` (``hook_q`` / ``hook_k`` /
    ``hook_v``), its rotary embedding (``hook_rot_q`` / ``hook_rot_k``), then :func:`_attend`
    (``hook_z`` and the output projection); a padding mask, as TransformerLens applies it
    (rotary positions and the keys each query sees). Anything else (a hook on the scores or
    the pattern, a key / value cache, per-head or result hooks switched on, bfloat16 / float16
    or autocast, a configuration :func:`_plain_lm_attention` refuses) runs TransformerLens's
    forward."""
    cfg = self.cfg
    if (
        past_kv_cache_entry is not None
        or additive_attention_mask is not None
        or position_bias is not None
        or query_input.dtype not in _FULL_PRECISION
        or torch.is_autocast_enabled(query_input.device.type)  # q / k / v in a lower precision
        or (self._attention_dir_override or cfg.attention_dir) != "causal"
        or _needs_tl(self)
        or not _plain_lm_attention(cfg)
    ):
        return AbstractAttention.forward(
            self, query_input, key_input, value_input, past_kv_cache_entry,
            additive_attention_mask, attention_mask, position_bias,
        )  # fmt: skip
    q, k, v = self.calculate_qkv_matrices(query_input, key_input, value_input)
    if cfg.positional_embedding_type == "rotary":  # positions from the padding mask, if any
        q = self.hook_rot_q(self.apply_rotary(q, 0, attention_mask))
        k = self.hook_rot_k(self.apply_rotary(k, 0, attention_mask))
    if k.shape[2] != q.shape[2]:  # grouped key / value heads, shared by query heads in turn
        repeats = q.shape[2] // k.shape[2]
        k, v = k.repeat_interleave(repeats, dim=2), v.repeat_interleave(repeats, dim=2)
    if attention_mask is None:
        return _attend(self, q, k, v, None, causal=True)
    # padding: each query sees the real keys up to itself, as TransformerLens's causal mask
    # does; a query that sees none (left padding) attends to itself instead of to nothing (no
    # NaN, in either pass) and its z is zeroed, as TransformerLens zeroes its NaN pattern
    n = q.shape[1]
    keys = attention_mask.to(device=q.device, dtype=torch.bool)[:, None, None, :]
    allowed = torch.ones(n, n, dtype=torch.bool, device=q.device).tril() & keys
    empty = ~allowed.any(-1)  # [batch, 1, pos]
    allowed = allowed | (torch.eye(n, dtype=torch.bool, device=q.device) & empty[..., None])
    return _attend(self, q, k, v, allowed, causal=False, empty=empty[:, 0])


class FastLMAttention(Attention):
    """A causal LM's :class:`Attention` whose forward is :func:`_fast_lm_attention`."""

    forward = _fast_lm_attention


def _ungrouped_by_repeat(
    self: GroupedQueryAttention,
    query_input: torch.Tensor,
    key_input: torch.Tensor,
    value_input: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Query, key and value with ``ungroup_grouped_query_attention`` on: TransformerLens
    projects the key and value once per *query* head through repeated weights (copied at every
    call); projecting once per key / value head and repeating the result gives the same
    ``[batch, pos, head, d_head]`` values at ``hook_k`` / ``hook_v``, whose gradient is still
    each query head's own (the repeat sums them back into the shared projection). Per-head
    inputs (``use_split_qkv_input`` / ``use_attn_in``: each head's input may differ) keep
    TransformerLens's code."""
    cfg = self.cfg
    if not cfg.ungroup_grouped_query_attention or cfg.use_split_qkv_input or cfg.use_attn_in:
        return GroupedQueryAttention.calculate_qkv_matrices(
            self, query_input, key_input, value_input
        )
    repeats = self.repeat_kv_heads
    q = self.hook_q(simple_attn_linear(query_input, self.W_Q, self.b_Q))
    k = simple_attn_linear(key_input, self._W_K, self._b_K)
    v = simple_attn_linear(value_input, self._W_V, self._b_V)
    k = self.hook_k(k.repeat_interleave(repeats, dim=2))
    v = self.hook_v(v.repeat_interleave(repeats, dim=2))
    if cfg.use_qk_norm:
        q = self._apply_qk_norm(q, self.q_norm)
        k = self._apply_qk_norm(k, self.k_norm)
    return q, k, v


class FastGroupedQueryAttention(GroupedQueryAttention):
    """A :class:`GroupedQueryAttention` whose forward is :func:`_fast_lm_attention` and whose
    query / key / value come from :func:`_ungrouped_by_repeat`."""

    forward = _fast_lm_attention
    calculate_qkv_matrices = _ungrouped_by_repeat


class FastGatedMLP(GatedMLP):
    """A :class:`GatedMLP` whose forward is :func:`_fast_gated_mlp` (a module-level class, so a
    model that has it still pickles)."""

    forward = _fast_gated_mlp


class FastUnembed(Unembed):
    """An :class:`Unembed` whose forward is :func:`fast_unembed`."""

    forward = fast_unembed


def enable_lm_fast_paths(model: torch.nn.Module) -> None:
    """Give a causal LM's gated MLPs and unembedding forwards without TransformerLens's
    per-call weight copies (float32 / float64: the same values to float rounding, the same
    hooks; the time saved: benchmarks/README.md, Results, the row on ``enable_lm_fast_paths``).
    The modules' classes become the subclasses above (same parameters, buffers and hooks), as
    :func:`enable_fast_paths` does for classifiers. Attention gets :class:`FastLMAttention` /
    :class:`FastGroupedQueryAttention`, whose forward checks at every call whether it may
    take the fused path (:func:`_fast_lm_attention`) and otherwise runs TransformerLens's."""
    for module in model.modules():
        if type(module) is GatedMLP:
            module.__class__ = FastGatedMLP
        elif type(module) is Unembed:
            module.__class__ = FastUnembed
        elif type(module) is GroupedQueryAttention:
            module.__class__ = FastGroupedQueryAttention
        elif type(module) is Attention:
            module.__class__ = FastLMAttention


#: Every class a fast path swaps in, each a subclass of the TransformerLens class it replaces.
FAST_CLASSES = (
    FastLayerNorm,
    FastAttention,
    FastLMAttention,
    FastGroupedQueryAttention,
    FastGatedMLP,
    FastUnembed,
)


def disable_fast_paths(model: torch.nn.Module) -> torch.nn.Module:
    """Give every module of ``model`` back its TransformerLens forward (the inverse of
    :func:`enable_fast_paths` / :func:`enable_lm_fast_paths`; the same parameters and hooks).

    For what the fused kernels cannot do: second-order gradients through attention
    (``torch.autograd.grad(..., create_graph=True)`` and a second backward: PyTorch's fused
    attention kernels have no double backward), or comparing against TL's own code.
    ``load_model(..., fast_paths=False)`` loads a model this way. Returns ``model``.
    """
    for module in model.modules():
        if type(module) in FAST_CLASSES:
            module.__class__ = type(module).__bases__[0]
    return model
