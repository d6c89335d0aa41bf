"""BLOOM: ALiBi position biases, a LayerNorm after the embedding, fused query / key / value."""

from __future__ import annotations

from typing import Any

import transformers
from transformer_lens.pretrained.weight_conversions.bloom import convert_bloom_weights

from mi_core.models.families._base import Family


def config(hf: Any) -> dict[str, Any]:
    """BLOOM's fields."""
    return dict(
        d_model=hf.hidden_size,
        d_head=hf.hidden_size // hf.n_head,
        n_heads=hf.n_head,
        d_mlp=4 * hf.hidden_size,
        n_layers=hf.n_layer,
        n_ctx=2048,
        d_vocab=hf.vocab_size,
        act_fn="gelu_fast",
        eps=hf.layer_norm_epsilon,
        normalization_type="LN",
        post_embedding_ln=True,
        positional_embedding_type="alibi",
        default_prepend_bos=False,
    )


def tiny(common: dict[str, Any]) -> transformers.BloomConfig:
    """A three-layer BLOOM."""
    return transformers.BloomConfig(hidden_size=32, n_layer=3, n_head=4, **common)


FAMILY = Family(
    name="bloom",
    model_types=("bloom",),
    causal_lm="BloomForCausalLM",
    classifier="BloomForSequenceClassification",
    bodies=("BloomModel", "BloomForCausalLM"),
    body="transformer",
    config=config,
    convert=convert_bloom_weights,
    tiny=tiny,
    fast_paths=False,
    exact="logits, node and edge interventions exact; TransformerLens's attention forward (ALiBi)",
)
