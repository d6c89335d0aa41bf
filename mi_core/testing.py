"""Tiny randomly initialised Hugging Face checkpoints, for tests and for trying mi_core offline.

Each is a real checkpoint directory (config.json, model.safetensors, tokenizer files) that both
``transformers`` and :func:`mi_core.load_model` open. The tokenizer is MiniLM's WordPiece
tokenizer for every family: the reference model does not care which tokenizer made its ids.
A kind is a family name (:data:`mi_core.models.families.FAMILIES`) and what to make of it:
``<family>-lm`` a causal LM, ``<family>-cls`` a sequence classifier.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
import transformers

from mi_core.models.embedded import minilm_path
from mi_core.models.families import FAMILIES, Family, family
from mi_core.models.loading import quiet_transformers

#: Every kind :func:`make_tiny_checkpoint` makes: ``<family>-lm`` for each family with a causal
#: LM, ``<family>-cls`` for each with a sequence classifier.
TINY_KINDS = tuple(
    [f"{f.name}-lm" for f in FAMILIES if f.causal_lm]
    + [f"{f.name}-cls" for f in FAMILIES if f.classifier]
)


def _kind(kind: str) -> tuple[Family, str]:
    if kind not in TINY_KINDS:
        raise ValueError(f"unknown tiny kind {kind!r}; expected one of {TINY_KINDS}")
    name, what = kind.rsplit("-", 1)
    fam = family(name)
    architecture = fam.causal_lm if what == "lm" else fam.classifier
    assert architecture is not None
    return fam, architecture


def make_tiny_checkpoint(
    kind: str, path: str | os.PathLike[str], num_labels: int = 3, seed: int = 0
) -> Path:
    """Write a tiny random checkpoint of ``kind`` (one of ``TINY_KINDS``) to ``path``."""
    fam, architecture = _kind(kind)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(minilm_path()))
    config = fam.tiny(
        dict(vocab_size=len(tokenizer), num_labels=num_labels, pad_token_id=tokenizer.pad_token_id)
    )
    torch.manual_seed(seed)
    model = getattr(transformers, architecture)(config).eval()
    with torch.no_grad():  # larger random weights make differences visible in the logits
        for name, param in model.named_parameters():
            if param.dim() > 1 and "embed" not in name and "wte" not in name:
                param.normal_(0.0, 0.2)
    path = Path(path)
    with quiet_transformers():  # no bar on stderr for a tiny write
        model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
