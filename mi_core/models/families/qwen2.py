"""Qwen2 / Qwen2.5 (and Qwen1.5): Llama's block with biased query / key / value projections."""

from __future__ import annotations

from typing import Any

import transformers
from transformer_lens.pretrained.weight_conversions.qwen2 import convert_qwen2_weights

from mi_core.models.families._base import TINY, Family, refuse, refuse_rope_scaling
from mi_core.models.families.llama import rotary_decoder


def config(hf: Any) -> dict[str, Any]:
    """Qwen2's fields; a sliding window is refused (released Qwen2 models leave it off)."""
    refuse_rope_scaling(hf, "Qwen2")
    refuse(hf, "Qwen2", use_sliding_window=bool(getattr(hf, "use_sliding_window", False)))
    return rotary_decoder(hf, tie_word_embeddings=bool(hf.tie_word_embeddings))


def tiny(common: dict[str, Any]) -> transformers.Qwen2Config:
    """A three-layer Qwen2 with grouped-query attention and tied embeddings (as Qwen2.5-0.5B)."""
    return transformers.Qwen2Config(
        **TINY, num_key_value_heads=2, max_position_embeddings=128, tie_word_embeddings=True,
        **common,
    )  # fmt: skip


FAMILY = Family(
    name="qwen2",
    model_types=("qwen2",),
    causal_lm="Qwen2ForCausalLM",
    classifier="Qwen2ForSequenceClassification",
    bodies=("Qwen2Model", "Qwen2ForCausalLM"),
    config=config,
    convert=convert_qwen2_weights,
    tiny=tiny,
)
