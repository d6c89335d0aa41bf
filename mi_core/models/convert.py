"""Hugging Face weights -> TransformerLens state dicts, for the supported families."""

from __future__ import annotations

from types import SimpleNamespace

import einops
import torch
from transformer_lens import HookedTransformerConfig
from transformer_lens.pretrained.weight_conversions import (
    convert_gpt2_weights,
    convert_llama_weights,
    convert_opt_weights,
)

from mi_core.errors import ModelLoadError


def encoder_state_dict(body, cfg: HookedTransformerConfig) -> dict[str, torch.Tensor]:
    """Convert a ``BertModel`` / ``RobertaModel`` body (embeddings + encoder) to TL names."""
    emb = body.embeddings
    pos = emb.position_embeddings.weight
    if body.config.model_type == "roberta":
        pos = pos[body.config.pad_token_id + 1 :]
    token_types = emb.token_type_embeddings.weight
    if token_types.shape[0] < 2:  # RoBERTa has a single token type; TL's table has two rows
        token_types = torch.cat([token_types, torch.zeros_like(token_types)])
    sd = {
        "embed.embed.W_E": emb.word_embeddings.weight,
        "embed.pos_embed.W_pos": pos[: cfg.n_ctx],
        "embed.token_type_embed.W_token_type": token_types[:2],
        "embed.ln.w": emb.LayerNorm.weight,
        "embed.ln.b": emb.LayerNorm.bias,
    }
    split = "(i h) m -> i m h"
    for l, layer in enumerate(body.encoder.layer):
        att = layer.attention.self
        for name, lin in (("Q", att.query), ("K", att.key), ("V", att.value)):
            sd[f"blocks.{l}.attn.W_{name}"] = einops.rearrange(lin.weight, split, i=cfg.n_heads)
            sd[f"blocks.{l}.attn.b_{name}"] = einops.rearrange(
                lin.bias, "(i h) -> i h", i=cfg.n_heads
            )
        out = layer.attention.output
        sd[f"blocks.{l}.attn.W_O"] = einops.rearrange(
            out.dense.weight, "m (i h) -> i h m", i=cfg.n_heads
        )
        sd[f"blocks.{l}.attn.b_O"] = out.dense.bias
        sd[f"blocks.{l}.ln1.w"] = out.LayerNorm.weight
        sd[f"blocks.{l}.ln1.b"] = out.LayerNorm.bias
        sd[f"blocks.{l}.mlp.W_in"] = layer.intermediate.dense.weight.T
        sd[f"blocks.{l}.mlp.b_in"] = layer.intermediate.dense.bias
        sd[f"blocks.{l}.mlp.W_out"] = layer.output.dense.weight.T
        sd[f"blocks.{l}.mlp.b_out"] = layer.output.dense.bias
        sd[f"blocks.{l}.ln2.w"] = layer.output.LayerNorm.weight
        sd[f"blocks.{l}.ln2.b"] = layer.output.LayerNorm.bias
    return sd


def encoder_head_state_dict(hf_model) -> dict[str, torch.Tensor]:
    """The classification head of ``Bert/RobertaForSequenceClassification`` as ``head.*``."""
    if hf_model.config.model_type == "roberta":
        dense, out = hf_model.classifier.dense, hf_model.classifier.out_proj
    else:
        if hf_model.bert.pooler is None:
            raise ModelLoadError("this BERT checkpoint has no pooler; a BERT classifier needs one")
        dense, out = hf_model.bert.pooler.dense, hf_model.classifier
    return {
        "head.dense.weight": dense.weight,
        "head.dense.bias": dense.bias,
        "head.out.weight": out.weight,
        "head.out.bias": out.bias,
    }


def gpt2_classifier_state_dict(hf_model, cfg: HookedTransformerConfig) -> dict[str, torch.Tensor]:
    """Convert ``GPT2ForSequenceClassification`` (body + ``score``) to TL names."""
    shim = SimpleNamespace(
        transformer=hf_model.transformer,
        lm_head=SimpleNamespace(weight=hf_model.transformer.wte.weight),
    )
    sd = {k: v for k, v in convert_gpt2_weights(shim, cfg).items() if not k.startswith("unembed")}
    sd["head.score.weight"] = hf_model.score.weight
    return sd


_CAUSAL_CONVERTERS = {
    "gpt2": convert_gpt2_weights,
    "opt": convert_opt_weights,
    "llama": convert_llama_weights,
}


def causal_lm_state_dict(hf_model, cfg: HookedTransformerConfig) -> dict[str, torch.Tensor]:
    """Convert a GPT-2 / OPT / Llama causal LM with TL's own weight converters."""
    return _CAUSAL_CONVERTERS[hf_model.config.model_type](hf_model, cfg)
