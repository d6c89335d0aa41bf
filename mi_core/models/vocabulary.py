"""Token ids a model can embed: no id outside the model's vocabulary reaches its embedding.

A tokenizer may know more tokens than its model embeds: transformers gives some families'
tokenizers special tokens of their own (a Qwen2 checkpoint's tokenizer gains an
``<|endoftext|>`` that a model with a borrowed vocabulary has no row for), and added tokens
can outgrow the embedding. An id past the last row reaches ``W_E[tokens]`` as an
``IndexError`` deep in TransformerLens. :func:`guard_vocabulary`, applied to every model
:func:`~mi_core.models.load_model` returns,

- drops from the tokenizer each special token (BOS, EOS, separator, padding, ...) that the
  model cannot embed, with a warning, so that data pipelines that add one when the tokenizer
  has it run without it (a model without a BOS token runs without one: TransformerLens's
  ``to_tokens`` prepends none either), and
- checks every batch of ids the embedding is given, raising
  :class:`~mi_core.errors.ModelInputError` with one line where an id lies outside.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from transformer_lens.components.embed import Embed

from mi_core.errors import ModelInputError

__all__ = ["check_token_ids", "guard_vocabulary"]

log = logging.getLogger(__name__)

#: Marks an embedding that already checks its ids (a model guarded twice checks once).
_CHECKED = "_mi_core_ids_checked"
_SPECIAL = ("bos", "eos", "sep", "cls", "pad", "unk", "mask")


def check_token_ids(tokens: torch.Tensor, d_vocab: int) -> None:
    """Raise :class:`ModelInputError` when an id of ``tokens`` is not in ``[0, d_vocab)``."""
    if not tokens.numel() or tokens.is_floating_point():
        return
    low, high = int(tokens.min()), int(tokens.max())
    if low < 0 or high >= d_vocab:
        bad = high if high >= d_vocab else low
        raise ModelInputError(
            f"token id {bad} is outside the model's vocabulary of {d_vocab} tokens: the ids "
            "come from another tokenizer than the model's, or a token added to it"
        )


class _EmbeddingCheck:
    """The embedding's forward pre-hook: its ids checked against the vocabulary (a class, so
    that a model with it pickles and deep-copies)."""

    def __init__(self, d_vocab: int) -> None:
        self.d_vocab = d_vocab

    def __call__(self, module: torch.nn.Module, args: tuple[Any, ...]) -> None:
        if args and isinstance(args[0], torch.Tensor):
            check_token_ids(args[0], self.d_vocab)


def guard_vocabulary(model: Any) -> None:
    """Drop the special tokens ``model``'s tokenizer has outside its vocabulary, and check the
    ids its token embeddings are given (see the module docstring)."""
    d_vocab = int(model.cfg.d_vocab)
    tokenizer = getattr(model, "tokenizer", None)
    if tokenizer is not None:
        for kind in _SPECIAL:
            token_id = getattr(tokenizer, f"{kind}_token_id", None)
            if isinstance(token_id, int) and not 0 <= token_id < d_vocab:
                log.warning(
                    "the tokenizer's %s token %r (id %d) is outside the model's vocabulary of "
                    "%d tokens; it is not used",
                    kind, getattr(tokenizer, f"{kind}_token", None), token_id, d_vocab,
                )  # fmt: skip
                setattr(tokenizer, f"{kind}_token", None)
        if hasattr(model.cfg, "tokenizer_prepends_bos"):  # what TL's to_tokens relies on
            model.cfg.tokenizer_prepends_bos = len(tokenizer.encode("")) > 0
            no_bos = getattr(tokenizer, "bos_token", None) is None
            if no_bos and not model.cfg.tokenizer_prepends_bos:  # no BOS: run without one
                model.cfg.default_prepend_bos = False
    for module in model.modules():
        if isinstance(module, Embed) and not module.__dict__.get(_CHECKED):
            module.register_forward_pre_hook(_EmbeddingCheck(d_vocab))
            module.__dict__[_CHECKED] = True
