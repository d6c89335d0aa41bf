"""Phi-1 / 1.5 / 2: partial rotary, one LayerNorm shared by parallel attention + MLP, biased
LM head."""

from __future__ import annotations

from typing import Any

import transformers
from transformer_lens.pretrained.weight_conversions.phi import convert_phi_weights

from mi_core.models.families._base import (
    TINY,
    Family,
    act_fn,
    refuse,
    refuse_rope_scaling,
    rope_parameters,
    rope_theta,
)


def config(hf: Any) -> dict[str, Any]:
    """Phi's fields."""
    refuse_rope_scaling(hf, "Phi")
    refuse(hf, "Phi", qk_layernorm=bool(getattr(hf, "qk_layernorm", False)))
    d_head = hf.hidden_size // hf.num_attention_heads
    pct = rope_parameters(hf).get("partial_rotary_factor", 0.5)
    return dict(
        d_model=hf.hidden_size,
        d_head=d_head,
        n_heads=hf.num_attention_heads,
        d_mlp=hf.intermediate_size,
        n_layers=hf.num_hidden_layers,
        n_ctx=hf.max_position_embeddings,
        eps=hf.layer_norm_eps,
        d_vocab=hf.vocab_size,
        act_fn=act_fn(hf.hidden_act),
        normalization_type="LN",
        positional_embedding_type="rotary",
        rotary_dim=round(pct * d_head),
        rotary_base=rope_theta(hf),
        parallel_attn_mlp=True,
        default_prepend_bos=False,
    )


def tiny(common: dict[str, Any]) -> transformers.PhiConfig:
    """A three-layer Phi."""
    return transformers.PhiConfig(**TINY, max_position_embeddings=128, **common)


FAMILY = Family(
    name="phi",
    model_types=("phi",),
    causal_lm="PhiForCausalLM",
    classifier="PhiForSequenceClassification",
    bodies=("PhiModel", "PhiForCausalLM"),
    config=config,
    convert=convert_phi_weights,
    tiny=tiny,
    graph="parallel",
)
