"""BERT (and MiniLM): post-LayerNorm encoder, learnt positions and token types; classifiers
score the pooler's output."""

from __future__ import annotations

from typing import Any

import einops
import torch
import transformers

from mi_core.errors import ModelLoadError
from mi_core.models.families._base import TINY, Family, act_fn


def config(hf: Any) -> dict[str, Any]:
    """A BERT or RoBERTa encoder's fields (post-LN, bidirectional, learnt positions)."""
    n_ctx = hf.max_position_embeddings
    if hf.model_type == "roberta":
        # RoBERTa numbers positions from padding_idx + 1; the unused rows are dropped on conversion.
        n_ctx -= hf.pad_token_id + 1
    return dict(
        d_model=hf.hidden_size,
        d_head=hf.hidden_size // hf.num_attention_heads,
        n_heads=hf.num_attention_heads,
        d_mlp=hf.intermediate_size,
        n_layers=hf.num_hidden_layers,
        n_ctx=n_ctx,
        eps=hf.layer_norm_eps,
        d_vocab=hf.vocab_size,
        act_fn=act_fn(hf.hidden_act),
        attention_dir="bidirectional",
        normalization_type="LN",
    )


def body_state_dict(body: Any, n_heads: int, n_ctx: int) -> dict[str, torch.Tensor]:
    """A ``BertModel`` / ``RobertaModel`` body (embeddings + encoder) in TL's names."""
    emb = body.embeddings
    pos = emb.position_embeddings.weight
    if body.config.model_type == "roberta":
        pos = pos[body.config.pad_token_id + 1 :]
    token_types = emb.token_type_embeddings.weight
    if token_types.shape[0] < 2:  # RoBERTa has a single token type; TL's table has two rows
        token_types = torch.cat([token_types, torch.zeros_like(token_types)])
    sd = {
        "embed.embed.W_E": emb.word_embeddings.weight,
        "embed.pos_embed.W_pos": pos[:n_ctx],
        "embed.token_type_embed.W_token_type": token_types[:2],
        "embed.ln.w": emb.LayerNorm.weight,
        "embed.ln.b": emb.LayerNorm.bias,
    }
    split = "(i h) m -> i m h"
    for l, layer in enumerate(body.encoder.layer):
        att = layer.attention.self
        for name, lin in (("Q", att.query), ("K", att.key), ("V", att.value)):
            sd[f"blocks.{l}.attn.W_{name}"] = einops.rearrange(lin.weight, split, i=n_heads)
            sd[f"blocks.{l}.attn.b_{name}"] = einops.rearrange(lin.bias, "(i h) -> i h", i=n_heads)
        out = layer.attention.output
        sd[f"blocks.{l}.attn.W_O"] = einops.rearrange(
            out.dense.weight, "m (i h) -> i h m", i=n_heads
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


def head_state_dict(hf_model: Any) -> dict[str, torch.Tensor]:
    """The head of ``Bert/RobertaForSequenceClassification`` as ``head.*`` (BERT's pooler
    dense + classifier; RoBERTa's classifier dense + out_proj)."""
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


def tiny(common: dict[str, Any]) -> transformers.BertConfig:
    """A three-layer BERT with two token types."""
    return transformers.BertConfig(
        **TINY, max_position_embeddings=130, type_vocab_size=2, hidden_act="gelu", **common
    )


FAMILY = Family(
    name="bert",
    model_types=("bert",),
    causal_lm=None,
    classifier="BertForSequenceClassification",
    bodies=("BertModel", "BertForMaskedLM", "BertForPreTraining"),
    body="bert",
    config=config,
    convert=None,
    tiny=tiny,
    graph="encoder",
    encoder=True,
    exact="logits and node interventions exact; edge graph post-LN (frozen LayerNorm scales)",
    extra={"tl_architecture": "BertForMaskedLM"},
)
