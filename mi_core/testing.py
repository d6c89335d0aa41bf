"""Tiny randomly initialised Hugging Face checkpoints, for tests and for trying mi_core offline.

Each is a real checkpoint directory (config.json, model.safetensors, tokenizer files) that both
``transformers`` and :func:`mi_core.load_model` open. The tokenizer is MiniLM's WordPiece
tokenizer for every family: the reference model does not care which tokenizer made its ids.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
import transformers

from mi_core.models.embedded import minilm_path

TINY_KINDS = ("bert-cls", "roberta-cls", "gpt2-cls", "gpt2-lm", "opt-lm", "llama-lm")


def _config(kind: str, vocab: int, num_labels: int, pad_id: int) -> transformers.PretrainedConfig:
    common = dict(vocab_size=vocab, num_labels=num_labels, pad_token_id=pad_id)
    if kind in ("bert-cls", "roberta-cls"):
        cls = transformers.BertConfig if kind == "bert-cls" else transformers.RobertaConfig
        return cls(
            hidden_size=32,
            num_hidden_layers=3,
            num_attention_heads=4,
            intermediate_size=64,
            max_position_embeddings=130,
            type_vocab_size=2 if kind == "bert-cls" else 1,
            hidden_act="gelu",
            **common,
        )
    if kind in ("gpt2-cls", "gpt2-lm"):
        return transformers.GPT2Config(
            n_embd=32,
            n_layer=3,
            n_head=4,
            n_positions=128,
            activation_function="gelu_new",
            bos_token_id=pad_id,
            eos_token_id=pad_id,
            **common,
        )
    if kind == "opt-lm":
        return transformers.OPTConfig(
            hidden_size=32,
            num_hidden_layers=3,
            num_attention_heads=4,
            ffn_dim=64,
            max_position_embeddings=128,
            word_embed_proj_dim=32,
            **common,
        )
    if kind == "llama-lm":
        return transformers.LlamaConfig(
            hidden_size=32,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=64,
            max_position_embeddings=128,
            rms_norm_eps=1e-6,
            tie_word_embeddings=False,
            **common,
        )
    raise ValueError(f"unknown tiny kind {kind!r}; expected one of {TINY_KINDS}")


_MODEL_CLASSES = {
    "bert-cls": transformers.BertForSequenceClassification,
    "roberta-cls": transformers.RobertaForSequenceClassification,
    "gpt2-cls": transformers.GPT2ForSequenceClassification,
    "gpt2-lm": transformers.GPT2LMHeadModel,
    "opt-lm": transformers.OPTForCausalLM,
    "llama-lm": transformers.LlamaForCausalLM,
}


def make_tiny_checkpoint(
    kind: str, path: str | os.PathLike[str], num_labels: int = 3, seed: int = 0
) -> Path:
    """Write a tiny random checkpoint of ``kind`` (one of ``TINY_KINDS``) to ``path``."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(minilm_path()))
    config = _config(kind, len(tokenizer), num_labels, tokenizer.pad_token_id)
    torch.manual_seed(seed)
    model = _MODEL_CLASSES[kind](config).eval()
    with torch.no_grad():  # larger random weights make differences visible in the logits
        for name, param in model.named_parameters():
            if param.dim() > 1 and "embed" not in name and "wte" not in name:
                param.normal_(0.0, 0.2)
    path = Path(path)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
