"""Qwen3: Llama's block with RMSNorm on each head's queries and keys."""

from __future__ import annotations

from typing import Any

import transformers
from transformer_lens.pretrained.weight_conversions.qwen3 import convert_qwen3_weights

from mi_core.models.families._base import TINY, Family, refuse, refuse_rope_scaling
from mi_core.models.families.llama import rotary_decoder


def config(hf: Any) -> dict[str, Any]:
    """Qwen3's fields."""
    refuse_rope_scaling(hf, "Qwen3")
    refuse(
        hf,
        "Qwen3",
        use_sliding_window=bool(getattr(hf, "use_sliding_window", False)),
        attention_bias=bool(getattr(hf, "attention_bias", False)),
    )
    return rotary_decoder(hf, use_qk_norm=True, tie_word_embeddings=bool(hf.tie_word_embeddings))


def tiny(common: dict[str, Any]) -> transformers.Qwen3Config:
    """A three-layer Qwen3 with grouped-query attention."""
    return transformers.Qwen3Config(
        **TINY, num_key_value_heads=2, head_dim=8, max_position_embeddings=128,
        tie_word_embeddings=False, **common,
    )  # fmt: skip


FAMILY = Family(
    name="qwen3",
    model_types=("qwen3",),
    causal_lm="Qwen3ForCausalLM",
    classifier="Qwen3ForSequenceClassification",
    bodies=("Qwen3Model", "Qwen3ForCausalLM"),
    config=config,
    convert=convert_qwen3_weights,
    tiny=tiny,
)
