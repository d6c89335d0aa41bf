"""OPT: learnt positions (offset 2), pre-LayerNorm sequential blocks."""

from __future__ import annotations

from typing import Any

import transformers
from transformer_lens.pretrained.weight_conversions.opt import convert_opt_weights

from mi_core.errors import ModelLoadError
from mi_core.models.families._base import Family, act_fn


def config(hf: Any) -> dict[str, Any]:
    """OPT's fields; post-LN and projected-embedding variants (opt-350m) are refused."""
    if not getattr(hf, "do_layer_norm_before", True) or (hf.word_embed_proj_dim != hf.hidden_size):
        raise ModelLoadError(
            "this OPT variant (post-LN or projected embeddings, e.g. opt-350m) is not "
            "supported; use another OPT size"
        )
    if not getattr(hf, "enable_bias", True) or not getattr(
        hf, "layer_norm_elementwise_affine", True
    ):
        raise ModelLoadError(
            "OPT without biases (enable_bias=False) or without LayerNorm weights "
            "(layer_norm_elementwise_affine=False) is not supported: its weights would not "
            "convert; use a standard OPT checkpoint"
        )
    return dict(
        d_model=hf.hidden_size,
        d_head=hf.hidden_size // hf.num_attention_heads,
        n_heads=hf.num_attention_heads,
        d_mlp=hf.ffn_dim,
        n_layers=hf.num_hidden_layers,
        n_ctx=hf.max_position_embeddings,
        eps=1e-5,
        d_vocab=hf.vocab_size,
        act_fn=act_fn(hf.activation_function),
        normalization_type="LN",
    )


def tiny(common: dict[str, Any]) -> transformers.OPTConfig:
    """A three-layer OPT."""
    return transformers.OPTConfig(
        hidden_size=32, num_hidden_layers=3, num_attention_heads=4, ffn_dim=64,
        max_position_embeddings=128, word_embed_proj_dim=32, **common,
    )  # fmt: skip


FAMILY = Family(
    name="opt",
    model_types=("opt",),
    causal_lm="OPTForCausalLM",
    config=config,
    convert=convert_opt_weights,
    tiny=tiny,
)
