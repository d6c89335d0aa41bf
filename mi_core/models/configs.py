"""TransformerLens configs built from a checkpoint's own Hugging Face config.

TL's ``from_pretrained`` only knows official hub names; these builders read the ``config.json``
of any local or hub checkpoint of a supported family instead.
"""

from __future__ import annotations

import torch
from transformer_lens import HookedTransformerConfig

from mi_core.errors import ModelLoadError

_ACT_FNS = {"gelu": "gelu", "gelu_new": "gelu_new", "relu": "relu", "silu": "silu"}


def _act_fn(name: str) -> str:
    if name not in _ACT_FNS:
        raise ModelLoadError(
            f"activation {name!r} is not supported; expected one of {sorted(_ACT_FNS)}"
        )
    return _ACT_FNS[name]


def encoder_config(hf_config, device: str = "cpu", dtype=torch.float32) -> HookedTransformerConfig:
    """Config of a BERT or RoBERTa encoder (post-LN, bidirectional, learnt positions)."""
    n_ctx = hf_config.max_position_embeddings
    if hf_config.model_type == "roberta":
        # RoBERTa numbers positions from padding_idx + 1; the unused rows are dropped on conversion.
        n_ctx -= hf_config.pad_token_id + 1
    return HookedTransformerConfig(
        d_model=hf_config.hidden_size,
        d_head=hf_config.hidden_size // hf_config.num_attention_heads,
        n_heads=hf_config.num_attention_heads,
        d_mlp=hf_config.intermediate_size,
        n_layers=hf_config.num_hidden_layers,
        n_ctx=n_ctx,
        eps=hf_config.layer_norm_eps,
        d_vocab=hf_config.vocab_size,
        act_fn=_act_fn(hf_config.hidden_act),
        attention_dir="bidirectional",
        normalization_type="LN",
        original_architecture="BertForMaskedLM",
        model_name=getattr(hf_config, "_name_or_path", "") or hf_config.model_type,
        device=device,
        dtype=dtype,
        init_weights=False,
    )


def decoder_config(
    hf_config, device: str = "cpu", dtype=torch.float32, fold_ln: bool = False
) -> HookedTransformerConfig:
    """Config of a GPT-2, OPT or Llama decoder; ``fold_ln`` selects TL's pre-folded norms."""
    kind = hf_config.model_type
    if kind == "gpt2":
        cfg = dict(
            d_model=hf_config.n_embd,
            d_head=hf_config.n_embd // hf_config.n_head,
            n_heads=hf_config.n_head,
            d_mlp=hf_config.n_inner or 4 * hf_config.n_embd,
            n_layers=hf_config.n_layer,
            n_ctx=hf_config.n_positions,
            eps=hf_config.layer_norm_epsilon,
            d_vocab=hf_config.vocab_size,
            act_fn=_act_fn(hf_config.activation_function),
            use_attn_scale=getattr(hf_config, "scale_attn_weights", True),
            scale_attn_by_inverse_layer_idx=hf_config.scale_attn_by_inverse_layer_idx,
            normalization_type="LN",
            original_architecture="GPT2LMHeadModel",
        )
    elif kind == "opt":
        if not getattr(hf_config, "do_layer_norm_before", True) or (
            hf_config.word_embed_proj_dim != hf_config.hidden_size
        ):
            raise ModelLoadError(
                "this OPT variant (post-LN or projected embeddings, e.g. opt-350m) is not "
                "supported; use another OPT size"
            )
        if not getattr(hf_config, "enable_bias", True) or not getattr(
            hf_config, "layer_norm_elementwise_affine", True
        ):
            raise ModelLoadError(
                "OPT without biases (enable_bias=False) or without LayerNorm weights "
                "(layer_norm_elementwise_affine=False) is not supported: its weights would not "
                "convert; use a standard OPT checkpoint"
            )
        cfg = dict(
            d_model=hf_config.hidden_size,
            d_head=hf_config.hidden_size // hf_config.num_attention_heads,
            n_heads=hf_config.num_attention_heads,
            d_mlp=hf_config.ffn_dim,
            n_layers=hf_config.num_hidden_layers,
            n_ctx=hf_config.max_position_embeddings,
            eps=1e-5,
            d_vocab=hf_config.vocab_size,
            act_fn=_act_fn(hf_config.activation_function),
            normalization_type="LN",
            original_architecture="OPTForCausalLM",
        )
    elif kind == "llama":
        d_head = getattr(hf_config, "head_dim", None) or (
            hf_config.hidden_size // hf_config.num_attention_heads
        )
        rope = getattr(hf_config, "rope_parameters", None) or {}
        rope_theta = rope.get("rope_theta", getattr(hf_config, "rope_theta", 10000.0))
        if rope.get("rope_type", "default") != "default":
            raise ModelLoadError(
                f"Llama rope scaling {rope.get('rope_type')!r} is not supported; "
                "expected the default rotary embedding"
            )
        biased = [k for k in ("attention_bias", "mlp_bias") if getattr(hf_config, k, False)]
        if biased:  # TransformerLens's Llama conversion writes zero biases: wrong logits
            raise ModelLoadError(
                f"Llama checkpoints with {' and '.join(biased)} are not supported (the "
                "conversion to TransformerLens would drop those biases and change the logits)"
            )
        n_kv = hf_config.num_key_value_heads
        cfg = dict(
            d_model=hf_config.hidden_size,
            d_head=d_head,
            n_heads=hf_config.num_attention_heads,
            d_mlp=hf_config.intermediate_size,
            n_layers=hf_config.num_hidden_layers,
            n_ctx=min(hf_config.max_position_embeddings, 8192),
            eps=hf_config.rms_norm_eps,
            d_vocab=hf_config.vocab_size,
            act_fn=_act_fn(hf_config.hidden_act),
            n_key_value_heads=n_kv if n_kv != hf_config.num_attention_heads else None,
            normalization_type="RMS",
            positional_embedding_type="rotary",
            rotary_adjacent_pairs=False,
            rotary_dim=d_head,
            rotary_base=rope_theta,
            final_rms=True,
            gated_mlp=True,
            original_architecture="LlamaForCausalLM",
        )
    else:
        raise ModelLoadError(
            f"decoder family {kind!r} is not supported; expected gpt2, opt or llama"
        )
    if fold_ln:
        cfg["normalization_type"] = cfg["normalization_type"] + "Pre"
    name = getattr(hf_config, "_name_or_path", "") or kind
    return HookedTransformerConfig(
        **cfg, model_name=str(name), device=device, dtype=dtype, init_weights=False
    )
