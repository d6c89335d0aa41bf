"""Mistral: Llama's block with an optional sliding window on every layer."""

from __future__ import annotations

from typing import Any

import transformers
from transformer_lens.pretrained.weight_conversions.mistral import convert_mistral_weights

from mi_core.models.families._base import TINY, Family, refuse_rope_scaling
from mi_core.models.families.llama import rotary_decoder


def config(hf: Any) -> dict[str, Any]:
    """Mistral's fields (a sliding window makes every layer local)."""
    refuse_rope_scaling(hf, "Mistral")
    window = getattr(hf, "sliding_window", None)
    extra: dict[str, Any] = {}
    if window:
        extra = dict(
            use_local_attn=True,
            window_size=int(window),
            attn_types=["local"] * hf.num_hidden_layers,
        )
    return rotary_decoder(hf, **extra)


def tiny(common: dict[str, Any]) -> transformers.MistralConfig:
    """A three-layer Mistral with grouped-query attention and no window."""
    return transformers.MistralConfig(
        **TINY, num_key_value_heads=2, head_dim=8, max_position_embeddings=128,
        sliding_window=None, tie_word_embeddings=False, **common,
    )  # fmt: skip


FAMILY = Family(
    name="mistral",
    model_types=("mistral",),
    causal_lm="MistralForCausalLM",
    classifier="MistralForSequenceClassification",
    bodies=("MistralModel", "MistralForCausalLM"),
    config=config,
    convert=convert_mistral_weights,
    tiny=tiny,
)
