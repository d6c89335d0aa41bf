"""GPT-Neo: learnt positions, LayerNorm, global and local (windowed) attention layers, no
attention scaling."""

from __future__ import annotations

from typing import Any

import transformers
from transformer_lens.pretrained.weight_conversions.neo import convert_neo_weights

from mi_core.models.families._base import Family, act_fn


def config(hf: Any) -> dict[str, Any]:
    """GPT-Neo's fields."""
    return dict(
        d_model=hf.hidden_size,
        d_head=hf.hidden_size // hf.num_heads,
        n_heads=hf.num_heads,
        d_mlp=hf.intermediate_size or 4 * hf.hidden_size,
        n_layers=hf.num_layers,
        n_ctx=hf.max_position_embeddings,
        eps=hf.layer_norm_epsilon,
        d_vocab=hf.vocab_size,
        attn_types=list(hf.attention_layers),
        act_fn=act_fn(hf.activation_function),
        use_attn_scale=False,
        use_local_attn=True,
        window_size=hf.window_size,
        normalization_type="LN",
    )


def tiny(common: dict[str, Any]) -> transformers.GPTNeoConfig:
    """A three-layer GPT-Neo (global, local, global; a window of 4 so it matters)."""
    return transformers.GPTNeoConfig(
        hidden_size=32, num_layers=3, num_heads=4, intermediate_size=64,
        max_position_embeddings=128, attention_types=[[["global", "local"], 1], [["global"], 1]],
        window_size=4, **common,
    )  # fmt: skip


FAMILY = Family(
    name="gpt-neo",
    model_types=("gpt_neo",),
    causal_lm="GPTNeoForCausalLM",
    classifier="GPTNeoForSequenceClassification",
    bodies=("GPTNeoModel", "GPTNeoForCausalLM"),
    body="transformer",
    config=config,
    convert=convert_neo_weights,
    tiny=tiny,
    fast_paths=False,
    exact="logits, node and edge interventions exact; TransformerLens's attention forward "
    "(local windows)",
)
