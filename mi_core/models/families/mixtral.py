"""Mixtral: Mistral's block with a mixture-of-experts MLP (top-k routing, renormalised)."""

from __future__ import annotations

from typing import Any

import transformers
from transformer_lens.pretrained.weight_conversions.mixtral import convert_mixtral_weights

from mi_core.models.families._base import TINY, Family, refuse_rope_scaling
from mi_core.models.families.mistral import config as mistral_config


def config(hf: Any) -> dict[str, Any]:
    """Mixtral's fields."""
    refuse_rope_scaling(hf, "Mixtral")
    return mistral_config(hf) | dict(
        num_experts=hf.num_local_experts,
        experts_per_token=hf.num_experts_per_tok,
        norm_topk_prob=True,
    )


def tiny(common: dict[str, Any]) -> transformers.MixtralConfig:
    """A three-layer Mixtral: four experts, two per token."""
    return transformers.MixtralConfig(
        **TINY, num_key_value_heads=2, max_position_embeddings=128, num_local_experts=4,
        num_experts_per_tok=2, sliding_window=None, **common,
    )  # fmt: skip


FAMILY = Family(
    name="mixtral",
    model_types=("mixtral",),
    causal_lm="MixtralForCausalLM",
    classifier="MixtralForSequenceClassification",
    bodies=("MixtralModel", "MixtralForCausalLM"),
    config=config,
    convert=convert_mixtral_weights,
    tiny=tiny,
    moe=True,
    exact="logits, node and edge interventions exact; the mixture of experts is one MLP node "
    "(attention neurons only in separability)",
)
