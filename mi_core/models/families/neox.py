"""GPT-NeoX (Pythia, GPT-NeoX-20B): partial rotary, LayerNorm, parallel attention + MLP
(``use_parallel_residual``; the sequential variant too), untied ``embed_out``."""

from __future__ import annotations

from typing import Any

import transformers
from transformer_lens.pretrained.weight_conversions.neox import convert_neox_weights

from mi_core.models.families._base import (
    TINY,
    Family,
    act_fn,
    refuse_rope_scaling,
    rope_parameters,
    rope_theta,
)


def config(hf: Any) -> dict[str, Any]:
    """GPT-NeoX's fields."""
    refuse_rope_scaling(hf, "GPT-NeoX")
    d_head = hf.hidden_size // hf.num_attention_heads
    pct = rope_parameters(hf).get("partial_rotary_factor", getattr(hf, "rotary_pct", 1.0))
    return dict(
        d_model=hf.hidden_size,
        d_head=d_head,
        n_heads=hf.num_attention_heads,
        d_mlp=hf.intermediate_size,
        n_layers=hf.num_hidden_layers,
        n_ctx=hf.max_position_embeddings,
        eps=hf.layer_norm_eps,
        d_vocab=hf.vocab_size,
        act_fn=act_fn(hf.hidden_act),
        parallel_attn_mlp=bool(getattr(hf, "use_parallel_residual", True)),
        positional_embedding_type="rotary",
        rotary_adjacent_pairs=False,
        rotary_dim=round(pct * d_head),
        rotary_base=rope_theta(hf),
        normalization_type="LN",
        default_prepend_bos=False,
    )


def tiny(common: dict[str, Any]) -> transformers.GPTNeoXConfig:
    """A three-layer Pythia-shaped model (parallel blocks, a quarter of each head rotated)."""
    return transformers.GPTNeoXConfig(
        **TINY, max_position_embeddings=128, hidden_act="gelu",
        rope_parameters={"rope_theta": 10000.0, "partial_rotary_factor": 0.5,
                         "rope_type": "default"},
        **common,
    )  # fmt: skip


FAMILY = Family(
    name="gpt-neox",
    model_types=("gpt_neox",),
    causal_lm="GPTNeoXForCausalLM",
    classifier="GPTNeoXForSequenceClassification",
    bodies=("GPTNeoXModel", "GPTNeoXForCausalLM"),
    body="gpt_neox",
    lm_head="embed_out",
    config=config,
    convert=convert_neox_weights,
    tiny=tiny,
    graph="parallel",
)
