"""Llama (and SmolLM2, TinyLlama, Llama 2 / 3 ...): rotary, RMSNorm, gated MLP, GQA."""

from __future__ import annotations

from typing import Any

import transformers
from transformer_lens.pretrained.weight_conversions.llama import convert_llama_weights

from mi_core.models.families._base import (
    TINY,
    Family,
    act_fn,
    head_dim,
    kv_heads,
    refuse,
    refuse_rope_scaling,
    rope_theta,
)


def rotary_decoder(hf: Any, **extra: Any) -> dict[str, Any]:
    """The fields every Llama-shaped decoder shares (rotary over the whole head, RMSNorm,
    gated MLP, grouped-query attention); ``extra`` adds or overrides a family's own."""
    d_head = head_dim(hf)
    return (
        dict(
            d_model=hf.hidden_size,
            d_head=d_head,
            n_heads=hf.num_attention_heads,
            d_mlp=hf.intermediate_size,
            n_layers=hf.num_hidden_layers,
            n_ctx=min(hf.max_position_embeddings, 8192),
            eps=hf.rms_norm_eps,
            d_vocab=hf.vocab_size,
            act_fn=act_fn(getattr(hf, "hidden_activation", None) or hf.hidden_act),
            n_key_value_heads=kv_heads(hf),
            normalization_type="RMS",
            positional_embedding_type="rotary",
            rotary_adjacent_pairs=False,
            rotary_dim=d_head,
            rotary_base=rope_theta(hf),
            final_rms=True,
            gated_mlp=True,
        )
        | extra
    )


def config(hf: Any) -> dict[str, Any]:
    """Llama's fields; rope scaling and biased projections are refused (TransformerLens's
    conversion would drop them)."""
    refuse_rope_scaling(hf, "Llama")
    refuse(
        hf,
        "Llama",
        attention_bias=bool(getattr(hf, "attention_bias", False)),
        mlp_bias=bool(getattr(hf, "mlp_bias", False)),
    )
    return rotary_decoder(hf)


def tiny(common: dict[str, Any]) -> transformers.LlamaConfig:
    """A three-layer Llama with grouped-query attention."""
    return transformers.LlamaConfig(
        **TINY, num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-6,
        tie_word_embeddings=False, **common,
    )  # fmt: skip


FAMILY = Family(
    name="llama",
    model_types=("llama",),
    causal_lm="LlamaForCausalLM",
    classifier="LlamaForSequenceClassification",
    bodies=("LlamaModel", "LlamaForCausalLM"),
    config=config,
    convert=convert_llama_weights,
    tiny=tiny,
)
