"""GPT-2: learnt absolute positions, LayerNorm, sequential blocks; causal LM and classifier."""

from __future__ import annotations

from typing import Any

import transformers
from transformer_lens.pretrained.weight_conversions.gpt2 import convert_gpt2_weights

from mi_core.models.families._base import Family, act_fn


def config(hf: Any) -> dict[str, Any]:
    """GPT-2's fields."""
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
        use_attn_scale=getattr(hf, "scale_attn_weights", True),
        scale_attn_by_inverse_layer_idx=hf.scale_attn_by_inverse_layer_idx,
        normalization_type="LN",
    )


def tiny(common: dict[str, Any]) -> transformers.GPT2Config:
    """A three-layer GPT-2."""
    pad = common["pad_token_id"]
    return transformers.GPT2Config(
        n_embd=32, n_layer=3, n_head=4, n_positions=128, activation_function="gelu_new",
        bos_token_id=pad, eos_token_id=pad, **common,
    )  # fmt: skip


FAMILY = Family(
    name="gpt2",
    model_types=("gpt2",),
    causal_lm="GPT2LMHeadModel",
    classifier="GPT2ForSequenceClassification",
    bodies=("GPT2Model", "GPT2LMHeadModel"),
    body="transformer",
    config=config,
    convert=convert_gpt2_weights,
    tiny=tiny,
)
