"""OLMo (1), OLMo-2 and OLMoE: OLMo's LayerNorm has no weights and may clip queries, keys and
values; OLMo-2 normalises each sublayer's output (and queries / keys across heads) instead of
its input; OLMoE is a mixture of experts."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import einops
import torch
import transformers
from transformer_lens.pretrained.weight_conversions.olmo import convert_olmo_weights
from transformer_lens.pretrained.weight_conversions.olmo2 import convert_olmo2_weights
from transformer_lens.pretrained.weight_conversions.olmoe import convert_olmoe_weights

from mi_core.models.families._base import TINY, Family, refuse, refuse_rope_scaling
from mi_core.models.families.llama import rotary_decoder


def config(hf: Any) -> dict[str, Any]:
    """OLMo's fields (parameter-free LayerNorm, eps 1e-5)."""
    refuse_rope_scaling(hf, "OLMo")
    refuse(hf, "OLMo", attention_bias=bool(getattr(hf, "attention_bias", False)))
    hf_eps = SimpleNamespace(**hf.to_dict(), rms_norm_eps=1e-5)
    return rotary_decoder(
        hf_eps, normalization_type="LN", final_rms=False,
        clip_qkv=getattr(hf, "clip_qkv", None),
        tie_word_embeddings=bool(hf.tie_word_embeddings),
    )  # fmt: skip


#: What is exact for a family whose sublayers read the residual stream unnormalised and
#: normalise their outputs (OLMo-2 / 3).
UNNORMED_INPUTS = (
    "logits and node interventions exact; edges into a head are its raw query / key / value "
    "inputs, and edges through the attention output's norm at a frozen scale (each head's "
    "share at the run's own scale; all edges kept or all removed exact)"
)


def config2(hf: Any) -> dict[str, Any]:
    """OLMo-2's fields."""
    refuse_rope_scaling(hf, "OLMo-2")
    refuse(hf, "OLMo-2", attention_bias=bool(getattr(hf, "attention_bias", False)))
    return rotary_decoder(hf, tie_word_embeddings=bool(hf.tie_word_embeddings))


def convert_olmo2(olmo2: Any, cfg: Any) -> dict[str, torch.Tensor]:
    """OLMo-2's weights in TransformerLens's names: TransformerLens's conversion, with the keys
    and values of a grouped checkpoint (OLMo-2 32B's kind) split into their own key / value
    heads (TransformerLens's splits them into the query heads, which mis-shapes them; its
    attention itself normalises grouped keys across the key / value heads, as Hugging Face's)."""
    state = convert_olmo2_weights(olmo2, cfg)
    n_kv = cfg.n_key_value_heads
    if n_kv is None:
        return state
    for layer in range(cfg.n_layers):
        attn = olmo2.model.layers[layer].self_attn
        prefix = f"blocks.{layer}.attn."
        for kind, proj in (("K", attn.k_proj), ("V", attn.v_proj)):
            del state[f"{prefix}W_{kind}"], state[f"{prefix}b_{kind}"]
            state[f"{prefix}_W_{kind}"] = einops.rearrange(proj.weight, "(n h) m -> n m h", n=n_kv)
            state[f"{prefix}_b_{kind}"] = torch.zeros(n_kv, cfg.d_head, dtype=cfg.dtype)
    return state


def config_moe(hf: Any) -> dict[str, Any]:
    """OLMoE's fields."""
    refuse_rope_scaling(hf, "OLMoE")
    return rotary_decoder(  # TransformerLens's OLMoE conversion wants the key / value heads
        hf, n_key_value_heads=hf.num_key_value_heads, num_experts=hf.num_experts,
        experts_per_token=hf.num_experts_per_tok,
        norm_topk_prob=bool(hf.norm_topk_prob), clip_qkv=getattr(hf, "clip_qkv", None),
        tie_word_embeddings=bool(hf.tie_word_embeddings),
    )  # fmt: skip


def tiny(common: dict[str, Any]) -> transformers.OlmoConfig:
    """A three-layer OLMo with clipped query / key / value activations."""
    return transformers.OlmoConfig(**TINY, max_position_embeddings=128, clip_qkv=4.0, **common)


def tiny2(common: dict[str, Any]) -> transformers.Olmo2Config:
    """A three-layer OLMo-2."""
    return transformers.Olmo2Config(**TINY, max_position_embeddings=128, **common)


def tiny_moe(common: dict[str, Any]) -> transformers.OlmoeConfig:
    """A three-layer OLMoE: four experts, two per token, a key / value head per query head
    (as OLMoE-1B-7B)."""
    return transformers.OlmoeConfig(
        **TINY, num_key_value_heads=4, max_position_embeddings=128, num_experts=4,
        num_experts_per_tok=2, **common,
    )  # fmt: skip


_MOE = (
    "logits, node and edge interventions exact; the mixture of experts is one MLP node "
    "(attention neurons only in separability)"
)

FAMILY = Family(
    name="olmo",
    model_types=("olmo",),
    causal_lm="OlmoForCausalLM",
    bodies=("OlmoModel", "OlmoForCausalLM"),
    config=config,
    convert=convert_olmo_weights,
    tiny=tiny,
)
FAMILY2 = Family(
    name="olmo2",
    model_types=("olmo2",),
    causal_lm="Olmo2ForCausalLM",
    bodies=("Olmo2Model", "Olmo2ForCausalLM"),
    config=config2,
    convert=convert_olmo2,
    tiny=tiny2,
    graph="post_norm_out",
    fast_paths=False,
    exact=UNNORMED_INPUTS,
)
FAMILY_MOE = Family(
    name="olmoe",
    model_types=("olmoe",),
    causal_lm="OlmoeForCausalLM",
    bodies=("OlmoeModel", "OlmoeForCausalLM"),
    config=config_moe,
    convert=convert_olmoe_weights,
    tiny=tiny_moe,
    fast_paths=False,
    moe=True,
    exact=_MOE,
)
