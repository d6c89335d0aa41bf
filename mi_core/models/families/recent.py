"""Recent families whose configs TransformerLens's own loader maps field by field: OLMo-3
(post-norm sublayer outputs, sliding layers, YaRN on its global layers), Apertus (xIELU MLP,
query / key norms) and GPT-OSS (a mixture of experts with attention sinks, sliding layers and
YaRN)."""

from __future__ import annotations

from typing import Any

import transformers
from transformer_lens.pretrained.weight_conversions.apertus import convert_apertus_weights
from transformer_lens.pretrained.weight_conversions.olmo3 import convert_olmo3_weights
from transformer_lens.pretrained.weight_conversions.openai import convert_gpt_oss_weights

from mi_core.models.families._base import TINY, Family, tl_mapping
from mi_core.models.families.olmo import UNNORMED_INPUTS


def config_olmo3(hf: Any) -> dict[str, Any]:
    """OLMo-3's fields, as TransformerLens maps them."""
    return tl_mapping(hf, "Olmo3ForCausalLM")


def config_apertus(hf: Any) -> dict[str, Any]:
    """Apertus's fields, as TransformerLens maps them."""
    return tl_mapping(hf, "ApertusForCausalLM")


def config_gpt_oss(hf: Any) -> dict[str, Any]:
    """GPT-OSS's fields, as TransformerLens maps them."""
    return tl_mapping(hf, "GptOssForCausalLM")


def tiny_olmo3(common: dict[str, Any]) -> transformers.Olmo3Config:
    """A three-layer OLMo-3 (sliding, sliding, full; a window of 4 so it matters)."""
    return transformers.Olmo3Config(
        **TINY, max_position_embeddings=128, sliding_window=4,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"], **common,
    )  # fmt: skip


def tiny_apertus(common: dict[str, Any]) -> transformers.ApertusConfig:
    """A three-layer Apertus with grouped-query attention."""
    return transformers.ApertusConfig(
        **TINY, num_key_value_heads=2, max_position_embeddings=128, **common
    )


def tiny_gpt_oss(common: dict[str, Any]) -> transformers.GptOssConfig:
    """A three-layer GPT-OSS: four experts, two per token, sliding and full layers."""
    return transformers.GptOssConfig(
        **TINY, num_key_value_heads=2, head_dim=8, max_position_embeddings=128,
        num_local_experts=4, num_experts_per_tok=2, sliding_window=4,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"], **common,
    )  # fmt: skip


OLMO3 = Family(
    name="olmo3",
    model_types=("olmo3",),
    causal_lm="Olmo3ForCausalLM",
    classifier="Olmo3ForSequenceClassification",
    bodies=("Olmo3Model", "Olmo3ForCausalLM"),
    config=config_olmo3,
    convert=convert_olmo3_weights,
    tiny=tiny_olmo3,
    graph="post_norm_out",
    fast_paths=False,
    exact=UNNORMED_INPUTS,
)
APERTUS = Family(
    name="apertus",
    model_types=("apertus",),
    causal_lm="ApertusForCausalLM",
    bodies=("ApertusModel", "ApertusForCausalLM"),
    config=config_apertus,
    convert=convert_apertus_weights,
    tiny=tiny_apertus,
)
GPT_OSS = Family(
    name="gpt-oss",
    model_types=("gpt_oss",),
    causal_lm="GptOssForCausalLM",
    classifier="GptOssForSequenceClassification",
    bodies=("GptOssModel", "GptOssForCausalLM"),
    config=config_gpt_oss,
    convert=convert_gpt_oss_weights,
    tiny=tiny_gpt_oss,
    fast_paths=False,
    moe=True,
    exact="logits, node and edge interventions exact; the mixture of experts is one MLP "
    "node (attention neurons only in separability); TransformerLens's attention forward "
    "(sinks, sliding layers)",
)
