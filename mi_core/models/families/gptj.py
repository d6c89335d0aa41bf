"""GPT-J: partial rotary on adjacent pairs, one LayerNorm shared by parallel attention + MLP,
biased LM head."""

from __future__ import annotations

from typing import Any

import transformers
from transformer_lens.pretrained.weight_conversions.gptj import convert_gptj_weights

from mi_core.models.families._base import Family, act_fn


def config(hf: Any) -> dict[str, Any]:
    """GPT-J's fields."""
    return dict(
        d_model=hf.n_embd,
        d_head=hf.n_embd // hf.n_head,
        n_heads=hf.n_head,
        d_mlp=hf.n_inner or 4 * hf.n_embd,
        n_layers=hf.n_layer,
        n_ctx=hf.n_positions,
        eps=hf.layer_norm_epsilon,
        d_vocab=hf.vocab_size,
        act_fn=act_fn(hf.activation_function),
        parallel_attn_mlp=True,
        positional_embedding_type="rotary",
        rotary_dim=hf.rotary_dim or hf.n_embd // hf.n_head,
        rotary_adjacent_pairs=True,
        normalization_type="LN",
    )


def tiny(common: dict[str, Any]) -> transformers.GPTJConfig:
    """A three-layer GPT-J rotating half of each head."""
    return transformers.GPTJConfig(
        n_embd=32, n_layer=3, n_head=4, n_inner=64, n_positions=128, rotary_dim=4,
        **common,
    )  # fmt: skip


FAMILY = Family(
    name="gpt-j",
    model_types=("gptj",),
    causal_lm="GPTJForCausalLM",
    classifier="GPTJForSequenceClassification",
    bodies=("GPTJModel", "GPTJForCausalLM"),
    body="transformer",
    config=config,
    convert=convert_gptj_weights,
    tiny=tiny,
    graph="parallel",
)
