"""Gemma 1, 2 and 3 (text): Llama's block with RMSNorm weights offset by one, embeddings
scaled by sqrt(d_model) and tied, a tanh-GELU gated MLP; Gemma 2 / 3 add a norm on each
sublayer's output, alternating local / global layers and (Gemma 2) soft-capped scores."""

from __future__ import annotations

from typing import Any

import transformers
from transformer_lens.pretrained.weight_conversions.gemma import convert_gemma_weights

from mi_core.models.families._base import (
    TINY,
    Family,
    refuse_rope_scaling,
    sliding_layers,
)
from mi_core.models.families.llama import rotary_decoder

_POST_NORM = (
    "logits and node interventions exact; edges through the attention output's norm at a "
    "frozen scale (each head's share at the run's own scale; all edges kept or all removed "
    "exact)"
)


def _scale(hf: Any, d_head: int) -> dict[str, Any]:
    scalar = getattr(hf, "query_pre_attn_scalar", None)
    return {"attn_scale": float(scalar) ** 0.5} if scalar and scalar != d_head else {}


def config(hf: Any) -> dict[str, Any]:
    """Gemma's fields."""
    refuse_rope_scaling(hf, "Gemma")
    return rotary_decoder(hf, tie_word_embeddings=True)


def config2(hf: Any) -> dict[str, Any]:
    """Gemma 2's fields: post-sublayer norms, soft caps, sliding layers."""
    refuse_rope_scaling(hf, "Gemma 2")
    out = rotary_decoder(hf, use_normalization_before_and_after=True, tie_word_embeddings=True)
    out |= sliding_layers(hf) | _scale(hf, out["d_head"])
    if getattr(hf, "attn_logit_softcapping", None):
        out["attn_scores_soft_cap"] = float(hf.attn_logit_softcapping)
    if getattr(hf, "final_logit_softcapping", None):
        out["output_logits_soft_cap"] = float(hf.final_logit_softcapping)
    return out


def config3(hf: Any) -> dict[str, Any]:
    """Gemma 3's fields: Gemma 2's, plus query / key norms and a local rotary base."""
    refuse_rope_scaling(hf, "Gemma 3")
    out = config2(hf)
    params = getattr(hf, "rope_parameters", None) or {}
    local = (params.get("sliding_attention") or {}).get("rope_theta")
    if local is not None and float(local) != out["rotary_base"]:
        out["rotary_base_local"] = float(local)
    out["use_qk_norm"] = True
    return out


def tiny(common: dict[str, Any]) -> transformers.GemmaConfig:
    """A three-layer Gemma (one key / value head, as Gemma-2B)."""
    return transformers.GemmaConfig(
        **TINY, num_key_value_heads=1, head_dim=8, max_position_embeddings=128, **common
    )


def tiny2(common: dict[str, Any]) -> transformers.Gemma2Config:
    """A three-layer Gemma 2 (local, global, local; a window of 4 so it matters)."""
    return transformers.Gemma2Config(
        **TINY, num_key_value_heads=2, head_dim=8, max_position_embeddings=128,
        sliding_window=4, query_pre_attn_scalar=16, **common,
    )  # fmt: skip


def tiny3(common: dict[str, Any]) -> transformers.Gemma3TextConfig:
    """A three-layer Gemma 3 text model."""
    return transformers.Gemma3TextConfig(
        **TINY, num_key_value_heads=2, head_dim=8, max_position_embeddings=128,
        sliding_window=4, layer_types=["sliding_attention", "full_attention",
                                       "sliding_attention"], **common,
    )  # fmt: skip


FAMILY = Family(
    name="gemma",
    model_types=("gemma",),
    causal_lm="GemmaForCausalLM",
    classifier="GemmaForSequenceClassification",
    bodies=("GemmaModel", "GemmaForCausalLM"),
    config=config,
    convert=convert_gemma_weights,
    tiny=tiny,
)
FAMILY2 = Family(
    name="gemma2",
    model_types=("gemma2",),
    causal_lm="Gemma2ForCausalLM",
    classifier="Gemma2ForSequenceClassification",
    bodies=("Gemma2Model", "Gemma2ForCausalLM"),
    config=config2,
    convert=convert_gemma_weights,
    tiny=tiny2,
    graph="post_norm_out",
    fast_paths=False,
    exact=_POST_NORM,
)
FAMILY3 = Family(
    name="gemma3",
    model_types=("gemma3_text",),
    causal_lm="Gemma3ForCausalLM",
    classifier="Gemma3TextForSequenceClassification",
    bodies=("Gemma3TextModel", "Gemma3ForCausalLM"),
    config=config3,
    convert=convert_gemma_weights,
    tiny=tiny3,
    graph="post_norm_out",
    fast_paths=False,
    exact=_POST_NORM,
)
