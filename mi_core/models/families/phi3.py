"""Phi-3: Llama's block with fused query / key / value and gate / up projections."""

from __future__ import annotations

from typing import Any

import transformers
from transformer_lens.pretrained.weight_conversions.phi3 import convert_phi3_weights

from mi_core.models.families._base import TINY, Family, refuse_rope_scaling
from mi_core.models.families.mistral import config as mistral_config


def config(hf: Any) -> dict[str, Any]:
    """Phi-3's fields (a sliding window makes every layer local, as in Mistral)."""
    refuse_rope_scaling(hf, "Phi-3")
    return mistral_config(hf)


def tiny(common: dict[str, Any]) -> transformers.Phi3Config:
    """A three-layer Phi-3 with grouped-query attention."""
    return transformers.Phi3Config(
        **TINY, num_key_value_heads=2, max_position_embeddings=128, sliding_window=None,
        **common,
    )  # fmt: skip


FAMILY = Family(
    name="phi3",
    model_types=("phi3",),
    causal_lm="Phi3ForCausalLM",
    classifier="Phi3ForSequenceClassification",
    bodies=("Phi3Model", "Phi3ForCausalLM"),
    config=config,
    convert=convert_phi3_weights,
    tiny=tiny,
)
